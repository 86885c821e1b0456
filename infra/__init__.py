"""The Pulumi program (run by `pulumi up` from Pulumi.yaml's `main: infra/`) and its components.

`__main__.py` is the entry point; `program.py` maps stack config + spec + records onto components;
`image.py` (WorkerImage) and `hosts.py` (GpuPool) are the components. The slot CRUD itself lives in the
installed package (`reconciler.adapters.pulumi_provider`), shared with `fleet apply`.
"""
