"""Store schema v3 keys events by (instance, time, fingerprint) (issue 14: a batch's new keys are neighbours in
the index). A v2 store is rebuilt in place on open: every event kept with its id and order, and an event
stored before the upgrade is still a duplicate when a worker replays it after."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from reconciler.adapters.store.schema import SCHEMA_VERSION
from reconciler.adapters.store.sqlite import SqliteStore
from tests.controller_support import register_doc
from tests.store_support import back_to_version_3

V2_EVENTS = """
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
)"""


def event(k: int, status: str = "progress") -> dict[str, object]:
    return {"protocol": 1, "phase": "params", "status": status, "at": f"2026-12-02T18:00:{k:02d}Z",
            "message": f"{k} of 56 GiB"}


def make_v2_store(path: Path) -> None:
    """A store as v2 code left it: the same rows, the events table with its v2 constraint."""
    store = SqliteStore(path)
    store.register("p-0-a", register_doc("p-0-a"))
    assert store.add_events("p-0-a", [event(k) for k in range(5)]) == ["stored"] * 5
    assert store.add_event("p-0-a", event(9, "failed")) == "stored"
    store.close()
    back_to_version_3(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("ALTER TABLE events RENAME TO events_copy")
    conn.execute("DROP INDEX events_by_status")
    conn.execute(V2_EVENTS)
    conn.execute("INSERT INTO events SELECT * FROM events_copy")
    conn.execute("DROP TABLE events_copy")
    conn.execute("CREATE INDEX events_by_status ON events (instance_id, status, id)")
    conn.execute("PRAGMA user_version=2")
    conn.execute("COMMIT")
    conn.close()


def test_a_v2_store_is_rekeyed_in_place_and_replays_stay_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    make_v2_store(path)
    before = sqlite3.connect(path).execute("SELECT * FROM events ORDER BY id").fetchall()
    store = SqliteStore(path)
    try:
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT * FROM events ORDER BY id").fetchall() == before
        table_sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
        assert "UNIQUE (instance_id, at, fingerprint)" in table_sql
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "events_by_status" in indexes
        conn.close()
        # Replays of what was stored before the upgrade: duplicates, alone and inside a batch.
        assert store.add_event("p-0-a", event(3)) == "duplicate"
        assert store.add_events("p-0-a", [event(4), event(5), event(9, "failed")]) == [
            "duplicate", "stored", "duplicate"]
        report = store.report("p-0-a")
        assert report is not None and [e.message for e in report.events] == [
            *(f"{k} of 56 GiB" for k in range(5)), "9 of 56 GiB", "5 of 56 GiB"]
        assert store.integrity_check() == ["ok"]
    finally:
        store.close()


def test_same_fingerprint_at_two_times_cannot_exist_but_same_time_two_events_can(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.db")
    try:
        store.register("p-0-b", register_doc("p-0-b"))
        same_time = [event(1), {**event(1), "message": "other"}]  # one second, two distinct events
        assert store.add_events("p-0-b", same_time) == ["stored", "stored"]
        assert store.add_events("p-0-b", same_time) == ["duplicate", "duplicate"]
        assert store.add_event("p-0-b", {**event(1), "at": "2026-12-02T19:00:01+01:00"}) == "stored"  # same instant,
        # other text: as in v2, the fingerprint covers the text as sent
        assert store.stats()["events"] == 3
    finally:
        store.close()
