"""Several controller processes on one port: `fleet controller serve --workers N`.

Where it sits: the shell around `ControllerServer` when one core is not enough. One Python process parses,
validates and redacts on one core at a time (the GIL), and that CPU work, not SQLite, bounds ingest. This
process serves as before and starts N-1 worker processes (`python -m reconciler.adapters.controller.processes`),
each with its own `ControllerStore` connection to the same SQLite file and its own listening socket bound to
the same port with SO_REUSEPORT; the kernel spreads new connections over the N sockets.

Why that is correct: the API keeps no state between requests that is not in SQLite.
- Auth: worker tokens are an HMAC of the instance id (the same secret everywhere); the admin token is
  configuration. Nothing to share.
- Replays, deduplication, the event limit, the log ring, the once-only result, "destroyed": decided inside
  each write transaction from the rows (UNIQUE fingerprints, counters read in the same transaction), and
  SQLite lets one writer at a time (WAL; the store's write lock makes them take turns without sleeping).
- Slowloris cap: per process, each holds `max_unauthenticated // N`, so the total stays the configured cap.
- Directives and the read API read SQLite. Routes that keep state in memory (the live page, /metrics,
  webhooks of `fleet reconcile --listen`) are refused with more than one process.
Config (secret and admin token included) reaches a worker process on its stdin, never in argv or the
environment; its stdin staying open is its lease: EOF (this process died) makes it stop. A worker that dies
is restarted (`restart_delay` after quick consecutive failures). Workers inherit the environment, so their
store redacts the same known secrets as this one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from reconciler.adapters.controller.protocol import MAX_BODY_BYTES
from reconciler.adapters.controller.server import ControllerServer, EdgeLimits
from reconciler.adapters.store import ControllerStore

log = logging.getLogger(__name__)

READY_PREFIX = "listening "
#: A worker that ran at least this long before dying is restarted at once.
STABLE_AFTER_S = 10.0


def default_workers() -> int:
    """One process per CPU this process may run on (at most 8): the work per request is CPU-bound."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return max(1, min(usable, 8))


def backoff_delay(quick_failures: int) -> float:
    """Seconds before restarting a worker that died `quick_failures` times in a row soon after starting."""
    return 0.0 if quick_failures <= 1 else min(30.0, 0.5 * 2 ** (quick_failures - 2))


@dataclass(frozen=True)
class ServeConfig:
    """Everything a controller process needs; the same for every process of one controller."""

    db: Path
    secret: bytes
    admin_token: str | None
    host: str = "127.0.0.1"
    port: int = 0
    ring_lines: int = 5000
    allow_open_reads: bool = False
    require_machine_claim: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    limits: EdgeLimits = field(default_factory=EdgeLimits)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    log_level: str = "INFO"

    def to_json(self) -> str:
        doc = asdict(self)
        doc.update(db=str(self.db), secret=self.secret.hex(),
                   tls_cert=None if self.tls_cert is None else str(self.tls_cert),
                   tls_key=None if self.tls_key is None else str(self.tls_key))
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        doc = json.loads(text)
        return cls(**{**doc, "db": Path(doc["db"]), "secret": bytes.fromhex(doc["secret"]),
                      "limits": EdgeLimits(**doc["limits"]),
                      "tls_cert": None if doc["tls_cert"] is None else Path(doc["tls_cert"]),
                      "tls_key": None if doc["tls_key"] is None else Path(doc["tls_key"])})


def build_server(config: ServeConfig, store: ControllerStore, *, reuse_port: bool,
                 extra_routes: Iterable[Any] = ()) -> ControllerServer:
    return ControllerServer(store, config.secret, config.admin_token, config.host, config.port,
                            allow_open_reads=config.allow_open_reads, max_body_bytes=config.max_body_bytes,
                            require_machine_claim=config.require_machine_claim, limits=config.limits,
                            tls_cert=config.tls_cert, tls_key=config.tls_key, extra_routes=extra_routes,
                            reuse_port=reuse_port)


@dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    started: float
    quick_failures: int = 0


