"""Benchmarks of the reconciler's hot paths (`make bench` = `python -m bench`; not part of `make test`).

Each module measures one thing with synthetic but realistic data and returns `Figure`s; `__main__` runs
them, prints a table and writes `bench/results.md`.
"""
