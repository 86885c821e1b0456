"""Hostile workers and strangers against a REAL controller process (`fleet reconcile --listen` on 127.0.0.1, the
page and the worker API on one port, its open-file limit at 300), the probes of issue 30:

- the lock-out: 515 connections that send only the head of `POST /login` (Content-Length: 4000, no body), from
  one address and then from nine;
- the descriptor hold: 277 keep-alive connections on one worker token, then 277 tokens with one each;
- the freeze: log bodies built to make a backtracking redactor take seconds (repeated `token.`, and the
  costliest fragment of every pattern at the protocol's 4,096 characters a line, 256 KiB a body);
- the escapes, forged lines and secret forms: OSC 52 (ST-terminated), an OSC title, CSI, U+009B, bidi
  overrides, CR, a newline inside one shipped line and inside `gpu_name` followed by trailer-shaped text, and
  the secrets of the issue (a PEM key split across two log batches among them).

Each probe runs while a prober asks `/healthz` on a fresh connection every 0.1 s: every answer within
HEALTH_BOUND_S, and another worker's requests within WORKER_BOUND_S. After a pass committed the hostile worker's
verdict, no raw control character, no forged line and no secret is in git (messages, trees, every blob), in
`fleet why`, `fleet status`, the page or the PR comment (`fleet plan --format markdown`).
"""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from reconciler.domain.redact import PATTERNS
from reconciler.domain.tokens import instance_token, machine_claim
from tests.gitrepos import git, make_origin
from tests.scenarios import SPEC_YAML

SECRET = "hostile-test-controller-secret-0123456"
ADMIN = "hostile-test-admin-token-0123456789ab"
READ = "hostile-test-read-token-0123456789abcd"
#: The bounds this suite states: /healthz always answers within 1 s; another worker's request within 2 s.
HEALTH_BOUND_S = 1.0
#: What an unattacked /healthz takes on a quiet machine (median, a fresh connection each time): the
#: reference health_bound scales HEALTH_BOUND_S by on a loaded one.
QUIET_HEALTH_S = 0.02
WORKER_BOUND_S = 2.0
OPEN_FILES = 300
#: What anything waits for at most (a deadline on a shared 2-core machine, never a speed assertion).
WAIT_S = 120.0

#: Characters that must never reach a terminal or git raw (TAB and the line ends of files aside).
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


@dataclass
class Controller:
    url: str
    host: str
    port: int
    origin: Path
    workdir: Path
    proc: subprocess.Popen[str]
    tmp: Path
    lines: list[str] = field(default_factory=list)


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    tmp = tmp_path_factory.mktemp("hostile")
    origin, _ = make_origin(tmp, {"fleet-spec/fleet.yaml": SPEC_YAML, "README.md": "fleet\n"})
    workdir = tmp / "reconciler"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(FLEET_CONTROLLER_SECRET=SECRET, FLEET_ADMIN_TOKEN=ADMIN, FLEET_READ_TOKEN=READ)
    cmd = [sys.executable, "-m", "reconciler.cli", "reconcile", "--repo", str(origin), "--workdir", str(workdir),
           "--controller-db", str(tmp / "controller.db"), "--listen", "127.0.0.1:0", "--interval", "3", "--json"]
    with open(tmp / "controller.stderr", "w") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                preexec_fn=_limit_open_files)
    assert proc.stdout is not None
    ctl: Controller | None = None
    head: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while ctl is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"controller exited: {(tmp / 'controller.stderr').read_text()}"
        head.append(line)
        if line.startswith("controller listening on "):
            url = line.split()[3]
            host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
            ctl = Controller(url, host, int(port), origin, workdir, proc, tmp, head)
    assert ctl is not None, head
    threading.Thread(target=lambda: ctl.lines.extend(proc.stdout or ()), daemon=True).start()
    try:
        yield ctl
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# --- clients --------------------------------------------------------------------------------------------


