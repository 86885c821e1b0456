"""A real PostgreSQL server for tests and benchmarks: `initdb` into a temporary directory and `pg_ctl` on 127.0.0.1
with a free port. No mocks of the database: the store's PostgreSQL adapter, the leader lease and the curio queue
source all meet this server.

PostgreSQL refuses to run as root ("root" execution of the PostgreSQL server is not permitted), so as root the
server runs as the `postgres` OS user (Debian's `postgresql` package creates it) through `runuser`; as any other
user it runs as that user. Clients reach it over TCP only, with scram-sha-256 password authentication, so a wrong
password fails as it does in production. The Unix socket lives in the server's own directory: it never clashes
with a system cluster in /var/run/postgresql.

Where the binaries are missing, tests skip with the reason, unless FLEET_REQUIRE_POSTGRES=1 or CI=true (`.ci/run`
installs Debian's `postgresql`), where that is a failure.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

REQUIRE_ENV = "FLEET_REQUIRE_POSTGRES"
ADMIN_USER = "fleet_admin"
# Test-speed settings: durability against an OS crash is not what tests measure. A killed postmaster still loses
# nothing that was committed: each commit writes its WAL to the OS before it returns, only without fsync. (Not
# synchronous_commit=off: that leaves a commit's WAL in shared memory for up to 3 x wal_writer_delay, and a kill
# loses it, which is exactly what the kill tests must not see.)
FAST_SETTINGS = {"fsync": "off", "full_page_writes": "off"}


class PostgresUnavailable(RuntimeError):
    """The binaries or the OS user the server needs are not on this machine (the message says which)."""


def postgres_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI", "").lower() in ("true", "1")


def find_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres: Debian keeps them in /usr/lib/postgresql/<major>/bin,
    off PATH; elsewhere they are on PATH."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    for directory in candidates:
        if all((Path(directory) / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(directory)
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    raise PostgresUnavailable("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One throwaway cluster. `start()` runs initdb on first use; `stop()`/`kill()`/`restart()` keep the data, so a
    test can take the server away and bring it back; `destroy()` removes everything."""

    def __init__(self, base_dir: Path | None = None, settings: dict[str, str] | None = None) -> None:
        self.bindir = find_bindir()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            try:
                self._pw = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable("running as root needs the 'postgres' OS user (Debian's postgresql)") from exc
        # A directory of our own under /tmp, not pytest's tmp_path: that is private to root (0700) and the server
        # runs as `postgres`.
        self.base_dir = Path(tempfile.mkdtemp(prefix="fleet-pg-", dir=base_dir))
        self.data_dir = self.base_dir / "data"
        self.socket_dir = self.base_dir / "socket"
        self.log_file = self.base_dir / "server.log"
        self.host = "127.0.0.1"
        self.port = _free_port()
        self.admin_password = secrets.token_hex(12)
        self.settings = {**FAST_SETTINGS, **(settings or {})}
        self._initialised = False
        if self._as_postgres:
            os.chown(self.base_dir, self._pw.pw_uid, self._pw.pw_gid)

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def _run(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, check=check, cwd=self.base_dir, timeout=120)

    def _initdb(self) -> None:
        pwfile = self.base_dir / "pwfile"
        pwfile.write_text(self.admin_password + "\n")
        self.socket_dir.mkdir()
        if self._as_postgres:
            for path in (pwfile, self.socket_dir):
                os.chown(path, self._pw.pw_uid, self._pw.pw_gid)
        pwfile.chmod(0o600)
        self._run([str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", ADMIN_USER, f"--pwfile={pwfile}",
                   "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8", "--no-sync",
                   "--locale=C"])
        pwfile.unlink()
        self._initialised = True

    def start(self) -> None:
        if not self._initialised:
            self._initdb()
        options = [f"-c listen_addresses={self.host}", f"-p {self.port}",
                   f"-c unix_socket_directories={self.socket_dir}"]
        options += [f"-c {key}={value}" for key, value in self.settings.items()]
        result = self._run([str(self.bindir / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data_dir),
                            "-l", str(self.log_file), "-o", " ".join(options)], check=False)
        if result.returncode != 0:
            log = self.log_file.read_text(errors="replace")[-3000:] if self.log_file.exists() else ""
            raise RuntimeError(f"pg_ctl start failed ({result.returncode}): {result.stderr.strip()}\n{log}")

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop: `fast` rolls back open transactions and disconnects clients; `immediate` aborts (crash
        recovery on the next start)."""
        if (self.data_dir / "postmaster.pid").exists():
            self._run([str(self.bindir / "pg_ctl"), "stop", "-w", "-m", mode, "-D", str(self.data_dir)], check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend it started, as a host losing the process would: the next
        `start()` runs crash recovery."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        children = [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _ppid(int(entry)) == pid]
        for victim in (pid, *children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in (pid, *children)):
            time.sleep(0.02)
        # The orphaned postmaster is reaped by PID 1, which in a container may take its time; until then a zombie
        # holds the PID in postmaster.pid and the next start refuses ("lock file already exists"). The process is
        # dead, so the lock file is stale: remove it as a host reboot would.
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.02)
        if Path(f"/proc/{pid}").exists():
            (self.data_dir / "postmaster.pid").unlink(missing_ok=True)

    def destroy(self) -> None:
        self.stop(mode="immediate")
        shutil.rmtree(self.base_dir, ignore_errors=True)

    # ---- clients ---------------------------------------------------------------------------------------------
    def uri(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        user = user or ADMIN_USER
        if password is None and user == ADMIN_USER:
            password = self.admin_password
        auth = quote(user, safe="") + (":" + quote(password, safe="") if password is not None else "")
        return f"postgresql://{auth}@{self.host}:{self.port}/{quote(dbname, safe='')}"

    @property
    def admin_uri(self) -> str:
        return self.uri("postgres")

    def execute(self, sql: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        """Run SQL as the superuser (autocommit, so CREATE DATABASE works); returns the rows, if any."""
        import psycopg

        with psycopg.connect(self.uri(dbname), autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(sql.encode())
            return list(cur.fetchall()) if cur.description else []

    def create_database(self, name: str | None = None, owner: str | None = None) -> str:
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        self.execute(f'CREATE DATABASE "{name}"' + (f' OWNER "{owner}"' if owner else ""))
        return self.uri(name)

    def create_role(self, name: str, password: str, login: bool = True) -> None:
        import psycopg.sql as sql

        statement = sql.SQL("CREATE ROLE {} WITH {} PASSWORD {}").format(
            sql.Identifier(name), sql.SQL("LOGIN" if login else "NOLOGIN"), sql.Literal(password))
        import psycopg

        with psycopg.connect(self.admin_uri, autocommit=True) as conn:
            conn.execute(statement)


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: fields after the last ')' are fixed.
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
