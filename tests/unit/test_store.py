"""Controller store contract, on both adapters (SQLite and a real PostgreSQL; `store_factory`): reports
round-trip into InstanceReport, idempotent retries, ring bounds, redaction before storage, destroyed instances
stay readable, restarts lose nothing, concurrent writers lose nothing; bad SQLite files are refused."""

import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.adapters.store.port import (
    REPORT_TAIL_LINES,
    EventLimitExceeded,
    InstanceDestroyed,
    ResultConflict,
    SqlConnection,
    StoreError,
    UnknownInstance,
)
from reconciler.adapters.store.sql import SqlStore
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.observations import BenchmarkResult, PhaseEvent
from tests.controller_support import StepClock
from tests.store_support import StoreFactory

T0 = datetime(2026, 12, 2, 18, 0, 0, tzinfo=UTC)
VAST_KEY = "3f1c9a0e7b2d4c6a8e0f1b3d5c7a9e2f4b6d8c0a1e3f5b7d9c2a4e6f8b0d1c3a"


def register_doc(instance_id: str, **extra: object) -> dict[str, object]:
    return {"protocol": 1, "instance_id": instance_id, "at": "2026-12-02T17:59:00Z", "pool": "rtx4090",
            "slot": "rtx4090-0", "machine_id": "4242", "host_id": "77", "contract_id": "9001",
            "gpu_name": "RTX 4090", "image_digest": "sha256:" + "ab" * 32, "hostname": "c.9001",
            "gpus": ["NVIDIA GeForce RTX 4090, 24564 MiB, 550.54"], **extra}


def event_doc(phase: str, status: str, at: str = "2026-12-02T18:01:00Z", **extra: object) -> dict[str, object]:
    return {"protocol": 1, "phase": phase, "status": status, "at": at, **extra}


RESULT = {"protocol": 1, "outcome": "completed", "at": "2026-12-02T18:30:00Z", "started_at": "2026-12-02T18:10:00Z",
          "exit_code": 0, "requested": 10, "completed": 10, "failed": 0, "proofs_per_hour": 94.7,
          "seconds_per_proof": 38.0, "proof_type": "porep", "concurrency": 2,
          "image_digest": "sha256:" + "ab" * 32, "log_tail": ["throughput: 1.579 proofs/min (38.0s/proof)"]}


@pytest.fixture
def store(store_factory: StoreFactory) -> SqlStore:
    return store_factory(ring_lines=100, now=StepClock())


def test_full_lifecycle_becomes_an_instance_report(store: SqlStore) -> None:
    assert store.register("p-0-a", register_doc("p-0-a")) == "registered"
    assert store.add_event("p-0-a", event_doc("params", "started")) == "stored"
    assert store.add_event("p-0-a", event_doc("params", "progress", details={"bytes_done": 5})) == "stored"
    assert store.add_event("p-0-a", event_doc("params", "done", at="2026-12-02T18:05:00Z")) == "stored"
    assert store.add_logs("p-0-a", ["line 1", "line 2"], dropped=3) == 0
    assert store.set_result("p-0-a", RESULT) == "stored"

    report = store.report("p-0-a")
    assert report is not None
    assert report.registered_at == T0 + timedelta(seconds=1)  # controller clock, not the worker's 17:59
    assert (report.pool, report.slot, report.machine_id, report.host_id, report.contract_id) == (
        "rtx4090", "rtx4090-0", "4242", "77", "9001")
    assert report.image_digest == "sha256:" + "ab" * 32 and report.gpu_name == "RTX 4090"
    assert [(e.phase, e.status) for e in report.events] == [("params", "started"), ("params", "progress"),
                                                            ("params", "done")]
    # One clock: events and result are placed at their arrival on the controller's clock (the StepClock:
    # +1 s per store call); the worker's own times stay as evidence, and the skew is known.
    assert report.events[1] == PhaseEvent("params", "progress", T0 + timedelta(seconds=3), details={"bytes_done": 5},
                                          worker_at=datetime(2026, 12, 2, 18, 1, tzinfo=UTC))
    received = T0 + timedelta(seconds=5)
    shift = datetime(2026, 12, 2, 18, 30, tzinfo=UTC) - received
    assert report.result == BenchmarkResult(
        outcome="completed", at=received, requested=10, completed=10, failed=0,
        started_at=datetime(2026, 12, 2, 18, 10, tzinfo=UTC) - shift, exit_code=0, proofs_per_hour=94.7,
        seconds_per_proof=38.0, proof_type="porep", concurrency=2, image_digest="sha256:" + "ab" * 32,
        log_tail=("throughput: 1.579 proofs/min (38.0s/proof)",), worker_at=datetime(2026, 12, 2, 18, 30, tzinfo=UTC))
    assert report.clock_skew_s == shift.total_seconds()
    assert [e.at for e in report.events] == sorted(e.at for e in report.events)
    assert report.log_tail == ("line 1", "line 2")
    assert report.dropped_log_lines == 3
    assert report.phase_times()["params-done"] == T0 + timedelta(seconds=4)  # arrival, controller clock

    detail = store.detail("p-0-a")
    assert detail is not None
    meta = detail[1]
    assert meta.worker_registered_at == datetime(2026, 12, 2, 17, 59, tzinfo=UTC)
    assert meta.worker_dropped == 3 and meta.ring_dropped == 0 and meta.stored_log_lines == 2
    assert meta.gpus == ("NVIDIA GeForce RTX 4090, 24564 MiB, 550.54",) and meta.hostname == "c.9001"
    assert len(meta.event_received_at) == 3 and meta.result_received_at is not None


