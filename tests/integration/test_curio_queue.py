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
from reconciler.domain.spec import MarketSource, QueueSource
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


# --- the Snark Market (proofshare): curio's provider tables, read-only ----------------------------------

MARKET_DDL = (Path(__file__).parent.parent / "fixtures" / "curio" / "proofshare.sql").read_text()
MARKET_SOURCE = QueueSource(url_env="CURIO_DB_URL", task_types=("PoRep",),
                            market=MarketSource(usd_per_fil=4.0, deadline_minutes=45.0, window_hours=24.0))
FIL = 10**18


@pytest.fixture
def market_db(curio_db: tuple[PostgresServer, str]) -> tuple[PostgresServer, str]:
    """curio_db plus the provider's proofshare tables as the migrations leave them, and:
    - PSProve tasks: 2 waiting (posted 3 and 1 min ago), 1 running on node rtx4090-0-aaaaaa for 50 min (overdue);
    - payments of one wallet, cumulative per nonce (attoFIL): nonce 0 (2 days ago, outside the window), 1, 2, 3
      -> pays 0.004, 0.005 and 0.006 FIL in the window; another wallet's nonce 7 without its nonce 6 (unknown);
    - the asked price 0.003 FIL; history: on rtx4090-1-bbbbbb a failed run and a run ended 50 min after
      posting; on rtx4090-0-aaaaaa one in time; a PoRep failure (not market work)."""
    server, db = curio_db
    server.execute(MARKET_DDL, db)
    server.execute("INSERT INTO harmony_machines (host_and_port, cpu, ram, gpu) VALUES "
                   "('10.1.0.1:12300', 32, 1, 1), ('10.1.0.2:12300', 32, 1, 1)", db)
    server.execute("INSERT INTO harmony_machine_details (machine_id, machine_name, tasks, layers) "
                   "SELECT id, CASE host_and_port WHEN '10.1.0.1:12300' THEN 'rtx4090-0-aaaaaa' "
                   "ELSE 'rtx4090-1-bbbbbb' END, 'PSProve', 'gpu' FROM harmony_machines "
                   "WHERE host_and_port LIKE '10.1.0.%'", db)
    server.execute("INSERT INTO harmony_task (posted_time, owner_id, added_by, name) VALUES "
                   "(now() - interval '3 minutes', NULL, 1, 'PSProve'), "
                   "(now() - interval '1 minutes', NULL, 1, 'PSProve'), "
                   "(now() - interval '50 minutes', (SELECT id FROM harmony_machines "
                   "WHERE host_and_port = '10.1.0.1:12300'), 1, 'PSProve')", db)
    cumulative = [(0, 2 * FIL // 1000, "2 days"), (1, 6 * FIL // 1000, "3 hours"), (2, 11 * FIL // 1000, "2 hours"),
                  (3, 17 * FIL // 1000, "1 hour")]
    for nonce, amount, ago in cumulative:
        server.execute("INSERT INTO proofshare_provider_payments (provider_id, request_cid, payment_nonce, "  # noqa: S608
                       f"payment_cumulative_amount, payment_signature, created_at) VALUES (1001, 'bafy{nonce}', "
                       f"{nonce}, '{amount}', '\\x00', now() - interval '{ago}')", db)
    server.execute("INSERT INTO proofshare_provider_payments (provider_id, request_cid, payment_nonce, "
                   "payment_cumulative_amount, payment_signature) VALUES (1002, 'bafyx', 7, '99000000000000000', "
                   "'\\x00')", db)
    server.execute("UPDATE proofshare_meta SET enabled = TRUE, wallet = 'f1abc', "  # noqa: S608
                   f"pprice = '{3 * FIL // 1000}'", db)
    history = [("PSProve", "10.1.0.2:12300", 120, 110, False, "failed to compute proof: cuzk: daemon unavailable"),
               ("PSProve", "10.1.0.2:12300", 100, 50, True, ""), ("PSProve", "10.1.0.1:12300", 30, 25, True, ""),
               ("PoRep", "10.1.0.2:12300", 20, 10, False, "boom")]
    for n, (name, host, posted_ago, end_ago, ok, err) in enumerate(history):
        server.execute("INSERT INTO harmony_task_history (task_id, name, posted, work_start, work_end, result, "  # noqa: S608
                       f"completed_by_host_and_port, err) VALUES ({100 + n}, '{name}', "
                       f"now() - interval '{posted_ago} minutes', now() - interval '{posted_ago} minutes', "
                       f"now() - interval '{end_ago} minutes', {ok}, '{host}', '{err}')", db)
    return server, db


def _market_role(server: PostgresServer, db: str, tables: tuple[str, ...]) -> str:
    role, password = f"r_{uuid.uuid4().hex[:10]}", f"pw-{uuid.uuid4().hex}"
    server.create_role(role, password)
    server.execute(f'GRANT CONNECT ON DATABASE "{db}" TO "{role}"')
    server.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"', db)
    for table in tables:
        server.execute(f'GRANT SELECT ON {table} TO "{role}"', db)
    return server.uri(db, role, password)


MARKET_TABLES = ("harmony_task", "harmony_task_history", "harmony_machines", "harmony_machine_details",
                 "proofshare_provider_payments", "proofshare_meta")


def test_reads_the_markets_tasks_pay_asked_price_and_missed_deadlines_read_only(
        market_db: tuple[PostgresServer, str]) -> None:
    server, db = market_db
    snapshot = CurioQueue({"CURIO_DB_URL": _market_role(server, db, MARKET_TABLES)}).read(MARKET_SOURCE)
    assert snapshot.error is None and dict(snapshot.waiting) == {"PoRep": 3}  # PSProve is not the own queue
    market = snapshot.market
    assert market is not None and market.error is None
    assert (market.waiting, market.running) == (2, 1)
    # One proof's pay = its cumulative amount minus the previous nonce's (curio's PSListQueue); nonce 0 is outside
    # the window, and the other wallet's nonce 7 has no nonce 6: unknown, not counted.
    assert (market.paid_proofs, market.paid_atto) == (3, 15 * FIL // 1000)
    assert market.asked_atto == 3 * FIL // 1000
    misses = {(m.task_id, m.machine_name, m.succeeded, m.overdue) for m in market.misses}
    overdue_id = next(m.task_id for m in market.misses if m.overdue)
    assert misses == {(100, "rtx4090-1-bbbbbb", False, False), (101, "rtx4090-1-bbbbbb", True, False),
                      (overdue_id, "rtx4090-0-aaaaaa", False, True)}
    failed = next(m for m in market.misses if m.task_id == 100)
    assert failed.error == "failed to compute proof: cuzk: daemon unavailable" and failed.host_and_port == \
        "10.1.0.2:12300"


def test_a_role_without_the_markets_grants_still_reads_the_queue(market_db: tuple[PostgresServer, str]) -> None:
    server, db = market_db
    url = _market_role(server, db, ("harmony_task",))
    snapshot = CurioQueue({"CURIO_DB_URL": url}).read(MARKET_SOURCE)
    assert snapshot.error is None and snapshot.total_waiting == 3
    assert snapshot.market is not None and (snapshot.market.waiting, snapshot.market.running) == (2, 1)
    assert snapshot.market.error is not None and snapshot.market.error.startswith("InsufficientPrivilege: ")
    assert url.split(":")[2].split("@")[0] not in snapshot.market.error
