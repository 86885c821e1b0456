"""ControllerStore.group(): the HTTP edge stores the reports of one event-loop turn in one transaction. Each
write still stands alone (a refused or failing write leaves the others intact), nothing is visible to another
connection before the group commits, and a group that fails to commit stores nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from reconciler.adapters.store import ControllerStore, UnknownInstance
from tests.controller_support import StepClock


def event(i: int) -> dict[str, object]:
    return {"protocol": 1, "phase": "params", "status": "progress", "at": f"2026-12-02T18:00:{i:02d}Z",
            "details": {"i": i}}


def test_writes_of_a_group_commit_together_and_stand_alone(tmp_path: Path) -> None:
    store = ControllerStore(tmp_path / "c.db", now=StepClock())
    store.register("p-0-a", {"protocol": 1, "instance_id": "p-0-a", "at": "2026-12-02T18:00:00Z"})
    other = sqlite3.connect(tmp_path / "c.db")
    with store.group():
        assert store.add_event("p-0-a", event(1)) == "stored"
        with pytest.raises(UnknownInstance):
            store.add_event("p-0-zzz", event(2))  # refused alone
        assert store.add_logs("p-0-a", ["one line"]) == 0
        assert store.add_event("p-0-a", event(1)) == "duplicate"  # sees the group's own write
        assert other.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0  # not committed yet
    assert other.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1
    assert store.tail("p-0-a", 5) == ["one line"]
    other.close()
    store.close()


def test_a_group_that_fails_stores_nothing(tmp_path: Path) -> None:
    store = ControllerStore(tmp_path / "c.db", now=StepClock())
    store.register("p-0-a", {"protocol": 1, "instance_id": "p-0-a", "at": "2026-12-02T18:00:00Z"})
    with pytest.raises(RuntimeError), store.group():
        store.add_event("p-0-a", event(1))
        raise RuntimeError("the edge died before answering")
    assert store.stats()["events"] == 0
    assert store.add_event("p-0-a", event(1)) == "stored"  # and the store works on
    store.close()
