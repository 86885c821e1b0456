"""Pure data and decisions: spec and records as dataclasses, verdicts, signatures, breaker, planner,
ranking, slot model, judging, status rows. No I/O: nothing here imports yaml, jsonschema, git, httpx,
pulumi, sqlite3, subprocess or http (enforced by .importlinter)."""