def test_reregistration_is_idempotent_and_only_fills_gaps(store: SqlStore) -> None:
    store.register("p-0-a", register_doc("p-0-a", image_version=None))
    first = store.report("p-0-a")
    assert store.register("p-0-a", register_doc("p-0-a", pool="other", image_version="v7")) == "already-registered"
    again = store.report("p-0-a")
    assert again is not None and first is not None
    assert again.registered_at == first.registered_at and again.pool == "rtx4090" and again.image_version == "v7"
    assert store.stats()["instances"] == 1
    detail = store.detail("p-0-a")
    assert detail is not None and detail[1].registrations == 2


def test_identical_event_resend_is_a_noop(store: SqlStore) -> None:
    store.register("p-0-a", register_doc("p-0-a"))
    assert store.add_event("p-0-a", event_doc("daemon", "failed", exit_code=1)) == "stored"
    assert store.add_event("p-0-a", event_doc("daemon", "failed", exit_code=1)) == "duplicate"
    assert store.add_event("p-0-a", event_doc("daemon", "failed", exit_code=2)) == "stored"
    assert store.stats()["events"] == 2


def test_reports_for_unknown_instances_store_nothing(store: SqlStore) -> None:
    with pytest.raises(UnknownInstance, match="never registered"):
        store.add_event("ghost", event_doc("params", "started"))
    with pytest.raises(UnknownInstance):
        store.add_logs("ghost", ["x"])
    with pytest.raises(UnknownInstance):
        store.set_result("ghost", RESULT)
    assert store.stats() == {"instances": 0, "events": 0, "results": 0, "log_lines": 0}
    assert store.report("ghost") is None and store.tail("ghost", 5) == [] and store.log_view("ghost", 5) is None
    assert store.mark_destroyed("ghost", T0) is False


def test_result_is_accepted_once(store: SqlStore) -> None:
    store.register("p-0-a", register_doc("p-0-a"))
    assert store.set_result("p-0-a", RESULT) == "stored"
    assert store.set_result("p-0-a", dict(RESULT)) == "duplicate"
    with pytest.raises(ResultConflict, match="different result"):
        store.set_result("p-0-a", {**RESULT, "proofs_per_hour": 999.0})
    report = store.report("p-0-a")
    assert report is not None and report.result is not None and report.result.proofs_per_hour == 94.7


def test_destroyed_instance_keeps_its_logs_and_accepts_no_writes(store: SqlStore) -> None:
    store.register("p-0-a", register_doc("p-0-a"))
    store.add_logs("p-0-a", [f"l{i}" for i in range(5)])
    assert store.mark_destroyed("p-0-a", T0 + timedelta(hours=1)) is True
    assert store.mark_destroyed("p-0-a", T0 + timedelta(hours=2)) is True  # first time wins
    before = store.stats()
    for write in (lambda: store.add_logs("p-0-a", ["late"]),
                  lambda: store.add_event("p-0-a", event_doc("serve", "done")),
                  lambda: store.set_result("p-0-a", RESULT),
                  lambda: store.register("p-0-a", register_doc("p-0-a"))):
        with pytest.raises(InstanceDestroyed, match="destroyed"):
            write()
    assert store.stats() == before
    assert store.tail("p-0-a", 3) == ["l2", "l3", "l4"]
    view = store.log_view("p-0-a", 100)
    assert view is not None and view.destroyed_at == T0 + timedelta(hours=1) and len(view.lines) == 5
    report = store.report("p-0-a")
    assert report is not None and report.destroyed_at == T0 + timedelta(hours=1)
    assert store.reports(include_destroyed=False) == []


