"""curio's task queue read over the PostgreSQL protocol (adapters/curio_queue.py) from a REAL PostgreSQL.

The database holds a replica of curio's harmony task tables taken from its migrations
(tests/fixtures/curio/harmony_task.sql, sources cited there), a read-only role with a SELECT grant (what the
fleet is given), and a role without one (refused). A queue that cannot be read is a snapshot with an error,
never an exception, and the error never shows the password.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.adapters.curio_queue import CurioQueue
from reconciler.domain.spec import QueueSource
from tests.postgres_server import PostgresServer

DDL = (Path(__file__).parent.parent / "fixtures" / "curio" / "harmony_task.sql").read_text()
SOURCE = QueueSource(url_env="CURIO_DB_URL", task_types=("PoRep", "UpdateProve"))
T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.fixture
def curio_db(postgres_server: PostgresServer) -> tuple[PostgresServer, str]:
    """A fresh database with curio's tables and some tasks: PoRep 3 waiting + 1 running, UpdateProve 1
    waiting, SDR (not a proof task of the pool) 5 waiting."""
    uri = postgres_server.create_database()
    name = uri.rsplit("/", 1)[1]
    postgres_server.execute(DDL, name)
    postgres_server.execute("INSERT INTO harmony_machines (host_and_port, cpu, ram, gpu) VALUES ('10.0.0.7:12300', 64, "
                            "549755813888, 1)", name)
    rows = [("PoRep", None, 40), ("PoRep", None, 25), ("PoRep", None, 5), ("PoRep", 1, 50),
            ("UpdateProve", None, 12)] + [("SDR", None, 90)] * 5
    for kind, owner, minutes_ago in rows:
        posted = (T0 - timedelta(minutes=minutes_ago)).isoformat()
        # Literals of the test's own table above, not input.
        postgres_server.execute(f"INSERT INTO harmony_task (posted_time, owner_id, added_by, name) VALUES "  # noqa: S608
                                f"('{posted}', {owner if owner else 'NULL'}, 1, '{kind}')", name)
    # Sealing sectors: 1 before precommit, 3 past it waiting for their seed (one failed), 1 with its PoRep task.
    for number, precommitted, porep_task, failed in ((1, False, None, False), (2, True, None, False),
                                                    (3, True, None, False), (4, True, None, True),
                                                    (5, True, 9, False)):
        values = f"(1000, {number}, 8, {precommitted}, {porep_task or 'NULL'}, {failed})"  # the test's own literals
        insert = ("INSERT INTO sectors_sdr_pipeline (sp_id, sector_number, reg_seal_proof, "  # noqa: S608
                  "after_precommit_msg_success, task_id_porep, failed) VALUES " + values)
        postgres_server.execute(insert, name)
    return postgres_server, name


def _role(server: PostgresServer, db: str, grant: bool, pipeline: bool = True) -> str:
    role, password = f"r_{uuid.uuid4().hex[:10]}", f"pw-{uuid.uuid4().hex}"
    server.create_role(role, password)
    server.execute(f'GRANT CONNECT ON DATABASE "{db}" TO "{role}"')
    if grant:
        server.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"; GRANT SELECT ON harmony_task TO "{role}"', db)
        if pipeline:
            server.execute(f'GRANT SELECT ON sectors_sdr_pipeline TO "{role}"', db)
    else:
        server.execute(f'REVOKE ALL ON harmony_task FROM "{role}"', db)
    return server.uri(db, role, password)


def test_counts_unclaimed_and_claimed_proof_tasks_per_type_with_a_read_only_role(
        curio_db: tuple[PostgresServer, str]) -> None:
    server, db = curio_db
    snapshot = CurioQueue({"CURIO_DB_URL": _role(server, db, grant=True)}).read(SOURCE)
    assert snapshot.error is None
    assert dict(snapshot.waiting) == {"PoRep": 3, "UpdateProve": 1}
    assert dict(snapshot.running) == {"PoRep": 1, "UpdateProve": 0}
    assert snapshot.total_waiting == 4
    assert snapshot.oldest_waiting_at == T0 - timedelta(minutes=40)  # the claimed one (50 min) is not waiting
    assert snapshot.upcoming == 2  # sectors 2 and 3: past precommit, no PoRep task, not failed


def test_a_role_without_the_pipeline_still_reads_the_queue(curio_db: tuple[PostgresServer, str]) -> None:
    server, db = curio_db
    snapshot = CurioQueue({"CURIO_DB_URL": _role(server, db, grant=True, pipeline=False)}).read(SOURCE)
    assert snapshot.error is None and snapshot.total_waiting == 4 and snapshot.upcoming is None


def test_a_type_with_no_rows_counts_zero_and_no_oldest(curio_db: tuple[PostgresServer, str]) -> None:
    server, db = curio_db
    snapshot = CurioQueue({"CURIO_DB_URL": _role(server, db, grant=True)}).read(
        QueueSource("CURIO_DB_URL", ("WdPost",)))
    assert snapshot.error is None and dict(snapshot.waiting) == {"WdPost": 0} and snapshot.oldest_waiting_at is None


def test_a_role_that_is_refused_gives_an_error_without_the_password(curio_db: tuple[PostgresServer, str]) -> None:
    server, db = curio_db
    url = _role(server, db, grant=False)
    snapshot = CurioQueue({"CURIO_DB_URL": url}).read(SOURCE)
    assert snapshot.error is not None and snapshot.error.startswith("InsufficientPrivilege: ")
    assert "harmony_task" in snapshot.error
    password = url.split(":")[2].split("@")[0]
    assert password not in snapshot.error and not snapshot.waiting


def test_a_wrong_password_and_an_unreachable_server_are_errors(curio_db: tuple[PostgresServer, str]) -> None:
    server, db = curio_db
    wrong = server.uri(db, "nobody_here", "not-the-password")
    refused = CurioQueue({"CURIO_DB_URL": wrong}).read(SOURCE)
    assert refused.error is not None and refused.error.startswith("OperationalError: ")
    assert "not-the-password" not in refused.error
    down = CurioQueue({"CURIO_DB_URL": f"postgresql://reader:secret-pw@127.0.0.1:{_closed_port()}/curio"},
                      connect_timeout_s=1).read(SOURCE)
    assert down.error is not None and down.error.startswith("OperationalError: ") and "secret-pw" not in down.error


def test_no_url_in_the_environment_is_an_error_naming_the_variable() -> None:
    assert CurioQueue({}).read(SOURCE).error == "$CURIO_DB_URL is not set (the queue's postgresql:// URL)"


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
