"""Shared pytest set-up: a real PostgreSQL server on demand (`postgres_server`, `postgres_db`,
`private_postgres_server`); the record index of a spec directory outside git goes to $XDG_CACHE_HOME, so tests
(and the CLI subprocesses they start) get a private cache directory instead of the user's ~/.cache."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres_server import REQUIRE_ENV, PostgresServer, PostgresUnavailable, postgres_required
from tests.store_support import StoreFactory


@pytest.fixture(autouse=True, scope="session")
def _private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


# ---- a real PostgreSQL server (tests/postgres_server.py) -------------------------------------------------------------
def _postgres_or_skip() -> PostgresServer:
    try:
        return PostgresServer()
    except PostgresUnavailable as exc:
        if postgres_required():
            pytest.fail(f"{exc} ({REQUIRE_ENV}=1 / CI=true: a missing PostgreSQL is a failure)")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One server shared by the session; tests that need a clean slate take `postgres_db`."""
    server = _postgres_or_skip()
    server.start()
    yield server
    server.destroy()


@pytest.fixture
def postgres_db(postgres_server: PostgresServer) -> str:
    """The URI (with the superuser's password) of a fresh, empty database on the shared server."""
    return postgres_server.create_database()


@pytest.fixture
def private_postgres_server() -> Iterator[PostgresServer]:
    """A server of the test's own, for tests that stop, kill or restart it."""
    server = _postgres_or_skip()
    server.start()
    yield server
    server.destroy()


@pytest.fixture(params=["sqlite", "postgres"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Opens stores of one adapter (`sqlite`, `postgres`): the store contract's tests run against both."""
    server = request.getfixturevalue("postgres_server") if request.param == "postgres" else None
    factory = StoreFactory(request.param, tmp_path, server)
    yield factory
    factory.close_all()
