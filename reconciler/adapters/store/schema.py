"""The store's tables and the schema version this code writes (SQLite's upgrade steps)."""

from __future__ import annotations

#: The schema this code writes. SQLite keeps it in `PRAGMA user_version`, PostgreSQL in the `fleet_schema`
#: table; a store of a newer version is refused (never written by code that does not know its layout).
SCHEMA_VERSION = 3

_SCHEMA_V1 = """
CREATE TABLE instances (
    instance_id     TEXT PRIMARY KEY,
    received_at     TEXT NOT NULL,
    worker_at       TEXT NOT NULL,
    pool            TEXT,
    slot            TEXT,
    machine_id      TEXT,
    host_id         TEXT,
    contract_id     TEXT,
    gpu_name        TEXT,
    image_digest    TEXT,
    image_version   TEXT,
    hostname        TEXT,
    gpus            TEXT NOT NULL DEFAULT '[]',
    registrations   INTEGER NOT NULL DEFAULT 1,
    next_line_seq   INTEGER NOT NULL DEFAULT 0,
    ring_dropped    INTEGER NOT NULL DEFAULT 0,
    worker_dropped  INTEGER NOT NULL DEFAULT 0,
    progress_events INTEGER NOT NULL DEFAULT 0,
    other_events    INTEGER NOT NULL DEFAULT 0,
    destroyed_at    TEXT
);
CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    instance_id TEXT NOT NULL REFERENCES instances(instance_id),
    phase       TEXT NOT NULL,
    status      TEXT NOT NULL,
    at          TEXT NOT NULL,
    received_at TEXT NOT NULL,
    exit_code   INTEGER,
    message     TEXT,
    log_tail    TEXT NOT NULL,
    details     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    UNIQUE (instance_id, fingerprint)
);
CREATE INDEX events_by_status ON events (instance_id, status, id);
CREATE TABLE results (
    instance_id TEXT PRIMARY KEY REFERENCES instances(instance_id),
    received_at TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE TABLE log_lines (
    instance_id TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    line        TEXT NOT NULL,
    PRIMARY KEY (instance_id, seq)
) WITHOUT ROWID;
"""

#: Version 2: what the reconciler decided per instance, for workers to read (GET .../directive).
_SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS directives (
    instance_id TEXT PRIMARY KEY,
    set_at      TEXT NOT NULL,
    body        TEXT NOT NULL
);
"""

#: Version 3: an event's identity is keyed (instance, time, fingerprint) instead of (instance, fingerprint).
#: The same events are distinct (the time is part of what the fingerprint covers, so it adds no new
#: distinction), but a worker's events arrive in time order, so new keys land next to each other in the
#: index: a batch of 20 events dirties one or two index pages instead of up to 20 random ones, and every
#: COMMIT writes those pages to the WAL. The table is rebuilt (SQLite cannot change a table constraint).
_SCHEMA_V3 = """
CREATE TABLE events_v3 (
    id          INTEGER PRIMARY KEY,
    instance_id TEXT NOT NULL REFERENCES instances(instance_id),
    phase       TEXT NOT NULL,
    status      TEXT NOT NULL,
    at          TEXT NOT NULL,
    received_at TEXT NOT NULL,
    exit_code   INTEGER,
    message     TEXT,
    log_tail    TEXT NOT NULL,
    details     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    UNIQUE (instance_id, at, fingerprint)
);
INSERT INTO events_v3 (id, instance_id, phase, status, at, received_at, exit_code, message, log_tail, details,
                       fingerprint)
    SELECT id, instance_id, phase, status, at, received_at, exit_code, message, log_tail, details, fingerprint
    FROM events ORDER BY id;
DROP TABLE events;
ALTER TABLE events_v3 RENAME TO events;
CREATE INDEX events_by_status ON events (instance_id, status, id);
"""

#: SQLite's upgrade steps: step i brings a store of version i to version i + 1.
SQLITE_STEPS: tuple[str, ...] = (_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3)
