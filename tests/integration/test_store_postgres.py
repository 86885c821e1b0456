"""The controller store on a real PostgreSQL server: what only a server database adds to the store contract
(tests/unit/test_store*.py run the contract itself on both adapters).

- Bad input: an unreachable server, a wrong password (a real role), a database of a newer schema -> one clear
  error naming the URI without its password, exit status 1, nothing written.
- Migrations: replicas starting at once migrate once (advisory lock); the version lives in `fleet_schema`.
- Replicas: two stores (as two controller processes would hold) writing the same instances at once lose
  nothing and store a replayed batch once.
- The server restarting: the API answers 503 with Retry-After meanwhile, a pass's read fails as a temporary
  error (never half a store), and the pool reconnects by itself afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import psycopg
import pytest

from reconciler.adapters.store.port import StoreError, StoreUnavailable
from reconciler.adapters.store.postgres import PostgresStore, redacted_uri
from reconciler.adapters.store.schema import SCHEMA_VERSION
from tests.controller_support import SECRET, Harness, StepClock, auth, register_doc
from tests.postgres_server import PostgresServer


def progress(i: int) -> dict[str, object]:
    return {"protocol": 1, "phase": "params", "status": "progress", "at": f"2026-12-02T18:{i // 60:02d}:{i % 60:02d}Z",
            "details": {"i": i}}


def test_a_uri_is_shown_without_its_password() -> None:
    assert redacted_uri("postgresql://fleet:s3cr%40t@db.example:5432/fleet?sslmode=require") == \
        "postgresql://fleet:[REDACTED]@db.example:5432/fleet?sslmode=require"
    assert redacted_uri("postgresql://fleet@db.example/fleet?password=hunter2&connect_timeout=3") == \
        "postgresql://fleet@db.example/fleet?password=[REDACTED]&connect_timeout=3"
    assert redacted_uri("postgresql://db.example/fleet") == "postgresql://db.example/fleet"
    # A password written with raw '@', ':' and '/' (libpq would split it elsewhere): masked whole all the same.
    assert redacted_uri("postgresql://fleet:p@ss:w/rd@db.example:5432/fleet") == \
        "postgresql://fleet:[REDACTED]@db.example:5432/fleet"


# --- bad input: one clear error, the URI without its password, exit 1, nothing written --------------------------


def _serve(db: str, tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`fleet controller serve --db DB`, expected to refuse before it listens."""
    environment = {**os.environ, "FLEET_CONTROLLER_SECRET": SECRET.decode(), **(env or {})}
    return subprocess.run([sys.executable, "-m", "reconciler.cli", "controller", "serve", "--db", db, "--port", "0",
                           "--log-level", "warning"], capture_output=True, text=True, env=environment, timeout=60,
                          cwd=tmp_path)


def _assert_one_clear_error(done: subprocess.CompletedProcess[str], shown_uri: str, password: str, why: str) -> None:
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""  # never "listening"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert lines[0].startswith(f"fleet controller serve: {shown_uri}: "), lines[0]
    assert why in lines[0], lines[0]
    assert password not in done.stderr


def test_an_unreachable_server_is_one_clear_error(tmp_path: Path, postgres_server: PostgresServer) -> None:
    closed_port = _unused_port()
    uri = f"postgresql://fleet_admin:pw-unreachable@127.0.0.1:{closed_port}/fleet"
    done = _serve(uri, tmp_path)
    _assert_one_clear_error(done, redacted_uri(uri), "pw-unreachable",
                            "Connection refused")


