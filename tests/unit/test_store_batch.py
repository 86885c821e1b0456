"""Controller store event batches (`add_events`), on both adapters (`store_factory`): one transaction, all or
nothing, the same deduplication, rings and limits as one `add_event` per event, and a refused batch leaves
nothing behind even when it shares a group commit with other writers."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.adapters.store.port import EventLimitExceeded, InstanceDestroyed, UnknownInstance
from reconciler.adapters.store.sql import SqlStore, _PendingWrite
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.observations import PhaseEvent
from tests.controller_support import StepClock
from tests.store_support import StoreFactory

T0 = datetime(2026, 12, 2, 18, 0, 0, tzinfo=UTC)
VAST_KEY = "3f1c9a0e7b2d4c6a8e0f1b3d5c7a9e2f4b6d8c0a1e3f5b7d9c2a4e6f8b0d1c3a"


def event_doc(phase: str, status: str, at: str = "2026-12-02T18:01:00Z", **extra: object) -> dict[str, object]:
    return {"protocol": 1, "phase": phase, "status": status, "at": at, **extra}


def worker_view(events: tuple[PhaseEvent, ...]) -> list[PhaseEvent]:
    """Events as the worker sent them: `at` is the arrival on the controller's clock (one clock), which
    differs between one batch and the same events sent one by one."""
    return [replace(e, at=e.worker_at or e.at) for e in events]


def registered(store: SqlStore) -> SqlStore:
    store.register("p-0-a", {"protocol": 1, "instance_id": "p-0-a", "at": "2026-12-02T17:59:00Z"})
    return store


def open_store(path: Path, **options: int) -> SqlStore:
    return registered(SqliteStore(path, now=StepClock(), **options))


@pytest.fixture
def store(store_factory: StoreFactory) -> SqlStore:
    return registered(store_factory(now=StepClock()))


def progress(i: int) -> dict[str, object]:
    return event_doc("params", "progress", details={"bytes_done": i})


def test_batch_is_stored_in_order_like_single_events(store_factory: StoreFactory) -> None:
    docs = [event_doc("params", "started"), progress(1), progress(2),
            event_doc("params", "failed", exit_code=3, message=f"key {VAST_KEY}", log_tail=["boom"])]
    batched = registered(store_factory("batched", now=StepClock()))
    single = registered(store_factory("single", now=StepClock()))
    assert batched.add_events("p-0-a", docs) == ["stored"] * 4
    for doc in docs:
        single.add_event("p-0-a", doc)
    got, want = batched.report("p-0-a"), single.report("p-0-a")
    assert got is not None and want is not None
    # Same rows, same redaction, same order; only the arrival times differ (one for the whole batch).
    assert worker_view(got.events) == worker_view(want.events)
    assert got.events[-1].message == "key [REDACTED]"
    detail = batched.detail("p-0-a")
    assert detail is not None and len(set(detail[1].event_received_at)) == 1  # one arrival time for the batch
    batched.close()
    single.close()


def test_replayed_batch_and_repeats_inside_a_batch_are_duplicates(store: SqlStore) -> None:
    store.add_event("p-0-a", progress(0))
    docs = [progress(0), progress(1), progress(1), progress(2)]
    assert store.add_events("p-0-a", docs) == ["duplicate", "stored", "duplicate", "stored"]
    assert store.add_events("p-0-a", docs) == ["duplicate"] * 4
    assert store.add_event("p-0-a", progress(2)) == "duplicate"
    assert store.stats()["events"] == 3


def test_batch_keeps_the_progress_ring_and_counters(store_factory: StoreFactory) -> None:
    store = registered(store_factory(now=StepClock(), max_progress_events=3))
    assert store.add_events("p-0-a", [event_doc("params", "started"), *[progress(i) for i in range(5)]]) == [
        "stored"] * 6
    store.add_event("p-0-a", progress(5))  # the counter the batch left behind drives the ring
    report = store.report("p-0-a")
    assert report is not None
    assert [e.details.get("bytes_done") for e in report.events] == [None, 3, 4, 5]
    store.close()


def test_batch_over_the_event_limit_stores_nothing(store_factory: StoreFactory) -> None:
    store = registered(store_factory(now=StepClock(), max_other_events=3))
    store.add_event("p-0-a", event_doc("register", "done"))
    before = store.stats()
    with pytest.raises(EventLimitExceeded, match="limit 3"):
        store.add_events("p-0-a", [progress(1), event_doc("params", "started"), event_doc("params", "done"),
                                   event_doc("daemon", "started")])
    assert store.stats() == before
    # The counters were not advanced either: two more non-progress events still fit.
    assert store.add_events("p-0-a", [event_doc("params", "started"), event_doc("params", "done")]) == [
        "stored", "stored"]
    store.close()


def test_refused_batch_in_a_shared_group_commit_leaves_the_others_alone(store_factory: StoreFactory) -> None:
    store = registered(store_factory(now=StepClock(), max_other_events=1))
    store.register("p-1-b", {"protocol": 1, "instance_id": "p-1-b", "at": "2026-12-02T17:59:00Z"})

    def batch_body(instance_id: str, docs: list[dict[str, object]]) -> _PendingWrite:
        prepared = store.prepare_events(instance_id, docs)
        return _PendingWrite(prepared.body, prepared.instance_id)

    ok_before = batch_body("p-1-b", [progress(1)])
    refused = batch_body("p-0-a", [progress(7), event_doc("params", "started"), event_doc("params", "done")])
    ok_after = batch_body("p-1-b", [progress(2)])
    with store._connection() as conn:
        store._commit_batch(conn, [ok_before, refused, ok_after])
    assert isinstance(refused.error, EventLimitExceeded)
    assert ok_before.result == ["stored"] and ok_after.result == ["stored"]
    a, b = store.report("p-0-a"), store.report("p-1-b")
    assert a is not None and b is not None
    assert a.events == () and [e.details["bytes_done"] for e in b.events] == [1, 2]
    store.close()


def test_batch_for_unknown_or_destroyed_instances_is_refused(store: SqlStore) -> None:
    with pytest.raises(UnknownInstance):
        store.add_events("ghost", [progress(1)])
    store.mark_destroyed("p-0-a", T0)
    with pytest.raises(InstanceDestroyed):
        store.add_events("p-0-a", [progress(1)])
    assert store.stats()["events"] == 0


# Events from a small pool, so batches repeat each other and themselves; two limits small enough to hit.
pool_events = st.sampled_from([progress(i) for i in range(6)] + [
    event_doc(phase, status) for phase in ("params", "daemon") for status in ("started", "done")])


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.lists(pool_events, min_size=1, max_size=6), min_size=1, max_size=5))
def test_a_batch_does_what_one_add_event_per_event_would(chunks: list[list[dict[str, object]]]) -> None:
    """Same statuses and stored events as one add_event per event; refused exactly when one of those
    would have been refused, and then nothing of it is stored."""
    limits = {"max_progress_events": 3, "max_other_events": 3}
    accepted: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        batched = open_store(Path(tmp) / "batched.db", **limits)
        for n, chunk in enumerate(chunks):
            single = open_store(Path(tmp) / f"single-{n}.db", **limits)
            for doc in accepted:
                single.add_event("p-0-a", doc)
            expected: list[str] = []
            try:
                for doc in chunk:
                    expected.append(single.add_event("p-0-a", doc))
            except EventLimitExceeded:
                expected = []
            before = batched.report("p-0-a")
            try:
                got: list[str] = list(batched.add_events("p-0-a", chunk))
            except EventLimitExceeded:
                got = []
                assert batched.report("p-0-a") == before
            assert got == expected
            if got:
                accepted += chunk
                want, have = single.report("p-0-a"), batched.report("p-0-a")
                assert want is not None and have is not None
                assert worker_view(have.events) == worker_view(want.events)
            single.close()
        batched.close()
