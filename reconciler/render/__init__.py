"""Renderers of domain data: text, HTML. No adapters: they format what they are given."""
