"""Every command that takes a controller-store target (`fleet status --controller-db`, `fleet reconcile
--controller-db`, `fleet controller serve --db`, `fleet db copy SRC DST`) refuses a URI in a scheme it does not
take (`postgresql+psycopg://` as SQLAlchemy-based tools write it, a typo such as `postgresq://`, `mysql://`,
`sqlite://`, upper case, no slashes) and a libpq key=value string in one line that names the scheme and the
accepted ones, exit 2, nothing created; a password written raw in a postgresql:// URI (with `@`, `/`, `%`) is
refused the same way; an encoded one that reaches no server is one line, exit 1. In no case does the password
appear in any output, log record, page or file (issue 30: `postgresq://` was read as a SQLite path and the
password printed in "no controller store there"). Then the same commands against a real PostgreSQL whose role
has such a password: nothing shows it either."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from reconciler.cli import main
from tests.controller_support import SECRET
from tests.gitrepos import git
from tests.integration.test_loop import _seed_store, origin  # noqa: F401 - `origin` is a fixture
from tests.postgres_server import PostgresServer

#: Passwords holding every character that cuts a URI in the wrong place.
PASSWORDS = ("p@ss:w/rd%x", "S3cr@t:/%zz", "a%40b@c/d:e")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refused_targets(password: str, port: int) -> list[str]:
    """Targets each command must refuse with exit 2 (their scheme, their form, or a raw password)."""
    authority = f"fleet:{password}@127.0.0.1:{port}"
    return [f"postgresql+psycopg://{authority}/fleetdb", f"postgresq://{authority}/fleetdb",
            f"postgress://{authority}/fleetdb", f"POSTGRESQL://{authority}/fleetdb", f"mysql://{authority}/fleetdb",
            f"sqlite://{authority}/fleet.db", f"postgres:{authority}/fleetdb", f"redis://:{password}@127.0.0.1:6379",
            f"host=127.0.0.1 port={port} password={password} dbname=fleetdb",
            f"postgresql://{authority}/fleetdb"]  # the password needs percent-encoding


def commands(target: str, tmp_path: Path, origin: Path) -> dict[str, list[str]]:  # noqa: F811
    sqlite = tmp_path / "seeded.db"
    if not (tmp_path / "w").exists():
        git(tmp_path, "clone", "--quiet", str(origin), str(tmp_path / "w"))
    return {
        "status": ["status", "--workdir", str(tmp_path / "w"), "--controller-db", target],
        "status --html": ["status", "--workdir", str(tmp_path / "w"), "--controller-db", target,
                          "--html", str(tmp_path / "page.html")],
        "reconcile": ["reconcile", "--repo", str(origin), "--workdir", str(tmp_path / "w"), "--controller-db", target,
                      "--once"],
        "controller serve": ["controller", "serve", "--db", target, "--port", "0"],
        "db copy (destination)": ["db", "copy", str(sqlite), target],
        "db copy (source)": ["db", "copy", target, "postgresql://fleet@127.0.0.1:1/fleetdb"],
    }


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_CONTROLLER_SECRET", SECRET.decode())


def everything_shown(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, tmp_path: Path) -> str:
    """All the command printed and logged, and every text file it left under tmp_path (pages, status files)."""
    out = capsys.readouterr()
    files = [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".db"
             and ".git" not in p.parts]
    shown = "\n".join([out.out, out.err, *(r.getMessage() for r in caplog.records), *files])
    caplog.clear()
    return shown


def forms(password: str) -> set[str]:
    """The password as it could leak: raw, percent-encoded, and each piece a wrong split would print."""
    pieces = {p for p in password.replace("@", " ").replace("/", " ").replace(":", " ").split() if len(p) >= 3}
    return {password, quote(password, safe=""), *pieces}


@pytest.mark.parametrize("password", PASSWORDS)
def test_every_store_command_refuses_foreign_schemes_in_one_line_without_the_password(
        password: str, tmp_path: Path, origin: Path, secret_env: None,  # noqa: F811
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    _seed_store(tmp_path / "seeded.db")
    port = closed_port()
    for target in refused_targets(password, port):
        for what, argv in commands(target, tmp_path, origin).items():
            before = sorted(p.name for p in tmp_path.iterdir())
            assert main(argv) == 2, (what, target)
            out = capsys.readouterr()
            assert out.out == "", (what, target)
            err = out.err.strip()
            assert "\n" not in err, (what, err)
            assert ("postgresql://" in err and "[REDACTED]" in err) or "SQLite store file" in err, (what, err)
            assert not any(form in err for form in forms(password)), (what, err)
            assert sorted(p.name for p in tmp_path.iterdir()) == before, (what, target)  # nothing created
            capsys.readouterr()
    # A scheme that is not ours is named, with what to write instead.
    assert main(commands(f"postgresql+psycopg://fleet:{password}@h/d", tmp_path, origin)["status"]) == 2
    err = capsys.readouterr().err
    assert "a postgresql+psycopg: URI" in err and "postgresql:// or postgres://" in err and "drop the driver" in err
    assert main(commands(f"postgresq://fleet:{password}@h/d", tmp_path, origin)["status"]) == 2
    assert "did you mean postgresql://" in capsys.readouterr().err


@pytest.mark.parametrize("password", PASSWORDS)
def test_an_encoded_password_that_reaches_no_server_is_one_line_and_never_shown(
        password: str, tmp_path: Path, origin: Path, secret_env: None,  # noqa: F811
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    _seed_store(tmp_path / "seeded.db")
    target = f"postgresql://fleet:{quote(password, safe='')}@127.0.0.1:{closed_port()}/fleetdb"
    for what, argv in commands(target, tmp_path, origin).items():
        status = main(argv)
        shown = everything_shown(capsys, caplog, tmp_path)
        assert status == (2 if what == "db copy (source)" else 1), (what, shown)
        assert not any(form in shown for form in forms(password)), (what, shown)
        assert "[REDACTED]" in shown, (what, shown)
    page = (tmp_path / "page.html").read_text()
    assert "observation failed" in page and "Connection refused" in page


def serve(db: str, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "reconciler.cli", "controller", "serve", "--db", db,
                             "--port", "0", "--log-level", "debug"],
                            env={**os.environ, "FLEET_CONTROLLER_SECRET": SECRET.decode(),
                                 "FLEET_ADMIN_TOKEN": "admin-token-0123456789abcdef"},
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_real_controller_process_prints_no_password_for_a_refused_target(tmp_path: Path) -> None:
    """As an operator runs it: the process's whole output (a traceback would show here too)."""
    password = PASSWORDS[0]
    process = serve(f"postgresq://fleet:{password}@127.0.0.1:{closed_port()}/fleetdb", tmp_path)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 2
    assert out.count("\n") == 1 and "did you mean postgresql://" in out
    assert not any(form in out for form in forms(password))
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def database_with_a_hard_password(postgres_server: PostgresServer) -> Iterator[tuple[str, str]]:
    password = PASSWORDS[0]
    role = f"fleet_{os.getpid()}"
    postgres_server.create_role(role, password)
    uri = postgres_server.create_database(owner=role)
    yield postgres_server.uri(uri.rsplit("/", 1)[1], user=role, password=password), password


