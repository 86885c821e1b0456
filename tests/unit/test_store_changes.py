"""The store's change sequence (`ControllerStore.changes_since`), on both adapters: every kind of write moves the
sequence and names its instance when the instance's report changed; a refused write does not; a
reader that follows the sequence and reads only what changed ends with the store's full view. On PostgreSQL, with
several writers (replicas) whose transactions commit in another order than they began, or that hold a taken
sequence before COMMIT, no change is ever missed."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.store.port import SqlConnection, StoreChanges, UnknownInstance
from reconciler.adapters.store.postgres import PostgresStore
from reconciler.adapters.store.sql import SqlStore
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.observations import InstanceReport
from tests.controller_support import StepClock, register_doc
from tests.postgres_server import PostgresServer
from tests.store_support import StoreFactory, back_to_version_3

T0 = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)


def event(k: int, status: str = "progress") -> dict[str, object]:
    return {"protocol": 1, "phase": "params", "status": status, "at": f"2026-12-02T18:{k // 60:02d}:{k % 60:02d}Z",
            "message": f"{k} of 56 GiB"}


RESULT = {"protocol": 1, "outcome": "completed", "at": "2026-12-02T18:30:00Z", "exit_code": 0, "requested": 10,
          "completed": 10, "failed": 0, "proofs_per_hour": 94.7, "log_tail": []}


@pytest.fixture
def store(store_factory: StoreFactory) -> SqlStore:
    return store_factory(now=StepClock())


def changed(store: SqlStore, since: int) -> tuple[int, set[str]]:
    answer = store.changes_since(since)
    assert not answer.complete
    return answer.sequence, set(answer.instance_ids)


def test_every_kind_of_write_names_its_instance_and_moves_the_sequence(store: SqlStore) -> None:
    start = store.changes_since(0)
    assert start == StoreChanges(1, (), complete=True)
    for iid in ("p-0-a", "p-0-b", "p-0-c"):
        store.register(iid, register_doc(iid))
    seq = store.changes_since(0).sequence
    assert seq > 0 and store.changes_since(seq) == StoreChanges(seq, (), complete=False)

    writes = {
        "registration again": lambda: store.register("p-0-a", register_doc("p-0-a")),
        "event": lambda: store.add_event("p-0-b", event(1)),
        "event batch": lambda: store.add_events("p-0-c", [event(2), event(3)]),
        "result": lambda: store.set_result("p-0-a", RESULT),
        "log batch": lambda: store.add_logs("p-0-b", ["line one", "line two"]),
        "directive": lambda: store.set_directives({"p-0-c": {"protocol": 1, "action": "serve"}}, T0),
        "destroyed mark": lambda: store.mark_destroyed("p-0-a", T0),
    }
    expect = {"registration again": "p-0-a", "event": "p-0-b", "event batch": "p-0-c", "result": "p-0-a",
              "log batch": "p-0-b", "directive": "p-0-c", "destroyed mark": "p-0-a"}
    for what, write in writes.items():
        write()
        after, ids = changed(store, seq)
        # A directive moves the sequence and is not a report's change (the pass wrote it: nothing to read back).
        assert after > seq and ids == ({expect[what]} if what != "directive" else set()), what
        seq = after

    # A refused write and the same directives again leave the sequence where it is; a resend that was accepted
    # and changed nothing may name its instance again (read twice, harmless).
    with pytest.raises(UnknownInstance):
        store.add_event("ghost", event(1))
    assert store.set_directives({"p-0-c": {"protocol": 1, "action": "serve"}}, T0) == 0
    assert store.changes_since(seq) == StoreChanges(seq, (), complete=False)
    assert store.add_event("p-0-b", event(1)) == "duplicate"
    assert changed(store, seq)[1] <= {"p-0-b"}


def test_a_sequence_the_store_never_reached_answers_everything(store: SqlStore) -> None:
    """A sequence from another store (before `fleet db copy`, a restored backup): replace, never merge."""
    for iid in ("p-0-b", "p-0-a"):
        store.register(iid, register_doc(iid))
    seq = store.changes_since(0).sequence
    assert store.changes_since(seq + 100) == StoreChanges(seq, ("p-0-b", "p-0-a"), complete=True)
    # One write: only its instance, in registration order with the rest.
    store.add_event("p-0-a", event(1))
    assert store.changes_since(seq).instance_ids == ("p-0-a",)


def test_a_reader_that_follows_the_sequence_keeps_the_full_view(store: SqlStore) -> None:
    """What the incremental pass does: read what changed, keep the rest; at every step its view is the full read."""
    rng = random.Random(7)
    ids = [f"p-{n}-x" for n in range(12)]
    registered: set[str] = set()
    held: dict[str, InstanceReport] = {}
    since = 0
    for step in range(40):
        iid = rng.choice(ids)
        kind = rng.randrange(4) if iid in registered else 0
        if kind == 0:
            store.register(iid, register_doc(iid))
            registered.add(iid)
        elif kind == 1:
            store.add_event(iid, event(step))
        elif kind == 2:
            store.add_logs(iid, [f"line {step}"])
        else:
            store.set_directives({iid: {"protocol": 1, "action": "serve", "step": step}}, T0)
        changes = store.changes_since(since)
        if changes.complete:
            held = {}
        held.update((r.instance_id, r) for r in store.reports_of(changes.instance_ids))
        since = changes.sequence
        assert held == {r.instance_id: r for r in store.reports()}, step


def test_an_upgraded_store_answers_its_old_rows_once_then_only_changes(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = SqliteStore(path, now=StepClock())
    for iid in ("p-0-a", "p-0-b"):
        store.register(iid, register_doc(iid))
    store.close()
    back_to_version_3(path)  # written by code before the change sequence
    store = SqliteStore(path, now=StepClock())
    try:
        everything = store.changes_since(0)
        assert everything == StoreChanges(1, ("p-0-a", "p-0-b"), complete=True)
        store.add_event("p-0-b", event(1))
        assert store.changes_since(everything.sequence).instance_ids == ("p-0-b",)
    finally:
        store.close()


# ---- PostgreSQL: several writers --------------------------------------------------------------------------------


class HeldStore(PostgresStore):
    """A replica whose writes can be held at one point of their transaction (`hold_in`: "body", after the write's
    statements and before the sequence is taken; "commit", after the sequence is taken and before COMMIT) until
    `release` is set."""

    def __init__(self, uri: str, hold_in: str):
        super().__init__(uri, now=StepClock())
        self.hold_in = hold_in
        self.reached, self.release = threading.Event(), threading.Event()

    def _hold(self) -> None:
        self.reached.set()
        assert self.release.wait(30)

    def _sequence_changes(self, conn: SqlConnection, batch: Sequence[Any]) -> None:
        if self.hold_in == "body":
            self._hold()
        super()._sequence_changes(conn, batch)
        if self.hold_in == "commit":
            self._hold()


@pytest.fixture
def two_replicas(postgres_server: PostgresServer) -> tuple[str, PostgresStore]:
    uri = postgres_server.create_database()
    other = PostgresStore(uri, now=StepClock())
    for iid in ("p-0-a", "p-0-b"):
        other.register(iid, register_doc(iid))
    return uri, other


def test_a_write_that_began_first_and_commits_last_is_not_missed(two_replicas: tuple[str, PostgresStore]) -> None:
    """Replica 1's write runs its statements, then waits; replica 2 writes another instance and commits; a reader
    moves past replica 2's change. When replica 1 commits, the reader's next answer has it: its sequence is
    taken at commit, so it is above what the reader already passed."""
    uri, other = two_replicas
    held = HeldStore(uri, hold_in="body")
    try:
        start = other.changes_since(0).sequence
        first = threading.Thread(target=held.add_event, args=("p-0-a", event(1)))
        first.start()
        assert held.reached.wait(30)
        other.add_event("p-0-b", event(2))
        passed = other.changes_since(start)
        assert passed.instance_ids == ("p-0-b",)
        held.release.set()
        first.join(30)
        assert other.changes_since(passed.sequence).instance_ids == ("p-0-a",)
    finally:
        held.release.set()
        held.close()
        other.close()


def test_a_taken_sequence_holds_the_next_commit_until_it_is_committed(two_replicas: tuple[str, PostgresStore]) -> None:
    """Replica 1 has taken sequence N+1 and not committed yet: replica 2's commit waits for it (it would take N+2,
    and a reader that saw N+2 committed would pass N+1 before it was visible), and readers still answer N."""
    uri, other = two_replicas
    held = HeldStore(uri, hold_in="commit")
    try:
        start = other.changes_since(0).sequence
        first = threading.Thread(target=held.add_event, args=("p-0-a", event(1)))
        first.start()
        assert held.reached.wait(30)
        second = threading.Thread(target=other.add_event, args=("p-0-b", event(2)))
        second.start()
        second.join(1.0)
        assert second.is_alive()  # waiting on the sequence row
        assert other.changes_since(start) == StoreChanges(start, (), complete=False)
        held.release.set()
        first.join(30)
        second.join(30)
        assert not second.is_alive()
        final = other.changes_since(start)
        assert final.sequence == start + 2 and final.instance_ids == ("p-0-a", "p-0-b")
    finally:
        held.release.set()
        held.close()
        other.close()


def test_two_replicas_writing_at_once_leave_no_change_unread(postgres_server: PostgresServer) -> None:
    """Four threads on two replicas write events, logs and directives to 20 instances while a reader follows the
    sequence and reads only what changed: when the writers stop, the reader's view is the full read."""
    uri = postgres_server.create_database()
    replicas = [PostgresStore(uri, now=StepClock()), PostgresStore(uri, now=StepClock())]
    ids = [f"p-{n}-x" for n in range(20)]
    for iid in ids:
        replicas[0].register(iid, register_doc(iid))
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        rng, replica = random.Random(n), replicas[n % 2]
        try:
            for k in range(60):
                iid = rng.choice(ids)
                choice = rng.randrange(3)
                if choice == 0:
                    replica.add_event(iid, event(n * 100 + k))
                elif choice == 1:
                    replica.add_logs(iid, [f"writer {n} line {k}"])
                else:
                    replica.set_directives({iid: {"protocol": 1, "action": "serve", "k": k, "n": n}}, T0)
        except BaseException as exc:  # (reported by the test below)
            errors.append(exc)

    reader = PostgresStore(uri)
    held: dict[str, InstanceReport] = {}
    since = 0

    def follow() -> None:
        nonlocal since, held
        changes = reader.changes_since(since)
        if changes.complete:
            held = {}
        held.update((r.instance_id, r) for r in reader.reports_of(changes.instance_ids))
        since = changes.sequence

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    try:
        for thread in writers:
            thread.start()
        while any(thread.is_alive() for thread in writers):
            follow()
        for thread in writers:
            thread.join()
        follow()
        assert not errors
        assert held == {r.instance_id: r for r in reader.reports()}
        assert since == reader.changes_since(since).sequence
    finally:
        for store in (*replicas, reader):
            store.close()
