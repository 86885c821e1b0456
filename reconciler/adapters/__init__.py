"""One module per outside thing: spec and record files, git, the SQLite store, marketplaces, the
controller's HTTP edge, the Pulumi dynamic provider, and the process environment (settings)."""