def test_against_a_real_postgresql_the_password_shows_nowhere(
        database_with_a_hard_password: tuple[str, str], tmp_path: Path, origin: Path,  # noqa: F811
        secret_env: None, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    uri, password = database_with_a_hard_password
    caplog.set_level(logging.DEBUG)
    _seed_store(tmp_path / "seeded.db")
    git(tmp_path, "clone", "--quiet", str(origin), str(tmp_path / "w"))
    assert main(["db", "copy", str(tmp_path / "seeded.db"), uri]) == 0
    assert main(["status", "--workdir", str(tmp_path / "w"), "--controller-db", uri,
                 "--html", str(tmp_path / "page.html")]) == 0
    shown = everything_shown(capsys, caplog, tmp_path)
    assert "pro-4000-0-3f9a1c" in shown  # the copied instance is on the page
    assert not any(form in shown for form in forms(password)), shown
    process = serve(uri, tmp_path)
    try:
        assert process.stdout is not None
        head = []
        while not head or "controller listening on" not in head[-1]:
            head.append(process.stdout.readline())
            assert head[-1], "".join(head)
        url = head[-1].split("controller listening on ", 1)[1].split()[0]
        answers = [httpx.get(f"{url}{path}", headers={"Authorization": "Bearer admin-token-0123456789abcdef"},
                             timeout=10).text for path in ("/healthz", "/api/instances", "/nothing")]
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
    shown = "\n".join([*head, out, *answers])
    assert "pro-4000-0-3f9a1c" in shown
    assert not any(form in shown for form in forms(password)), shown