class ControllerProcesses:
    """This process's ControllerServer plus `workers - 1` worker processes on the same port (see module doc).
    `store` is this process's store (the caller may share it, e.g. with a reconcile loop)."""

    def __init__(self, config: ServeConfig, store: ControllerStore, workers: int, *,
                 extra_routes: Iterable[Any] = (), python: str = sys.executable, start_timeout_s: float = 60.0,
                 restart_delay: Callable[[int], float] = backoff_delay,
                 monotonic: Callable[[], float] = time.monotonic):
        routes = list(extra_routes)
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if workers > 1 and routes:
            raise ValueError("routes beside the controller API (live page, /metrics) keep state in one process: "
                             "they cannot be served by several worker processes")
        self.workers = workers
        limits = config.limits
        if workers > 1:  # the cap on unauthenticated connections is shared out: the total stays the same
            limits = replace(limits, max_unauthenticated=max(1, limits.max_unauthenticated // workers))
        self.config = replace(config, limits=limits)
        self.store = store
        self.server = build_server(self.config, store, reuse_port=workers > 1, extra_routes=routes)
        self._python = python
        self._start_timeout_s = start_timeout_s
        self._restart_delay = restart_delay
        self._monotonic = monotonic
        self._children: list[_Worker] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._supervisor: threading.Thread | None = None
        #: How many worker processes were restarted after dying (tests and logs).
        self.restarts = 0
        self.restarted = threading.Condition()

    @property
    def url(self) -> str:
        return self.server.url

    def pids(self) -> list[int]:
        """Process ids serving: this one first, then the workers."""
        with self._lock:
            return [os.getpid(), *(w.process.pid for w in self._children)]

    def start(self) -> ControllerProcesses:
        self.server.start()
        self.config = replace(self.config, port=self.server.bound_port)  # port 0: the workers join the one picked
        try:
            for _ in range(self.workers - 1):
                worker = self._spawn()
                with self._lock:
                    self._children.append(worker)
        except BaseException:
            self.stop()
            raise
        if self.workers > 1:
            self._supervisor = threading.Thread(target=self._supervise, name="controller-workers", daemon=True)
            self._supervisor.start()
        return self

    def _spawn(self) -> _Worker:
        process = subprocess.Popen([self._python, "-m", "reconciler.adapters.controller.processes"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(self.config.to_json().encode() + b"\n")
            process.stdin.flush()  # stdin stays open: the worker's lease on this process
            line = _read_line(process.stdout, self._start_timeout_s)
        except OSError as exc:
            line = f"({exc})"
        if not line.startswith(READY_PREFIX):
            _terminate(process, 5.0)
            raise OSError(f"controller worker process did not start (exit status {process.poll()}; said {line!r}); "
                          "its error is on stderr")
        log.info("controller worker process %d listening on %s", process.pid, line[len(READY_PREFIX):])
        return _Worker(process, self._monotonic())

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                pipes = {w.process.stdout.fileno(): w for w in self._children if w.process.stdout is not None}
            readable, _, _ = select.select([*pipes, self._wake_r], [], [])
            for fd in readable:
                if fd == self._wake_r or self._stopping.is_set():
                    continue
                if os.read(fd, 4096):  # anything but EOF: ignore (workers print one line)
                    continue
                self._replace(pipes[fd])

    def _replace(self, dead: _Worker) -> None:
        status = dead.process.wait()
        lived = self._monotonic() - dead.started
        quick = dead.quick_failures + 1 if lived < STABLE_AFTER_S else 1
        log.error("controller worker process %d exited with status %s after %.1f s; restarting it",
                  dead.process.pid, status, lived)
        _close_pipes(dead.process)
        with self._lock:
            self._children.remove(dead)
        while not self._stopping.wait(self._restart_delay(quick)):
            try:
                worker = self._spawn()
            except OSError as exc:
                log.error("%s", exc)
                quick += 1
                continue
            worker.quick_failures = quick
            with self._lock:
                self._children.append(worker)
            with self.restarted:
                self.restarts += 1
                self.restarted.notify_all()
            return

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=30)
        self.server.stop()
        with self._lock:
            children, self._children = self._children, []
        for worker in children:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
        for worker in children:
            _terminate(worker.process, self.config.limits.graceful_shutdown_s + 10)
            _close_pipes(worker.process)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> ControllerProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_line(stream: IO[bytes], timeout_s: float) -> str:
    """One line from a child's stdout within `timeout_s` ('' on EOF or timeout)."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([stream], [], [], remaining)[0]:
            break
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace").strip()


def _terminate(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _close_pipes(process: subprocess.Popen[bytes]) -> None:
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def worker_main() -> int:
    """A worker process: config from stdin, serve until SIGTERM/SIGINT or until stdin closes."""
    line = b""
    while not line.endswith(b"\n") and (chunk := os.read(0, 1)):  # byte by byte: nothing past the line is buffered
        line += chunk
    config = ServeConfig.from_json(line.decode("utf-8"))
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def lease() -> None:  # raw reads of fd 0: a buffered reader's lock would abort interpreter shutdown
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        stop.set()

    store = ControllerStore(config.db, ring_lines=config.ring_lines)
    server = build_server(config, store, reuse_port=True)
    try:
        server.start()
        threading.Thread(target=lease, name="lease", daemon=True).start()
        print(READY_PREFIX + server.url, flush=True)
        stop.wait()
    finally:
        server.stop()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
