"""The controller: worker protocol validation, the transport-independent API, its HTTP server, and the
admin client the provisioning side uses."""