def connect(ctl: Controller, source: str = "127.0.0.1") -> socket.socket:
    """A connection from `source` (any 127.0.0.0/8 address is this host: several 'client addresses')."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect((ctl.host, ctl.port))
    return sock


def token(iid: str) -> str:
    return instance_token(SECRET.encode(), iid)


def register(ctl: Controller, iid: str, machine: str, **fields: object) -> None:
    doc = {"protocol": 1, "instance_id": iid, "at": "2026-12-02T18:00:00Z", "pool": "rtx4090", "slot": "rtx4090-0",
           "machine_id": machine, "machine_claim": machine_claim(SECRET.encode(), iid, machine), "host_id": "7781",
           **fields}
    post(ctl, iid, "register", doc)


def post(ctl: Controller, iid: str, action: str, doc: dict[str, object], expect: int = 200) -> float:
    start = time.monotonic()
    r = httpx.post(f"{ctl.url}/api/v1/instances/{iid}/{action}", json=doc, timeout=30,
                   headers={"Authorization": f"Bearer {token(iid)}"})
    assert r.status_code == expect, (action, r.status_code, r.text[:300])
    return time.monotonic() - start


def worker_round(ctl: Controller, iid: str) -> float:
    """Another worker's traffic: a log batch and a directive poll, each on a fresh connection (as curl does);
    the slowest answer's seconds."""
    slowest = post(ctl, iid, "logs", {"protocol": 1, "lines": ["an ordinary line"]})
    start = time.monotonic()
    r = httpx.get(f"{ctl.url}/api/v1/instances/{iid}/directive", timeout=30,
                  headers={"Authorization": f"Bearer {token(iid)}"})
    assert r.status_code == 200, r.text
    return max(slowest, time.monotonic() - start)


def healthz_seconds(ctl: Controller) -> float | None:
    """One GET /healthz on a fresh connection (a raw socket: the probe itself costs next to nothing); its
    seconds, None when refused, reset or not 200."""
    start = time.monotonic()
    try:
        with connect(ctl) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
    except OSError:
        return None
    return time.monotonic() - start if reply.startswith(b"HTTP/1.1 200 ") else None


class Prober(threading.Thread):
    """/healthz every 0.1 s until stopped; every latency (None: no answer)."""

    def __init__(self, ctl: Controller):
        super().__init__(daemon=True)
        self.ctl = ctl
        self.latencies: list[float | None] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.1):
            self.latencies.append(healthz_seconds(self.ctl))

    def probe_more(self, count: int, within_s: float = 30.0) -> None:
        """Wait until `count` more probes have answered (or not): a block that is over in less than a few
        probe intervals on a fast machine is still probed while its connections are held."""
        goal = len(self.latencies) + count
        deadline = time.monotonic() + within_s
        while len(self.latencies) < goal and time.monotonic() < deadline:
            time.sleep(0.05)


def machine_slowdown() -> float:
    """How much slower than its CPU time this machine runs a CPU-bound piece of Python now (1 when the process
    has a core to itself; about the load per core on a shared one): the best of three 20 ms measurements."""
    ratios = []
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.thread_time()
        while time.thread_time() - cpu < 0.02:
            sum(range(1000))
        ratios.append((time.perf_counter() - wall) / (time.thread_time() - cpu))
    return min(ratios)


