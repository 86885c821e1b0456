"""Controller ingest on loopback: events/s and log lines/s accepted by a real controller process.

The controller (ControllerStore on SQLite WAL + ControllerServer) runs in its own process, as in
production; client processes with several threads each post over HTTP/1.1 keep-alive (one httpx.Client
per thread, one instance per thread, each with its own token). Every request is a complete ingest:
token check, schema validation, redaction, one SQLite transaction. Only 200 answers are counted. Each
phase is bounded by a request count per thread and a deadline.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import Figure
from reconciler.tokens import instance_token

SECRET = b"bench-controller-secret-0123456789"
CLIENT_PROCESSES = 2
THREADS_PER_PROCESS = 4
PHASE_SECONDS = 6.0
MAX_REQUESTS_PER_THREAD = 20_000
LOG_BATCH_LINES = 100
TARGET_EVENTS_PER_S = 2_000

SERVER = """
import sys, signal, threading
from reconciler.controller import ControllerServer
from reconciler.store import ControllerStore
store = ControllerStore(sys.argv[1])
server = ControllerServer(store, sys.argv[2].encode(), None, "127.0.0.1", 0).start()
print(server.url, flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
server.stop()
store.close()
"""

LOG_LINES = (
    "[#26a862 38GiB/56GiB(67%) CN:16 DL:408MiB ETA:46s]",
    "cuzk-daemon: synthesis partition 3/10 done in 4.1s",
    "  [4/10] ok — 37.9s",
    "fleet-worker: GET https://proofs.example/v28-stacked.params -> 206 (Authorization: Bearer abcdef0123456789)",
    "gpu 0: 71C 348W 23.1GiB/24.0GiB util 99%",
)


def _register(url: str, iid: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        r = client.post(f"/api/v1/instances/{iid}/register", headers={"Authorization": f"Bearer "
                                                                    f"{instance_token(SECRET, iid)}"},
                        json={"protocol": 1, "instance_id": iid, "at": "2026-12-02T18:00:00Z", "pool": "rtx4090-a",
                              "slot": "rtx4090-a-0", "machine_id": "41001", "host_id": "501",
                              "gpu_name": "RTX 4090", "image_digest": "sha256:" + "a1" * 32})
        r.raise_for_status()


def _thread(url: str, iid: str, phase: str, start_at: float, deadline: float, out: list[int]) -> None:
    headers = {"Authorization": f"Bearer {instance_token(SECRET, iid)}"}
    accepted = 0
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        for n in range(MAX_REQUESTS_PER_THREAD):
            if time.time() >= deadline:
                break
            if phase == "events":
                doc: dict[str, Any] = {"protocol": 1, "phase": "params", "status": "progress",
                                       "at": f"2026-12-02T18:{n // 60 % 60:02d}:{n % 60:02d}Z",
                                       "message": f"{n} of 56 GiB", "details": {"done_bytes": n * 1_048_576,
                                                                                "total_bytes": 60_129_542_144}}
                r = client.post(f"/api/v1/instances/{iid}/events", json=doc, headers=headers)
                accepted += r.status_code == 200
            else:
                lines = [f"{n}.{i} {LOG_LINES[i % len(LOG_LINES)]}" for i in range(LOG_BATCH_LINES)]
                r = client.post(f"/api/v1/instances/{iid}/logs", json={"protocol": 1, "lines": lines},
                                headers=headers)
                accepted += LOG_BATCH_LINES if r.status_code == 200 else 0
    out.append(accepted)


def _client_process(url: str, ids: list[str], phase: str, start_at: float, deadline: float) -> tuple[int, float]:
    counts: list[int] = []
    threads = [threading.Thread(target=_thread, args=(url, iid, phase, start_at, deadline, counts)) for iid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.time()


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), to report CPU cost per request independent of contention."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run() -> list[Figure]:
    figures = []
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(Path(tmp) / "controller.db"), SECRET.decode()],
                                stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            if not url.startswith("http://127.0.0.1:"):
                raise RuntimeError(f"controller did not start: {url!r}")
            ids = [f"bench-{p}-{t:06x}" for p in range(CLIENT_PROCESSES) for t in range(THREADS_PER_PROCESS)]
            for iid in ids:
                _register(url, iid)
            ctx = multiprocessing.get_context("fork")
            for phase in ("events", "logs"):
                start_at = time.time() + 1.0
                deadline = start_at + PHASE_SECONDS
                cpu_before = _cpu_seconds(proc.pid)
                with ctx.Pool(CLIENT_PROCESSES) as pool:
                    parts = [ids[p * THREADS_PER_PROCESS:(p + 1) * THREADS_PER_PROCESS]
                             for p in range(CLIENT_PROCESSES)]
                    done = pool.starmap(_client_process, [(url, part, phase, start_at, deadline) for part in parts])
                cpu = _cpu_seconds(proc.pid) - cpu_before
                accepted = sum(c for c, _ in done)
                elapsed = max(end for _, end in done) - start_at
                rate = accepted / elapsed
                requests = accepted if phase == "events" else accepted // LOG_BATCH_LINES
                clients = (f"{CLIENT_PROCESSES} processes x {THREADS_PER_PROCESS} threads, keep-alive, {elapsed:.1f} s;"
                           f" controller CPU {cpu / max(requests, 1) * 1e6:,.0f} us/request"
                           f" (= {requests / max(cpu, 1e-9):,.0f} requests per CPU-second)")
                if phase == "events":
                    figures.append(Figure("controller ingest: events", rate, "events/s",
                                          f"{accepted:,} accepted; {clients}; one event per request",
                                          target=f">= {TARGET_EVENTS_PER_S:,} events/s",
                                          passed=rate >= TARGET_EVENTS_PER_S))
                else:
                    figures.append(Figure("controller ingest: log lines", rate, "lines/s",
                                          f"{accepted:,} lines accepted in batches of {LOG_BATCH_LINES} "
                                          f"({rate / LOG_BATCH_LINES:,.0f} batches/s); {clients}; redacted on ingest"))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
    return figures


if __name__ == "__main__":
    for f in run():
        print(f.name, "|", f.shown(), "|", f.detail, f.verdict())
