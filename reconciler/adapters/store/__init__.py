"""Controller store: what workers reported, safe across crashes and restarts.

Written by the controller HTTP API (`reconciler/adapters/controller/api.py`) after it has authenticated and
validated a request; read by the reconcile loop and `fleet status` as `InstanceReport`s. The package in its parts:
- `port`: the port (`ControllerStore`), its data classes and errors: what the rest of the code imports;
- `schema`: the tables, one source for both dialects, and the schema version;
- `sql`: the SQL both adapters run and the transaction discipline (group commit), `SqlStore`;
- `sqlite`: `SqliteStore`, the embedded default (one process, one file);
- `postgres`: `PostgresStore`, production (several controller replicas on one server); psycopg is imported only
  there, so the embedded default never loads it;
- `copy_to_postgres`: `fleet db copy`, an embedded store moved into PostgreSQL.
`reconciler.adapters.stores.open_store` picks an adapter from a path or a `postgresql://` URI.

Every write is one transaction: a request the controller answered 2xx is in the database, a rejected one
left nothing behind. Log lines live in a bounded ring per instance (last `ring_lines`, older ones counted
as dropped), and every free-text field is redacted (`reconciler.domain.redact`) before it is written, so nothing
secret is ever stored, served or committed as evidence.

Clocks: `registered_at` in a report is the controller's clock at first registration (the loop compares
it with its own `now` for deadlines; a worker's clock may be wrong); the worker's own `at` of every
registration, event and result is kept as sent.

Replay and retry semantics (v1 has no nonces): registration is idempotent; an event identical to one
already stored is a no-op (a worker retrying after a lost response must not duplicate it), also inside
an event batch, which is stored all or nothing (`add_events`); the result is
accepted once, an identical resend is a no-op and a different one is a conflict; log batches are appended
as sent (at-least-once: a retried batch can appear twice, which is harmless in a log tail). Once an
instance is marked destroyed its token no longer writes anything, so a captured token cannot be replayed
into a finished record, while its logs stay readable.

Several writers (PostgreSQL replicas, or threads of one process): every write that reads an instance's
state first locks its row (`SELECT ... FOR UPDATE` on PostgreSQL; SQLite has one writer at a time anyway), so
counters, the ring's sequence numbers and the once-only result are decided on current rows; a batch takes
its row locks in instance order, so two replicas' batches never deadlock. The database being unreachable
is `StoreUnavailable` (temporary: the API answers 503 with Retry-After, a pass observes nothing).
"""