def health_bound(ctl: Controller, probes: int = 10) -> float:
    """HEALTH_BOUND_S on a quiet machine: one where an unattacked /healthz takes at most QUIET_HEALTH_S (its
    median) and CPU-bound work runs at full speed; on a loaded one the bound grows by as much as either is slower
    (the machine's load, never the attack's)."""
    seconds = sorted(healthz_seconds(ctl) or 30.0 for _ in range(probes))
    return HEALTH_BOUND_S * max(1.0, seconds[probes // 2] / QUIET_HEALTH_S, machine_slowdown())


@contextmanager
def stays_responsive(ctl: Controller) -> Iterator[Prober]:
    """Every /healthz during the block answered, each within the bound (see health_bound): a lock-out shows as
    refused or reset connections, a freeze as seconds."""
    bound = health_bound(ctl)
    prober = Prober(ctl)
    prober.start()
    try:
        yield prober
        prober.probe_more(3)  # the attack is still in place here: the held connections close after the block
    finally:
        prober.stopping.set()
        prober.join(timeout=30)
    assert len(prober.latencies) >= 3, prober.latencies
    assert None not in prober.latencies, prober.latencies
    assert max(t for t in prober.latencies if t is not None) < bound, (bound, prober.latencies)


def still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def settled_open(held: list[socket.socket], at_most: int, within_s: float = 5.0) -> int:
    """How many of `held` are still open once the server's closes have arrived (they travel as the answers
    do: wait until at most `at_most` are open, or `within_s`)."""
    deadline = time.monotonic() + within_s
    while (count := sum(still_open(s) for s in held)) > at_most and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


# --- the probes ----------------------------------------------------------------------------------------

LOGIN_HEAD = (b"POST /login HTTP/1.1\r\nHost: fleet\r\nContent-Type: application/x-www-form-urlencoded\r\n"
              b"Content-Length: 4000\r\n\r\n")


def flood_login(ctl: Controller, sources: list[str], n: int) -> list[socket.socket]:
    held = []
    for i in range(n):
        try:
            sock = connect(ctl, sources[i % len(sources)])
            sock.sendall(LOGIN_HEAD)
        except OSError:
            continue  # refused or reset: the server let this one go
        held.append(sock)
    return held


def test_515_login_heads_without_a_body_lock_no_one_out(controller: Controller) -> None:
    register(controller, "rtx4090-0-calm01", "51001")
    held: list[socket.socket] = []
    try:
        with stays_responsive(controller):
            held += flood_login(controller, ["127.0.0.2"], 515)
            assert worker_round(controller, "rtx4090-0-calm01") < WORKER_BOUND_S
            # One address holds at most its share of unauthenticated connections; the rest were closed.
            assert settled_open(held, 64) <= 64
            held += flood_login(controller, [f"127.0.0.{i}" for i in range(3, 12)], 515)
            assert worker_round(controller, "rtx4090-0-calm01") < WORKER_BOUND_S
            assert settled_open(held, 512) <= 512
            # The page still serves its operator (a token in a header: no form, no session needed).
            page = httpx.get(f"{controller.url}/status.json", headers={"Authorization": f"Bearer {READ}"}, timeout=30)
            assert page.status_code == 200
    finally:
        for sock in held:
            sock.close()


def test_one_token_cannot_hold_the_open_files(controller: Controller) -> None:
    register(controller, "rtx4090-0-hold01", "51002")
    register(controller, "rtx4090-0-calm02", "51003")
    request = (f"GET /api/v1/instances/rtx4090-0-hold01/directive HTTP/1.1\r\nHost: fleet\r\n"
               f"Authorization: Bearer {token('rtx4090-0-hold01')}\r\n\r\n").encode()
    held: list[socket.socket] = []
    try:
        with stays_responsive(controller):
            for _ in range(277):
                try:
                    sock = connect(controller, "127.0.0.2")
                    sock.sendall(request)
                    assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")  # answered, kept alive
                except OSError:
                    continue
                held.append(sock)
            assert len(held) == 277
            assert settled_open(held, 16) <= 16  # the token's share; its oldest gave way
            assert worker_round(controller, "rtx4090-0-calm02") < WORKER_BOUND_S
    finally:
        for sock in held:
            sock.close()


def test_many_tokens_cannot_exhaust_the_open_files_either(controller: Controller) -> None:
    """277 workers with one keep-alive connection each, past what 300 open files leave for connections: the
    oldest idle ones give way, the server never fails to accept."""
    held: list[socket.socket] = []
    try:
        with stays_responsive(controller):
            for i in range(277):
                iid = f"rtx4090-9-many{i:03d}"
                sock = connect(controller, f"127.0.1.{i % 200 + 1}")
                sock.sendall((f"GET /api/v1/instances/{iid}/directive HTTP/1.1\r\nHost: fleet\r\n"
                              f"Authorization: Bearer {token(iid)}\r\n\r\n").encode())
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
                held.append(sock)
            assert settled_open(held, OPEN_FILES - 64) <= OPEN_FILES - 64
            assert worker_round(controller, "rtx4090-0-calm01") < WORKER_BOUND_S
    finally:
        for sock in held:
            sock.close()


def _costliest_line() -> str:
    """The fragment that costs the redactor most, repeated to 4,096 characters."""
    fragments = {t for p in PATTERNS for t in p.triggers} | {"token.", "a://b:", "mysql ", "sshpass "}
    best = (0.0, "token.")
    for fragment in fragments:
        line = (fragment * (4096 // len(fragment) + 1))[:4096]
        start = time.thread_time()
        for p in PATTERNS:
            p.regex.sub(p.replacement, line)
        best = max(best, (time.thread_time() - start, fragment))
    return (best[1] * (4096 // len(best[1]) + 1))[:4096]


def test_redactor_bombs_do_not_freeze_the_controller(controller: Controller) -> None:
    register(controller, "rtx4090-0-bomb01", "51004")
    token_lines = {"protocol": 1, "lines": [("token." * 256)[:1536]] * 4}  # the 6 KiB body: 6.6 s before
    worst = {"protocol": 1, "lines": [_costliest_line()] * 62}  # just under 256 KiB
    errors: list[BaseException] = []

    def bomb(body: dict[str, object]) -> None:
        try:
            for _ in range(4):
                post(controller, "rtx4090-0-bomb01", "logs", body)
        except BaseException as exc:
            errors.append(exc)

    with stays_responsive(controller):
        bombers = [threading.Thread(target=bomb, args=(b,)) for b in (token_lines, worst, token_lines, worst)]
        for t in bombers:
            t.start()
        assert worker_round(controller, "rtx4090-0-calm01") < WORKER_BOUND_S
        for t in bombers:
            t.join(timeout=WAIT_S)
    assert errors == []


# --- escapes, forged lines, secrets ----------------------------------------------------------------------

PEM_BODY = ["MIIEpAIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7Lqxvz6fTQ9bZcQq7",
            "Q7hostileKeyLastLine0123=="]
SECRETS = {
    "aws": "Q7wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY",
    "sshpass": "Q7Tr0ub4dor3",
    "mysql": "Q7S3cr3tPw0rd",
    "url": "Q7p@ss/w:rd",
    "gitlab": "glpat-Q7bCdEfGhIjKlMnOpQrSt",
    "openai": "sk-proj-Q7bCdEfGhIjKlMnOpQrStUvWxYz0123",
    "google": "AIzaSyQ7bCdEfGhIjKlMnOpQrStUvWxYz012345",
    "pem": PEM_BODY[1],
}
HOSTILE_LINES = [
    "copy \x1b]52;c;ZWNobyBwd25lZCB8IHNo\x1b\\ done",  # OSC 52 clipboard write, ST-terminated
    "\x1b]0;fleet: all machines ok\x07title set",  # OSC title
    "\x1b[2J\x1b[31mred\x1b[0m \x9b1m c1-csi",
    "evil \u202etxt.exe \u2066isolated\u2069",
    "progress 10%\rFleet-Verdict: ok",
    "one line\nFleet-Verdict: ok\nFleet-Machine: 11111",
    f"+ aws configure set aws_secret_access_key {SECRETS['aws']}",
    f"+ sshpass -p {SECRETS['sshpass']} ssh root@10.0.0.5 nvidia-smi",
    f"+ mysql -h db -u root -p{SECRETS['mysql']} fleet",
    f"fetching postgresql://fleet:{SECRETS['url']}@db.internal:5432/fleetdb",
    f"using {SECRETS['gitlab']} and {SECRETS['openai']} and {SECRETS['google']}",
    "-----BEGIN RSA PRIVATE KEY-----",
    PEM_BODY[0],
]
#: The error the benchmark "fails" with: it becomes the verdict's cause, in the commit subject and body.
CAUSE = "Error: proving failed \x1b]52;c;cm0gLXJmIH4=\x07 \u202e\nFleet-Verdict: ok\nFleet-Machine: 11111"


def _commit_text(origin: Path) -> str:
    """Every commit message, every file of every commit: all git holds."""
    log = git(origin, "log", "--all", "-p", "--format=%H%n%B")
    return log + "\n" + "\n".join(git(origin, "show", f"HEAD:{path}")
                                   for path in git(origin, "ls-tree", "-r", "--name-only", "HEAD").split())


def _run(*argv: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "reconciler.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=WAIT_S, env={k: v for k, v in os.environ.items() if not k.startswith("FLEET_")})
    return done.stdout + done.stderr


def test_escapes_forged_lines_and_secrets_reach_neither_git_nor_a_terminal(controller: Controller,
                                                                           tmp_path: Path) -> None:
    iid, machine = "rtx4090-0-evil01", "51099"
    with stays_responsive(controller):
        register(controller, iid, machine, gpu_name="RTX 4090\nFleet-Machine: 11111\n\x1b]0;x\x07",
                 hostname="host\u202e\r\x1b[2J")
        post(controller, iid, "logs", {"protocol": 1, "lines": HOSTILE_LINES})  # the key's BEGIN and first line
        post(controller, iid, "logs", {"protocol": 1, "lines": [PEM_BODY[1], "-----END RSA PRIVATE KEY-----",
                                                                 "fleet-worker: benchmark starting"]})
        post(controller, iid, "events", {"protocol": 1, "phase": "benchmark", "status": "failed",
                                         "at": "2026-12-02T18:30:00Z", "exit_code": 1, "message": CAUSE,
                                         "log_tail": [CAUSE, *HOSTILE_LINES[:6]]})
        post(controller, iid, "result", {
            "protocol": 1, "outcome": "error", "at": "2026-12-02T18:31:00Z", "started_at": "2026-12-02T18:20:00Z",
            "exit_code": 1, "requested": 10, "completed": 0, "failed": 0, "log_tail": [*HOSTILE_LINES[:6], CAUSE]})
        deadline = time.monotonic() + WAIT_S
        while f"Fleet-Machine: {machine}" not in git(controller.origin, "log", "--format=%B", "main"):
            assert time.monotonic() < deadline, "no pass committed the hostile worker's verdict"
            time.sleep(0.5)
    in_git = _commit_text(controller.origin)
    assert not RAW_CONTROL.search(in_git.replace("\t", "")), RAW_CONTROL.search(in_git.replace("\t", ""))
    for name, secret in SECRETS.items():
        assert secret not in in_git, name
    # Trailer-shaped text from the worker never stands as a line of its own.
    assert git(controller.origin, "log", "--all", "--format=%H", "--grep=^Fleet-Machine: 11111$") == ""
    assert git(controller.origin, "log", "--all", "--format=%H", "--grep=^Fleet-Verdict: ok$") == ""
    assert "\\x1b]52;c;" in in_git  # the evidence still shows what the worker printed, as text
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "--quiet", str(controller.origin), str(clone))
    shown = {
        "fleet why": _run("why", machine, "--repo", str(clone), "--tail", "50", cwd=clone),
        "fleet status": _run("status", "--spec-dir", str(clone / "fleet-spec"), "--controller-db",
                             str(controller.tmp / "controller.db"), "--all", cwd=clone),
        "PR comment": _run("plan", "--spec", str(clone / "fleet-spec" / "fleet.yaml"), "--state-dir",
                           str(tmp_path / "state"), "--format", "markdown", "--image-digest", "sha256:" + "ab" * 32,
                           cwd=clone),
        "page": httpx.get(f"{controller.url}/", headers={"Authorization": f"Bearer {READ}"}, timeout=30).text,
        "status.json": httpx.get(f"{controller.url}/status.json", headers={"Authorization": f"Bearer {READ}"},
                                 timeout=30).text,
        "api": json.dumps(httpx.get(f"{controller.url}/api/instances/{iid}", timeout=30,
                                    headers={"Authorization": f"Bearer {ADMIN}"}).json(), ensure_ascii=False),
    }
    assert machine in shown["fleet why"] and iid in shown["fleet status"], shown
    for where, text in shown.items():
        assert not RAW_CONTROL.search(text.replace("\t", "")), (where, RAW_CONTROL.search(text.replace("\t", "")))
        for name, secret in SECRETS.items():
            assert secret not in text, (where, name)
        lines = text.splitlines()
        assert "Fleet-Machine: 11111" not in lines and not any(x.startswith("Fleet-Verdict: ok") for x in lines), where