def test_ring_buffer_keeps_last_lines_and_counts_evictions(store_factory: StoreFactory) -> None:
    store = store_factory(ring_lines=10, now=StepClock())
    store.register("p-0-a", register_doc("p-0-a"))
    assert store.add_logs("p-0-a", [f"a{i}" for i in range(7)]) == 0
    assert store.add_logs("p-0-a", [f"b{i}" for i in range(7)], dropped=2) == 4
    assert store.add_logs("p-0-a", [f"c{i}" for i in range(25)]) == 25  # 10 evicted + 15 never written
    assert store.tail("p-0-a", 100) == [f"c{i}" for i in range(15, 25)]
    assert store.stats()["log_lines"] == 10
    report = store.report("p-0-a")
    assert report is not None and report.dropped_log_lines == 4 + 25 + 2
    detail = store.detail("p-0-a")
    assert detail is not None and (detail[1].stored_log_lines, detail[1].ring_dropped) == (10, 29)
    assert store.add_logs("p-0-a", ["d0"]) == 1
    assert store.tail("p-0-a", 2) == ["c24", "d0"]
    store.close()


def test_report_log_tail_is_the_last_lines(store: SqlStore) -> None:
    for iid in ("p-0-a", "p-1-b"):
        store.register(iid, register_doc(iid))
        store.add_logs(iid, [f"{iid} {i}" for i in range(80)])
    reports = store.reports()
    assert [r.instance_id for r in reports] == ["p-0-a", "p-1-b"]
    for r in reports:
        assert len(r.log_tail) == REPORT_TAIL_LINES
        assert r.log_tail[-1] == f"{r.instance_id} 79" and r.log_tail[0] == f"{r.instance_id} {80 - REPORT_TAIL_LINES}"


def test_log_rings_give_the_whole_bounded_ring_and_reports_carry_the_gpu_probe(store: SqlStore) -> None:
    # The judge's evidence (issue 23 item 3): every stored line of the instances asked for, oldest first, within
    # the ring bound (100 here); the register body's GPU probe on the report.
    probe = ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."]
    store.register("p-0-a", register_doc("p-0-a", gpus=probe))
    store.register("p-1-b", register_doc("p-1-b"))
    store.add_logs("p-0-a", [f"a{i}" for i in range(130)])
    store.add_logs("p-1-b", ["b0"])
    assert store.log_rings([]) == {}
    rings = store.log_rings(["p-0-a", "p-1-b", "p-0-a", "never-registered"])
    assert rings == {"p-0-a": tuple(f"a{i}" for i in range(30, 130)), "p-1-b": ("b0",), "never-registered": ()}
    report = store.report("p-0-a")
    assert report is not None and report.gpu_probe == tuple(probe) and len(report.log_tail) == REPORT_TAIL_LINES


def test_progress_events_are_a_ring_and_other_events_are_capped(store_factory: StoreFactory) -> None:
    store = store_factory(now=StepClock(), max_progress_events=3, max_other_events=2)
    store.register("p-0-a", register_doc("p-0-a"))
    store.add_event("p-0-a", event_doc("params", "started"))
    for i in range(6):
        store.add_event("p-0-a", event_doc("params", "progress", details={"bytes_done": i}))
    store.add_event("p-0-a", event_doc("params", "done"))
    report = store.report("p-0-a")
    assert report is not None
    assert [e.details.get("bytes_done") for e in report.events] == [None, 3, 4, 5, None]
    with pytest.raises(EventLimitExceeded, match="limit 2"):
        store.add_event("p-0-a", event_doc("daemon", "started"))
    store.close()


