"""`fleet reconcile --controller-db postgresql://...` and `fleet status` on a real PostgreSQL: the same pass and the
same root cause as on the embedded SQLite store (its reports moved over with `fleet db copy`), and bad input
(an unreachable server, a wrong password, a database of a newer schema) is one line naming the URI without its
password, exit status 1, nothing written: no commit reaches the origin and the database is untouched."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.store.copy_to_postgres import copy_store
from reconciler.adapters.store.postgres import PostgresStore, redacted_uri
from reconciler.adapters.store.schema import SCHEMA_VERSION
from reconciler.cli import main
from reconciler.flows.judge import run_pass
from tests.gitrepos import origin_log
from tests.integration.test_loop import _seed_store, origin  # noqa: F401 - `origin` is a fixture
from tests.postgres_server import PostgresServer
from tests.scenarios import DIGEST


def test_reconcile_once_then_status_on_postgresql(origin: Path, tmp_path: Path, postgres_db: str,  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "controller.db"
    _seed_store(db)
    copy_store(db, postgres_db)
    workdir = tmp_path / "reconciler"
    argv = ["reconcile", "--repo", str(origin), "--workdir", str(workdir), "--controller-db", postgres_db, "--once",
            "--image-digest", DIGEST]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "committed" in out and "benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused" in out
    assert main(argv) == 0
    assert "nothing new" in capsys.readouterr().out
    assert main(["status", "--workdir", str(workdir), "--controller-db", postgres_db]) == 0
    status = capsys.readouterr().out
    assert "benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused (os error 111)" in status


def _bad_uris(server: PostgresServer, newer: str) -> dict[str, tuple[str, str, str]]:
    """what -> (URI, the password it carries, what the error must say). `newer`: a database of schema 99."""
    server.create_role("fleet_reconciler", "the-right-password")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    return {
        "unreachable": (f"postgresql://fleet_reconciler:pw-1@127.0.0.1:{closed}/fleet", "pw-1", "Connection refused"),
        "wrong password": (server.uri("postgres", user="fleet_reconciler", password="pw-2"), "pw-2",
                           'password authentication failed for user "fleet_reconciler"'),
        "newer schema": (newer, server.admin_password, "store schema version 99 is newer than this code understands"),
    }


def test_reconcile_and_status_refuse_a_bad_database_with_one_clear_line(
        origin: Path, tmp_path: Path, postgres_server: PostgresServer,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    newer = postgres_server.create_database()
    PostgresStore(newer).close()
    newer_name = newer.rsplit("/", 1)[1]
    postgres_server.execute("INSERT INTO fleet_schema (version) VALUES (99)", newer_name)
    before = origin_log(origin)
    for what, (uri, password, why) in _bad_uris(postgres_server, newer).items():
        argv = ["reconcile", "--repo", str(origin), "--workdir", str(tmp_path / "w"), "--controller-db", uri,
                "--once"]
        assert main(argv) == 1, what
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"fleet reconcile: {redacted_uri(uri)}: ") and why in err, (what, err)
        assert "\n" not in err and password not in err, (what, err)
        assert main(["status", "--workdir", str(tmp_path / "w"), "--controller-db", uri]) != 0, what
        out = capsys.readouterr()
        assert why in out.out + out.err and password not in out.out + out.err, what
    assert origin_log(origin) == before  # nothing committed, nothing pushed
    assert postgres_server.execute("SELECT version FROM fleet_schema ORDER BY version", newer_name) == [
        (SCHEMA_VERSION,), (99,)]
    assert postgres_server.execute("SELECT count(*) FROM instances", newer_name) == [(0,)]


def test_a_pass_while_the_database_is_away_observes_nothing_and_judges_nothing(
        origin: Path, tmp_path: Path, private_postgres_server: PostgresServer,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """The store restarting between a replica's start and its pass: the pass's read fails as a temporary error
    (never half a store read), nothing is committed; with the database back, the next pass judges."""
    db = tmp_path / "controller.db"
    _seed_store(db)
    uri = private_postgres_server.create_database()
    copy_store(db, uri)
    before = origin_log(origin)
    argv = ["reconcile", "--repo", str(origin), "--workdir", str(tmp_path / "w"), "--controller-db", uri, "--once",
            "--image-digest", DIGEST]
    store = PostgresStore(uri)  # (opened while the server is up, as a running replica's store was)
    try:
        private_postgres_server.stop()
        git = GitStore.clone(str(origin), tmp_path / "w")
        result = run_pass(GitFleetTree(git), store, datetime(2026, 12, 3, tzinfo=UTC), desired_image_digest=DIGEST,
                          directive_sink=store)
        assert not result.ok and result.observation_error is not None and result.verdicts == ()
        assert result.observation_error.startswith("StoreUnavailable: ")
        assert origin_log(origin) == before
    finally:
        store.close()
    private_postgres_server.start()
    assert main(argv) == 0
    assert "committed" in capsys.readouterr().out and origin_log(origin) != before