def test_a_wrong_password_is_one_clear_error_and_writes_nothing(tmp_path: Path, postgres_server: PostgresServer,
                                                                 postgres_db: str) -> None:
    postgres_server.create_role("fleet_wrong_pw", "the-right-password")
    dbname = postgres_db.rsplit("/", 1)[1]
    postgres_server.execute(f'GRANT ALL ON DATABASE "{dbname}" TO fleet_wrong_pw')
    uri = postgres_server.uri(dbname, user="fleet_wrong_pw", password="not-the-password")
    done = _serve(uri, tmp_path)
    _assert_one_clear_error(done, redacted_uri(uri), "not-the-password",
                            'password authentication failed for user "fleet_wrong_pw"')
    # PGPASSWORD is read as libpq reads it: the same refusal without a password in the URI.
    done = _serve(postgres_server.uri(dbname, user="fleet_wrong_pw"), tmp_path, {"PGPASSWORD": "also-wrong"})
    _assert_one_clear_error(done, postgres_server.uri(dbname, user="fleet_wrong_pw"), "also-wrong",
                            "password authentication failed")
    assert postgres_server.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", dbname) == [(0,)]


def test_a_database_of_a_newer_schema_is_refused_untouched(tmp_path: Path, postgres_server: PostgresServer,
                                                           postgres_db: str) -> None:
    PostgresStore(postgres_db).close()
    dbname = postgres_db.rsplit("/", 1)[1]
    postgres_server.execute("INSERT INTO fleet_schema (version) VALUES (99)", dbname)
    before = postgres_server.execute("SELECT version FROM fleet_schema ORDER BY version", dbname)
    shown = redacted_uri(postgres_db)
    with pytest.raises(StoreError, match=f"^{re.escape(shown)}: store schema version 99 is newer than this code "
                                         f"understands \\({SCHEMA_VERSION}\\)"):
        PostgresStore(postgres_db)
    done = _serve(postgres_db, tmp_path)
    _assert_one_clear_error(done, shown, postgres_server.admin_password, "schema version 99 is newer")
    assert postgres_server.execute("SELECT version FROM fleet_schema ORDER BY version", dbname) == before


def _unused_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- migrations and replicas ----------------------------------------------------------------------------------


def test_replicas_starting_at_once_migrate_once(postgres_server: PostgresServer, postgres_db: str) -> None:
    stores: list[PostgresStore] = []
    failures: list[BaseException] = []
    start = threading.Barrier(4)

    def open_one() -> None:
        start.wait()
        try:
            stores.append(PostgresStore(postgres_db, now=StepClock()))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert failures == [] and len(stores) == 4
        dbname = postgres_db.rsplit("/", 1)[1]
        assert postgres_server.execute("SELECT version FROM fleet_schema", dbname) == [(SCHEMA_VERSION,)]
        stores[0].register("p-0-a", register_doc("p-0-a"))
        assert [r.instance_id for r in stores[3].reports()] == ["p-0-a"]  # one database, every replica sees it
    finally:
        for store in stores:
            store.close()


def test_two_replicas_writing_the_same_instances_lose_nothing(postgres_db: str) -> None:
    first, second = PostgresStore(postgres_db, now=StepClock()), PostgresStore(postgres_db, now=StepClock())
    try:
        for i in range(3):
            first.register(f"p-{i}-x", register_doc(f"p-{i}-x"))
        errors: list[BaseException] = []

        def work(store: PostgresStore, offset: int) -> None:
            try:
                for j in range(40):
                    # Every write touches all three rows, in varying order: row locks taken in instance order
                    # (write_all sorts) keep the two replicas from deadlocking.
                    ids = [f"p-{i}-x" for i in (range(3) if j % 2 else reversed(range(3)))]
                    outcomes = store.write_all([p for iid in ids for p in (
                        store.prepare_event(iid, progress(offset + j)), store.prepare_logs(iid, [f"{offset + j}"]))])
                    errors.extend(error for error, _ in outcomes if error is not None)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(store, offset))
                   for store, offset in ((first, 0), (second, 1000), (first, 2000), (second, 3000))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert first.stats() == {"instances": 3, "events": 480, "results": 0, "log_lines": 480}
        for i in range(3):
            detail = second.detail(f"p-{i}-x")
            assert detail is not None and detail[1].stored_log_lines == 160  # the ring's sequence has no gaps
            assert len(second.tail(f"p-{i}-x", 1000)) == 160
    finally:
        first.close()
        second.close()


