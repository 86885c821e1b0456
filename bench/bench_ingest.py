"""Controller ingest on loopback: events/s (one per request and in batches) and log lines/s accepted by real
controllers, on each store.

Two deployments, each started as an operator would (`fleet controller serve`):
- SQLite: the embedded default, one controller process over one SQLite file (WAL).
- PostgreSQL: two replica processes (`--db postgresql://...`) on two ports sharing one PostgreSQL server that the
  bench starts on this machine (tests/postgres_server.py; durability as SQLite's synchronous=NORMAL: a commit is
  written to the OS before it is acknowledged, so a killed server loses nothing, and not fsynced, so an OS crash
  may lose the last commits). Each client process spreads its connections evenly over the two replicas (a load
  balancer's job in production).
Two reference rows repeat the SQLite event figures with the httpx client and one the single events with 8
connections instead of 32 (how runs before 2026-12-03 12:35 measured; see CONNECTIONS_PER_PROCESS). Controller
CPU is the sum over its processes; the PostgreSQL server's own CPU is a column of its own.
Two client processes post over HTTP/1.1 keep-alive, one connection per simulated worker (one instance and its own
token per connection; 16 per client process), each connection with exactly one request outstanding: its next
request is sent when its answer is in. Every request is a complete ingest: token check, schema validation,
redaction, one transaction committed before the answer (requests that arrive together share it: group commit);
one event per request in the single-event phases. Only 200 answers are counted. Each phase is bounded by a request
count per connection and a deadline.

Clients: the controllers, PostgreSQL and the clients share this machine's 2 cores, while real workers are curl
processes on their own machines, so the clients' CPU here is an artifact of the bench. httpx spends
~0.8-1 ms of CPU per request, more than the controller does, so with httpx the figure says as much about
httpx as about the controller. The main figures therefore use `KeepAliveClient`, a minimal HTTP/1.1 client
on a raw socket driven as wrk drives its connections: one thread per client process waits on all its
connections at once (epoll) and answers each one's response with its next request, and the bytes of each
connection's first requests are encoded before the timed start (`PREBUILT_ITEMS`; any later ones as they
are sent). CPU per request of the controller and of the clients is in every detail column, so no figure hides
where the time went.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.common import POSTGRES_SETTINGS, Figure
from reconciler.domain.tokens import instance_token, machine_claim
from tests.postgres_server import PostgresServer

SECRET = b"bench-controller-secret-0123456789"
CLIENT_PROCESSES = 2
#: Keep-alive connections (simulated workers) per client process: 32 in all. With 8 (until 2026-12-03 12:35,
#: still a reference row) the kernel's SO_REUSEPORT hash split them 5/3, 5/3, 2/6, 5/3 over two controller
#: processes in four runs, so the figure measured that draw more than the controller; a real fleet has
#: thousands of connections, spread evenly.
CONNECTIONS_PER_PROCESS = 16
#: The httpx phases use a thread per connection (httpx's CPU per request would otherwise be the figure).
HTTPX_THREADS_PER_PROCESS = 4
PHASE_SECONDS = 6.0
MAX_REQUESTS_PER_CONNECTION = 20_000
#: Events or log lines per connection whose requests the raw client encodes before the timed start (single
#: events: enough for ~330 requests/s per connection, ~10,000/s in all, over a phase); later ones as sent.
PREBUILT_ITEMS = 2_000
LOG_BATCH_LINES = 100
EVENT_BATCH_SIZE = 20
#: Issue 14's targets for one SQLite process on loopback (issue 24 keeps them after the multi-process SQLite
#: machinery was removed): one event per request, and events in batches.
TARGET_SINGLE_EVENTS_PER_S = 5_000
TARGET_BATCHED_EVENTS_PER_S = 20_000
#: Issue 24's targets for two replicas on PostgreSQL: this share of the SQLite figure of the same run, and at
#: least this many single events/s (40x a 10,000-machine fleet's heartbeat rate).
TARGET_POSTGRES_SHARE = 0.5
TARGET_POSTGRES_SINGLE_EVENTS_PER_S = 2_000
#: Each phase runs this many times; the figure is the median run (the others are in its detail).
REPEATS = 3
SQLITE, POSTGRES = "sqlite", "postgres"
#: Controller processes of each deployment.
REPLICAS = {SQLITE: 1, POSTGRES: 2}

LOG_LINES = (
    "[#26a862 38GiB/56GiB(67%) CN:16 DL:408MiB ETA:46s]",
    "cuzk-daemon: synthesis partition 3/10 done in 4.1s",
    "  [4/10] ok — 37.9s",
    "fleet-worker: GET https://proofs.example/v28-stacked.params -> 206 (Authorization: Bearer abcdef0123456789)",
    "gpu 0: 71C 348W 23.1GiB/24.0GiB util 99%",
)


@dataclass(frozen=True)
class Phase:
    name: str
    client: str  # "raw" (KeepAliveClient) or "httpx"
    per_request: int  # events or log lines per request
    body: Callable[[int], dict[str, Any]]  # request number -> JSON body
    action: str  # events | logs
    #: Which store the controllers use (SQLITE: one process; POSTGRES: two replicas).
    deployment: str = SQLITE
    #: Connections (simulated workers) per client process.
    connections: int = CONNECTIONS_PER_PROCESS


def progress_event(k: int) -> dict[str, Any]:
    """The k-th params progress event of a worker (distinct k, distinct event: nothing is a duplicate)."""
    return {"protocol": 1, "phase": "params", "status": "progress",
            "at": f"2026-12-02T{k // 3600 % 24:02d}:{k // 60 % 60:02d}:{k % 60:02d}Z",
            "message": f"{k} of 56 GiB", "details": {"done_bytes": k * 1_048_576, "total_bytes": 60_129_542_144}}


def event_batch(n: int) -> dict[str, Any]:
    return {"protocol": 1, "events": [progress_event(n * EVENT_BATCH_SIZE + i) for i in range(EVENT_BATCH_SIZE)]}


def log_batch(n: int) -> dict[str, Any]:
    return {"protocol": 1, "lines": [f"{n}.{i} {LOG_LINES[i % len(LOG_LINES)]}" for i in range(LOG_BATCH_LINES)]}


PHASES = (
    Phase("events", "raw", 1, progress_event, "events"),
    Phase("event batches", "raw", EVENT_BATCH_SIZE, event_batch, "events"),
    Phase("log lines", "raw", LOG_BATCH_LINES, log_batch, "logs"),
    Phase("events (httpx client)", "httpx", 1, progress_event, "events", connections=HTTPX_THREADS_PER_PROCESS),
    Phase("event batches (httpx client)", "httpx", EVENT_BATCH_SIZE, event_batch, "events",
          connections=HTTPX_THREADS_PER_PROCESS),
    Phase("events (8 connections)", "raw", 1, progress_event, "events", connections=4),
    Phase("events (PostgreSQL, 2 replicas)", "raw", 1, progress_event, "events", deployment=POSTGRES),
    Phase("event batches (PostgreSQL, 2 replicas)", "raw", EVENT_BATCH_SIZE, event_batch, "events",
          deployment=POSTGRES),
    Phase("log lines (PostgreSQL, 2 replicas)", "raw", LOG_BATCH_LINES, log_batch, "logs", deployment=POSTGRES),
)


class KeepAliveClient:
    """POST JSON over one HTTP/1.1 keep-alive connection; reconnects when the server closes. Enough HTTP for
    this bench (Content-Length bodies), nothing more. `send` waits for the answer; `start` + `answer` let one
    thread drive several connections (see `_raw_connections`), each with one request outstanding."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self._address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._connect()

    def _connect(self) -> None:
        self.sock = socket.create_connection(self._address, timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def close(self) -> None:
        self.sock.close()

    @staticmethod
    def request(path: str, authorization: str, doc: Any) -> bytes:
        """The bytes of one POST of `doc` as JSON."""
        body = json.dumps(doc).encode()
        return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: {authorization}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    def post(self, path: str, authorization: str, doc: Any) -> int:
        return self.send(self.request(path, authorization, doc))

    def send(self, request: bytes) -> int:
        """Send one complete request and return its answer's status."""
        self.start(request)
        while (status := self.answer()) is None:
            pass
        return status

    def start(self, request: bytes) -> None:
        self.sock.sendall(request)

    def answer(self) -> int | None:
        """Read what has arrived (one recv: it blocks only if nothing has); the status once the whole
        answer is in (its body is dropped), else None."""
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the controller closed the connection in the middle of an answer")
        buffer = self._buffer = self._buffer + chunk
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = buffer[:end].lower()
        length = 0
        if (at := head.find(b"\r\ncontent-length:")) >= 0:
            line_end = head.find(b"\r\n", at + 2)
            length = int(head[at + 17:line_end if line_end >= 0 else len(head)])
        if len(buffer) < end + 4 + length:
            return None
        self._buffer = buffer[end + 4 + length:]
        if b"\r\nconnection: close" in head:
            self.close()
            self._connect()
        return int(head.split(b" ", 2)[1])


class HttpxClient:
    """The same interface over httpx (how workers' Python tooling and the earlier runs posted)."""

    def __init__(self, url: str):
        self._client = httpx.Client(base_url=url, timeout=30)

    def close(self) -> None:
        self._client.close()

    def post(self, path: str, authorization: str, doc: Any) -> int:
        return self._client.post(path, json=doc, headers={"Authorization": authorization}).status_code


def _register(url: str, iid: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        r = client.post(f"/api/v1/instances/{iid}/register", headers={"Authorization": f"Bearer "
                                                                    f"{instance_token(SECRET, iid)}"},
                        json={"protocol": 1, "instance_id": iid, "at": "2026-12-02T18:00:00Z", "pool": "rtx4090-a",
                              "slot": "rtx4090-a-0", "machine_id": "41001",
                              "machine_claim": machine_claim(SECRET, iid, "41001"), "host_id": "501",
                              "gpu_name": "RTX 4090", "image_digest": "sha256:" + "a1" * 32})
        r.raise_for_status()


def _worker(iid: str, phase: Phase) -> tuple[str, str]:
    """(path, Authorization header) of a simulated worker's instance."""
    return f"/api/v1/instances/{iid}/{phase.action}", f"Bearer {instance_token(SECRET, iid)}"


def _httpx_thread(url: str, iid: str, phase: Phase, start_at: float, deadline: float, out: list[int]) -> None:
    path, authorization = _worker(iid, phase)
    accepted = 0
    client = HttpxClient(url)
    try:
        while time.time() < start_at:
            time.sleep(0.001)
        for n in range(MAX_REQUESTS_PER_CONNECTION):
            if time.time() >= deadline:
                break
            accepted += phase.per_request if client.post(path, authorization, phase.body(n)) == 200 else 0
    finally:
        client.close()
    out.append(accepted)


def _raw_connections(urls: list[str], ids: list[str], phase: Phase, start_at: float, deadline: float) -> int:
    """One thread drives one keep-alive connection per instance, as wrk does: each connection has exactly
    one request outstanding, and its next one is sent when its answer is in. The first requests of each
    connection are encoded before the start; any further ones as they are sent. Connection i goes to
    urls[i % len(urls)] (the replicas share the connections evenly)."""
    workers = [_worker(iid, phase) for iid in ids]
    prebuilt = [[KeepAliveClient.request(path, authorization, phase.body(n))
                 for n in range(min(PREBUILT_ITEMS // phase.per_request, MAX_REQUESTS_PER_CONNECTION))]
                for path, authorization in workers]
    clients = [KeepAliveClient(urls[i % len(urls)]) for i in range(len(ids))]
    sent = [0] * len(ids)
    accepted = 0
    selector = selectors.DefaultSelector()

    def send_next(i: int) -> None:
        n = sent[i]
        if n >= MAX_REQUESTS_PER_CONNECTION or time.time() >= deadline:
            return
        sent[i] += 1
        clients[i].start(prebuilt[i][n] if n < len(prebuilt[i]) else
                         KeepAliveClient.request(*workers[i], phase.body(n)))
        selector.register(clients[i].sock, selectors.EVENT_READ, i)

    try:
        while time.time() < start_at:
            time.sleep(0.001)
        for i in range(len(clients)):
            send_next(i)
        while selector.get_map():
            for key, _ in selector.select():
                i = key.data
                status = clients[i].answer()
                if status is None:
                    continue
                selector.unregister(key.fileobj)  # (a closing answer replaced the socket)
                accepted += phase.per_request if status == 200 else 0
                send_next(i)
    finally:
        selector.close()
        for client in clients:
            client.close()
    return accepted


def _client_process(urls: list[str], ids: list[str], phase_number: int, start_at: float, deadline: float
                    ) -> tuple[int, float, float]:
    """(items accepted, end time, CPU seconds this client process spent)."""
    phase = PHASES[phase_number]
    before = resource.getrusage(resource.RUSAGE_SELF)
    if phase.client == "raw":
        accepted = _raw_connections(urls, ids, phase, start_at, deadline)
    else:
        counts: list[int] = []
        threads = [threading.Thread(target=_httpx_thread,
                                    args=(urls[i % len(urls)], iid, phase, start_at, deadline, counts))
                   for i, iid in enumerate(ids)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        accepted = sum(counts)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return accepted, time.time(), (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def _cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (Linux /proc; a process gone meanwhile counts 0), to report CPU cost per
    request independent of contention."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _server_pids(server: PostgresServer | None) -> list[int]:
    """The postmaster and every process it started (backends, WAL writer, checkpointer): the database's CPU."""
    if server is None:
        return []
    postmaster = server.postmaster_pid()
    if postmaster is None:
        return []
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == postmaster:
                children.append(int(entry))
    return [postmaster, *children]


@dataclass(frozen=True)
class Run:
    accepted: int
    elapsed: float
    controller_cpu: float
    database_cpu: float
    client_cpu: float
    load: float

    @property
    def rate(self) -> float:
        return self.accepted / self.elapsed


def _figure(phase: Phase, run: Run, sqlite_rates: dict[tuple[int, str], float]) -> Figure:
    rate, accepted = run.rate, run.accepted
    requests = max(accepted // phase.per_request, 1)
    client = "raw keep-alive client" if phase.client == "raw" else "httpx client"
    replicas = REPLICAS[phase.deployment]
    processes = ("1 controller process (SQLite)" if phase.deployment == SQLITE else
                 f"{replicas} controller replicas on PostgreSQL (PostgreSQL CPU "
                 f"{run.database_cpu / requests * 1e6:,.0f} us/request)")
    shape = f"{phase.connections} connections" if phase.client == "raw" else f"{phase.connections} threads"
    cost = (f"{processes}; clients {CLIENT_PROCESSES} processes x {shape}, {client},"
            f" {run.elapsed:.1f} s; controller CPU {run.controller_cpu / requests * 1e6:,.0f} us/request (all "
            f"processes) (= {requests / max(run.controller_cpu, 1e-9):,.0f} requests per CPU-second), clients"
            f" {run.client_cpu / requests * 1e6:,.0f} us/request")
    if phase.deployment == POSTGRES:
        what = {"logs": "log lines", "events": "events in batches" if phase.per_request > 1 else
                "events, one per request"}[phase.action]
        unit = "lines/s" if phase.action == "logs" else "events/s"
        reference = sqlite_rates.get((phase.per_request, phase.action))
        share = rate / reference if reference else 0.0
        floor = TARGET_POSTGRES_SINGLE_EVENTS_PER_S if phase.per_request == 1 else 0
        detail = (f"{accepted:,} accepted ({rate / phase.per_request:,.0f} requests/s); "
                  f"{share:.2f}x the SQLite figure of this run; {cost}")
        if phase.action == "logs":
            return Figure(f"PostgreSQL, 2 replicas: {what}", rate, unit, detail)
        target = f">= {TARGET_POSTGRES_SHARE}x SQLite" + (f" and >= {floor:,} events/s" if floor else "")
        return Figure(f"PostgreSQL, 2 replicas: {what}", rate, unit, detail, target=target,
                      passed=share >= TARGET_POSTGRES_SHARE and rate >= floor)
    if phase.action == "logs":
        return Figure("controller ingest: log lines", rate, "lines/s",
                      f"{accepted:,} lines accepted in batches of {phase.per_request} "
                      f"({rate / phase.per_request:,.0f} batches/s); {cost}; redacted on ingest")
    if phase.client == "httpx":  # context: the same load from a client that costs more than the controller
        shape = (f"batches of {phase.per_request} ({rate / phase.per_request:,.0f} requests/s)" if phase.per_request > 1
                 else "one event per request (how earlier runs measured)")
        return Figure(f"controller ingest: events {'in batches' if phase.per_request > 1 else 'one per request'}, "
                      "httpx client", rate, "events/s", f"{accepted:,} accepted; {cost}; {shape}")
    if phase.connections != CONNECTIONS_PER_PROCESS:  # the reference: the earlier shape, 8 connections
        return Figure(f"reference: events one per request, {phase.connections * CLIENT_PROCESSES} connections",
                      rate, "events/s", f"{accepted:,} accepted; {cost}; how runs before 2026-12-03 12:35 measured")
    if phase.per_request > 1:
        return Figure("controller ingest: events in batches", rate, "events/s",
                      f"{accepted:,} accepted in batches of {phase.per_request} "
                      f"({rate / phase.per_request:,.0f} requests/s); {cost}",
                      target=f">= {TARGET_BATCHED_EVENTS_PER_S:,} events/s",
                      passed=rate >= TARGET_BATCHED_EVENTS_PER_S)
    return Figure("controller ingest: events, one per request", rate, "events/s",
                  f"{accepted:,} accepted; {cost}; one event per request",
                  target=f">= {TARGET_SINGLE_EVENTS_PER_S:,} events/s", passed=rate >= TARGET_SINGLE_EVENTS_PER_S)


@dataclass
class Deployment:
    """The controller processes serving one store (and the PostgreSQL server, for that store)."""

    processes: list[subprocess.Popen[str]]
    urls: list[str]
    database: PostgresServer | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]


def _one_run(deployment: Deployment, number: int, phase: Phase, repeat: int, ctx: Any) -> Run:
    """One timed run of a phase."""
    # Fresh instances per run: every run starts from the same per-instance history.
    ids = [f"bench-{number}-{repeat}-{p}-{t:06x}" for p in range(CLIENT_PROCESSES)
           for t in range(phase.connections)]
    for i, iid in enumerate(ids):
        _register(deployment.urls[i % len(deployment.urls)], iid)
    start_at = time.time() + 1.0
    deadline = start_at + PHASE_SECONDS
    database_pids = _server_pids(deployment.database)
    cpu_before = _cpu_seconds(deployment.pids), _cpu_seconds(database_pids)
    with ctx.Pool(CLIENT_PROCESSES) as pool:
        parts = [ids[p * phase.connections:(p + 1) * phase.connections] for p in range(CLIENT_PROCESSES)]
        done = pool.starmap(_client_process, [(deployment.urls, part, number, start_at, deadline) for part in parts])
    # Backends that ended meanwhile are not counted (none do: the replicas' pools keep their connections).
    controller_cpu = _cpu_seconds(deployment.pids) - cpu_before[0]
    database_cpu = _cpu_seconds(database_pids) - cpu_before[1]
    elapsed = max(end for _, end, _ in done) - start_at
    return Run(sum(n for n, _, _ in done), elapsed, controller_cpu, database_cpu, sum(cpu for _, _, cpu in done),
               os.getloadavg()[0])


def _start_controller(db: str) -> tuple[subprocess.Popen[str], str]:
    """`fleet controller serve --db DB --port 0`, as an operator starts it; its URL from what it prints."""
    env = {**os.environ, "FLEET_CONTROLLER_SECRET": SECRET.decode(),
           "FLEET_ADMIN_TOKEN": "bench-admin-token-0123456789"}
    proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "controller", "serve", "--db", db, "--port", "0",
                             "--log-level", "warning"], stdout=subprocess.PIPE, text=True, cwd=os.getcwd(), env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    words = line.split()
    if len(words) < 4 or words[:3] != ["controller", "listening", "on"]:
        _stop_controller(proc)
        raise RuntimeError(f"controller did not start: {line!r}")
    return proc, words[3]


def _start(deployment: str, tmp: Path) -> Deployment:
    if deployment == SQLITE:
        proc, url = _start_controller(str(tmp / "controller.db"))
        return Deployment([proc], [url])
    server = PostgresServer(settings=POSTGRES_SETTINGS)
    server.start()
    started = Deployment([], [], server)
    try:
        uri = server.create_database("fleet_bench")
        for _ in range(REPLICAS[POSTGRES]):
            proc, url = _start_controller(uri)
            started.processes.append(proc)
            started.urls.append(url)
    except BaseException:
        _stop(started)
        raise
    return started


def _stop_controller(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout:
        proc.stdout.close()


def _stop(deployment: Deployment) -> None:
    for proc in deployment.processes:
        _stop_controller(proc)
    if deployment.database is not None:
        deployment.database.destroy()


def run() -> list[Figure]:
    figures = []
    sqlite_rates: dict[tuple[int, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        deployments: dict[str, Deployment] = {}
        try:
            ctx = multiprocessing.get_context("fork")
            for number, phase in enumerate(PHASES):
                if phase.deployment not in deployments:  # one store per deployment, shared by its phases
                    deployments[phase.deployment] = _start(phase.deployment, Path(tmp))
                runs = [_one_run(deployments[phase.deployment], number, phase, repeat, ctx)
                        for repeat in range(REPEATS)]
                runs.sort(key=lambda r: r.rate)
                median = runs[len(runs) // 2]
                if (phase.deployment, phase.client, phase.connections) == (SQLITE, "raw", CONNECTIONS_PER_PROCESS):
                    sqlite_rates[(phase.per_request, phase.action)] = median.rate
                figure = _figure(phase, median, sqlite_rates)
                spread = " / ".join(f"{r.rate:,.0f}" for r in runs)
                loads = " / ".join(f"{r.load:.1f}" for r in runs)
                figures.append(replace(figure, detail=f"median of {REPEATS} runs ({spread} {figure.unit}; 1-min load "
                                                      f"average {loads}); {figure.detail}"))
        finally:
            for deployment in deployments.values():
                _stop(deployment)
    return figures


if __name__ == "__main__":
    for f in run():
        print(f.name, "|", f.shown(), "|", f.detail, f.verdict())