def test_secrets_are_redacted_before_they_reach_the_database(store_factory: StoreFactory) -> None:
    store = store_factory(now=StepClock())
    store.register("p-0-a", register_doc("p-0-a"))
    store.add_logs("p-0-a", [f"VAST_API_KEY={VAST_KEY}", "curl -H 'Authorization: Bearer sekrit-bearer-1'"])
    store.add_event("p-0-a", event_doc("params", "failed", message="GET https://u:pw-in-url@mirror/x failed",
                                       log_tail=[f"key {VAST_KEY}"],
                                       details={"url": "https://u:pw-in-details@mirror/x", "n": ["password=pw3"]}))
    store.set_result("p-0-a", {**RESULT, "log_tail": ["export FLEET_TOKEN=tok-in-result"]})
    report = store.report("p-0-a")
    assert report is not None
    assert report.log_tail == ("VAST_API_KEY=[REDACTED]", "curl -H 'Authorization: [REDACTED]'")
    assert report.events[0].message == "GET https://u:[REDACTED]@mirror/x failed"
    store.close()
    raw = store_factory.raw_text()
    assert "[REDACTED]" in raw
    for secret in (VAST_KEY, "sekrit-bearer-1", "pw-in-url", "pw-in-details", "pw3", "tok-in-result"):
        assert secret not in raw, secret


def test_everything_survives_close_and_reopen(store_factory: StoreFactory) -> None:
    store = store_factory(now=StepClock())
    store.register("p-0-a", register_doc("p-0-a"))
    store.add_event("p-0-a", event_doc("benchmark", "started"))
    store.add_logs("p-0-a", ["kept"])
    store.set_result("p-0-a", RESULT)
    before = store.report("p-0-a")
    store.close()
    reopened = store_factory(now=StepClock())
    assert reopened.report("p-0-a") == before
    if isinstance(reopened, SqliteStore):
        assert reopened.integrity_check() == ["ok"]
    assert reopened.add_logs("p-0-a", ["after restart"]) == 0
    assert reopened.tail("p-0-a", 2) == ["kept", "after restart"]
    reopened.close()


def test_concurrent_writers_lose_nothing(store: SqlStore) -> None:
    for i in range(4):
        store.register(f"p-{i}-x", register_doc(f"p-{i}-x"))

    def work(i: int) -> None:
        for j in range(50):
            store.add_event(f"p-{i}-x", event_doc("params", "progress", details={"j": j}))
            store.add_logs(f"p-{i}-x", [f"{i}:{j}"])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.stats() == {"instances": 4, "events": 200, "results": 0, "log_lines": 200}
    assert store.tail("p-2-x", 100) == [f"2:{j}" for j in range(50)]


