"""Old module path of the Pulumi dynamic provider, kept for stacks created before the layout move.

Pulumi pickles a dynamic provider by module path into each resource's state (`__provider`), and the
provider process imports that path on the next operation. Stacks created before the layered layout
name `reconciler.provider.SlotResourceProvider`; this re-export keeps them working until their next
`pulumi up` re-serialises the provider from `reconciler.adapters.pulumi_provider`.
"""

from reconciler.adapters.pulumi_provider import SlotResourceProvider

__all__ = ["SlotResourceProvider"]
