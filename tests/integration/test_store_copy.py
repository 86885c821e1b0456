"""`fleet db copy SRC DST`: an embedded SQLite store moved into a real PostgreSQL reads back the same (reports,
events, log rings, results, directives, counters), replicas carry on from it (duplicates stay duplicates, rings
keep their sequence), and the copy is idempotent and resumable: interrupted or SIGKILLed midway, a second run
gives the same database with nothing twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.adapters.store import copy_to_postgres
from reconciler.adapters.store.copy_to_postgres import copy_store
from reconciler.adapters.store.port import StoreError
from reconciler.adapters.store.postgres import PostgresStore, redacted_uri
from reconciler.adapters.store.sqlite import SqliteStore
from tests.controller_support import StepClock, register_doc
from tests.postgres_server import PostgresServer

RESULT = {"protocol": 1, "outcome": "completed", "at": "2026-12-02T18:30:00Z", "started_at": "2026-12-02T18:10:00Z",
          "exit_code": 0, "requested": 10, "completed": 10, "failed": 0, "proofs_per_hour": 94.7,
          "seconds_per_proof": 38.0, "proof_type": "porep", "concurrency": 2, "image_digest": "sha256:" + "ab" * 32,
          "log_tail": ["throughput: 1.579 proofs/min (38.0s/proof)"]}


def event(i: int, status: str = "progress") -> dict[str, object]:
    return {"protocol": 1, "phase": "params", "status": status, "at": f"2026-12-02T18:{i // 60 % 60:02d}:{i % 60:02d}Z",
            "details": {"i": i}}


def embedded_store(path: Path) -> SqliteStore:
    """A store with everything it can hold: evicted progress events and log lines, a result, a destroyed
    instance, directives."""
    store = SqliteStore(path, ring_lines=20, now=StepClock(), max_progress_events=5)
    for n, iid in enumerate(("p-0-aaaaaa", "p-1-bbbbbb", "p-2-cccccc")):
        store.register(iid, register_doc(iid))
        store.add_event(iid, event(0, "started"))
        store.add_events(iid, [event(i) for i in range(1, 9)])  # the ring keeps 5 of the 8
        store.add_logs(iid, [f"{iid} line {i}" for i in range(30)], dropped=n)
    store.set_result("p-0-aaaaaa", RESULT)
    store.mark_destroyed("p-2-cccccc", datetime(2026, 12, 2, 19, 0, tzinfo=UTC))
    store.set_directives({"p-0-aaaaaa": {"protocol": 1, "action": "serve"},
                          "p-1-bbbbbb": {"protocol": 1, "action": "stop", "reason": "below min rate"}},
                         datetime(2026, 12, 2, 18, 40, tzinfo=UTC))
    return store


def assert_same_store(source: SqliteStore, copied: PostgresStore) -> None:
    assert copied.stats() == source.stats()
    assert copied.reports() == source.reports()
    for report in source.reports():
        iid = report.instance_id
        assert copied.detail(iid) == source.detail(iid)
        assert copied.log_view(iid, 1000) == source.log_view(iid, 1000)
        assert copied.directive(iid) == source.directive(iid)


def test_a_copy_reads_back_the_same_and_replicas_carry_on_from_it(tmp_path: Path, postgres_db: str) -> None:
    source = embedded_store(tmp_path / "controller.db")
    copied = copy_store(source.path, postgres_db)
    assert {c.table: (c.read, c.inserted) for c in copied} == {
        "instances": (3, 3), "events": (18, 18), "results": (1, 1), "log_lines": (60, 60), "directives": (2, 2)}
    replica = PostgresStore(postgres_db, ring_lines=20, now=StepClock(), max_progress_events=5)
    try:
        assert_same_store(source, replica)
        # Carrying on: a worker's retry of an event stored before the move is still a duplicate; its log ring
        # continues where it was; a destroyed instance stays closed.
        assert replica.add_event("p-1-bbbbbb", event(8)) == "duplicate"
        assert replica.add_logs("p-1-bbbbbb", ["after the move"]) == 1
        assert replica.tail("p-1-bbbbbb", 2) == ["p-1-bbbbbb line 29", "after the move"]
        assert replica.register("p-1-bbbbbb", register_doc("p-1-bbbbbb")) == "already-registered"
        with pytest.raises(StoreError, match="destroyed"):
            replica.add_logs("p-2-cccccc", ["late"])
        assert replica.add_event("p-0-aaaaaa", event(30, "done")) == "stored"
    finally:
        replica.close()
        source.close()


def test_an_interrupted_copy_run_again_gives_the_same_database_once(tmp_path: Path, postgres_db: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    source = embedded_store(tmp_path / "controller.db")
    monkeypatch.setattr(copy_to_postgres, "CHUNK_ROWS", 7)
    chunks: list[str] = []

    def crash_in_the_events(table: str, done: int, total: int) -> None:
        chunks.append(table)
        if table == "events":
            raise KeyboardInterrupt  # the operator's ^C after the first committed chunk of events

    with pytest.raises(KeyboardInterrupt):
        copy_store(source.path, postgres_db, on_chunk=crash_in_the_events)
    assert chunks == ["instances", "events"]
    again = copy_store(source.path, postgres_db)
    assert {c.table: (c.read, c.inserted) for c in again}["events"] == (18, 11)  # 7 were in
    assert {c.table: c.inserted for c in copy_store(source.path, postgres_db)} == {
        "instances": 0, "events": 0, "results": 0, "log_lines": 0, "directives": 0}
    replica = PostgresStore(postgres_db)
    try:
        assert_same_store(source, replica)
    finally:
        replica.close()
        source.close()


def _copy(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "reconciler.cli", "db", "copy", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))


def test_a_copy_killed_midway_resumes(tmp_path: Path, postgres_db: str) -> None:
    # Big rings, so the copy has chunks to be killed in.
    big = SqliteStore(tmp_path / "big.db", ring_lines=20_000, now=StepClock())
    for iid in ("p-0-aaaaaa", "p-1-bbbbbb"):
        big.register(iid, register_doc(iid))
        for start in range(0, 12_000, 2_000):
            big.add_logs(iid, [f"{iid} {i}" for i in range(start, start + 2_000)])
    big.close()
    first = _copy(str(tmp_path / "big.db"), postgres_db)
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("  log_lines:"):
            first.send_signal(signal.SIGKILL)  # after the first committed chunk of log lines
            break
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    second = _copy(str(tmp_path / "big.db"), postgres_db)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    summary = {line.split(":")[0]: line for line in out.splitlines() if "rows copied" in line}
    assert summary["log_lines"].startswith("log_lines: 2")  # not all 24,000: some were copied before the kill
    assert "already there" in summary["log_lines"] and not summary["log_lines"].endswith(" 0 already there")
    reopened, replica = SqliteStore(tmp_path / "big.db"), PostgresStore(postgres_db)
    try:
        assert_same_store(reopened, replica)
        assert replica.stats()["log_lines"] == 24_000
    finally:
        reopened.close()
        replica.close()


def test_bad_input_is_one_clear_error(tmp_path: Path, postgres_server: PostgresServer) -> None:
    not_uri = _copy(str(tmp_path / "c.db"), str(tmp_path / "other.db"))
    _, err = not_uri.communicate(timeout=60)
    assert not_uri.returncode == 2 and "DST must be a postgresql:// URI" in err
    missing = _copy(str(tmp_path / "missing.db"), postgres_server.uri("postgres"))
    _, err = missing.communicate(timeout=60)
    assert missing.returncode == 1
    assert err.strip() == f"fleet db copy: {tmp_path / 'missing.db'}: no SQLite controller store there"
    embedded_store(tmp_path / "c.db").close()
    wrong = postgres_server.uri("postgres", password="wrong-password-xyz")
    refused = _copy(str(tmp_path / "c.db"), wrong)
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == 1
    assert err.startswith(f"fleet db copy: {redacted_uri(wrong)}: cannot open the controller store: ")
    assert "password authentication failed" in err and "wrong-password-xyz" not in err