def test_a_batch_replayed_through_two_replicas_at_once_is_stored_once(postgres_db: str) -> None:
    """A worker whose response was lost retries through the other replica while the first still commits."""
    first, second = Harness(postgres_db), Harness(postgres_db)
    try:
        first.register("p-0-a")
        batch = {"protocol": 1, "events": [progress(i) for i in range(20)]}
        answers: list[httpx.Response] = []
        go = threading.Barrier(2)

        def send(harness: Harness) -> None:
            go.wait()
            answers.append(harness.post("p-0-a", "events", batch))

        threads = [threading.Thread(target=send, args=(h,)) for h in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(a.status_code for a in answers) == [200, 200]
        assert first.store.stats()["events"] == 20
    finally:
        first.close()
        second.close()


# --- the server restarting -------------------------------------------------------------------------------------


def test_while_the_server_restarts_the_api_answers_503_and_reconnects_after(
        private_postgres_server: PostgresServer) -> None:
    server = private_postgres_server
    harness = Harness(server.create_database())
    try:
        harness.register("p-0-a")
        assert harness.post("p-0-a", "events", progress(1)).status_code == 200
        server.stop(mode="fast")
        answer = harness.post("p-0-a", "events", progress(2))
        assert answer.status_code == 503 and answer.headers["retry-after"] == "2"
        assert answer.json()["error"] == "store unavailable"
        with pytest.raises(StoreUnavailable):
            harness.store.reports()  # a pass observes nothing rather than half a store
        directive = harness.client.get("/api/v1/instances/p-0-a/directive", headers=auth("p-0-a"))
        assert directive.status_code == 503 and directive.headers["retry-after"] == "2"
        server.start()
        # Connections the restart broke are discarded by the pool as they fail: within a few retries (workers
        # retry on 503) every answer is 200 again, without restarting the controller.
        statuses = [harness.post("p-0-a", "events", progress(3 + i)).status_code for i in range(6)]
        assert statuses[-1] == 200 and set(statuses) <= {200, 503}
        assert harness.post("p-0-a", "events", progress(2)).status_code == 200  # the retried report
        report = harness.store.report("p-0-a")
        assert report is not None and {e.details["i"] for e in report.events} >= {1, 2, 8}
    finally:
        harness.close()


def test_a_server_killed_loses_no_acknowledged_report(private_postgres_server: PostgresServer) -> None:
    """SIGKILL of the postmaster: what was answered 200 before is there after crash recovery."""
    server = private_postgres_server
    harness = Harness(server.create_database())
    try:
        harness.register("p-0-a")
        acknowledged = [i for i in range(30) if harness.post("p-0-a", "events", progress(i)).status_code == 200]
        server.kill()
        assert harness.post("p-0-a", "events", progress(99)).status_code == 503
        server.start()
        reopened = PostgresStore(harness.store._uri)
        try:
            report = reopened.report("p-0-a")
            assert report is not None
            assert sorted(e.details["i"] for e in report.events) == acknowledged == list(range(30))
        finally:
            reopened.close()
    finally:
        harness.close()


def test_a_password_never_reaches_an_error_or_the_location(postgres_server: PostgresServer, postgres_db: str) -> None:
    store = PostgresStore(postgres_db)
    try:
        assert postgres_server.admin_password not in store.location
        assert store.location == redacted_uri(postgres_db)
    finally:
        store.close()
    with pytest.raises(StoreError) as raised:
        PostgresStore(postgres_db.replace(postgres_server.admin_password, "wrong-" + postgres_server.admin_password))
    assert postgres_server.admin_password not in str(raised.value)
    with pytest.raises(psycopg.OperationalError):  # (the driver itself refuses the same URI: the test is real)
        psycopg.connect(postgres_db.replace(postgres_server.admin_password, "wrong")).close()