def test_refuses_files_it_cannot_use(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable controller store"):
        SqliteStore(junk)
    newer = tmp_path / "newer.db"
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(StoreError, match="schema version 99 is newer"):
        SqliteStore(newer)
    with pytest.raises(StoreError, match="cannot open"):
        SqliteStore(tmp_path / "missing-dir" / "c.db")


def test_store_file_is_wal_with_schema_version(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.db")
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # v2 added directives, v3 re-keyed events, v4 the change sequence, v5 log stream state and sessions
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 5
    conn.close()
    store.close()


def test_group_commit_isolates_a_broken_write(store: SqlStore) -> None:
    from reconciler.adapters.store.sql import _PendingWrite

    store.register("p-0-a", register_doc("p-0-a"))

    def good(line: str) -> _PendingWrite:
        return _PendingWrite(lambda conn: store._writable(conn, "p-0-a") and conn.execute(
            "INSERT INTO log_lines (instance_id, seq, line) VALUES ('p-0-a', ?, ?)", (hash(line) % 10**9, line))
            .rowcount)

    def broken(conn: SqlConnection) -> None:
        conn.execute("UPDATE instances SET pool = 'corrupted' WHERE instance_id = 'p-0-a'")
        raise RuntimeError("bug after a modification")

    def refused(conn: SqlConnection) -> None:
        store._writable(conn, "ghost")

    batch = [good("one"), _PendingWrite(broken), _PendingWrite(refused), good("two")]
    with store._connection() as conn:
        store._commit_batch(conn, batch)
    assert all(item.done for item in batch)
    assert (batch[0].result, batch[0].error, batch[3].result, batch[3].error) == (1, None, 1, None)
    assert isinstance(batch[1].error, RuntimeError) and isinstance(batch[2].error, UnknownInstance)
    report = store.report("p-0-a")
    assert report is not None and report.pool == "rtx4090"  # the broken write's change was rolled back
    assert sorted(store.tail("p-0-a", 10)) == ["one", "two"]


def test_a_result_with_per_proof_results_and_the_daemon_log_reaches_the_judge(store: SqlStore) -> None:
    """Protocol additions (issue 13): `proofs` and `daemon_log_tail` are stored (redacted) and read back."""
    store.register("p-0-a", register_doc("p-0-a"))
    daemon = ["cuzk-daemon: 2026-12-02T18:20:00.118802Z ERROR cuzk_core::engine: Phase 7: PoRep proof self-check "
              "FAILED — proof will NOT be returned to caller job_id=0b6f proof_len=1920 sector=1 miner=1000",
              "cuzk-daemon: curl -H 'Authorization: Bearer sekrit-bearer-9' https://mirror.example/x"]
    proofs = [{"index": 1, "label": "COMPLETED", "seconds": 93.4, "prove_ms": 41234, "queue_ms": 0},
              {"index": 2, "label": "FAILED", "seconds": 90.1, "prove_ms": 0, "queue_ms": 0,
               "reason": "PoRep proof self-check failed: assembled proof did not verify (sector=1, miner=1000)"}]
    assert store.set_result("p-0-a", {**RESULT, "completed": 1, "failed": 1, "proofs": proofs,
                                      "daemon_log_tail": daemon}) == "stored"
    report = store.report("p-0-a")
    assert report is not None and report.result is not None
    assert [(p.index, p.label, p.seconds) for p in report.result.proofs] == [(1, "COMPLETED", 93.4),
                                                                            (2, "FAILED", 90.1)]
    assert report.result.proofs[1].reason is not None and "self-check failed" in report.result.proofs[1].reason
    assert report.result.daemon_log[0] == daemon[0] and "sekrit-bearer-9" not in report.result.daemon_log[1]


def test_summaries_say_what_triage_needs_and_reports_of_loads_only_those_asked(store: SqlStore) -> None:
    # Four instances: benchmarking, finished (result), failed a phase, serving (then a heartbeat), destroyed.
    for iid in ("a-bench", "b-done", "c-failed", "d-serving", "e-gone"):
        store.register(iid, register_doc(iid))
    store.add_event("a-bench", event_doc("benchmark", "started"))
    store.set_result("b-done", RESULT)
    store.add_event("c-failed", event_doc("params", "failed", exit_code=22, message="aria2c exited 22",
                                          log_tail=["errorCode=22"]))
    store.add_event("d-serving", event_doc("serve", "started", at="2026-12-02T18:40:00Z"))
    store.add_event("d-serving", event_doc("serve", "progress", at="2026-12-02T18:45:00Z",
                                           details={"heartbeat": {"seq": 1}}))
    store.add_event("e-gone", event_doc("serve", "started"))
    store.add_event("e-gone", event_doc("serve", "done", at="2026-12-02T18:02:00Z"))
    store.mark_destroyed("e-gone", T0 + timedelta(hours=1))
    summaries = {s.instance_id: s for s in store.instance_summaries()}
    assert list(summaries) == ["a-bench", "b-done", "c-failed", "d-serving", "e-gone"]  # registration order
    flags = {iid: (s.has_result, s.failed, s.serving, s.destroyed_at is not None) for iid, s in summaries.items()}
    assert flags == {"a-bench": (False, False, False, False), "b-done": (True, False, False, False),
                     "c-failed": (False, True, False, False), "d-serving": (False, False, True, False),
                     "e-gone": (False, False, False, True)}
    # The newest event's arrival on the controller's clock (StepClock: one second per call).
    full = {r.instance_id: r for r in store.reports()}
    assert summaries["d-serving"].last_signal == max(e.at for e in full["d-serving"].events)
    assert summaries["b-done"].last_signal == summaries["b-done"].registered_at  # no event: registration
    s = summaries["a-bench"]
    assert (s.pool, s.slot, s.machine_id, s.host_id, s.gpu_name) == ("rtx4090", "rtx4090-0", "4242", "77", "RTX 4090")
    # reports_of: those instances only, in full (events, result), in registration order, whatever the ask order.
    some = store.reports_of(["d-serving", "b-done", "nope", "d-serving"])
    assert [r.instance_id for r in some] == ["b-done", "d-serving"]
    assert some == [full["b-done"], full["d-serving"]]
    assert store.reports_of([]) == []
    many = [f"m-{n:04d}" for n in range(1200)]  # more than one chunk of bound parameters
    for iid in many:
        store.register(iid, register_doc(iid))
    assert [r.instance_id for r in store.reports_of(many[::-1])] == many

