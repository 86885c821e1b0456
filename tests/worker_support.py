"""Test support for the worker image scripts: a recording controller, a params mirror, fakes on PATH.

Place in the flow: tests/integration/test_worker_scripts.py (and the docker test) run the real
worker-image/entrypoint.sh against these. `ControllerReceiver` is a small real HTTP server on 127.0.0.1
that plays the controller's side of protocol v1: it checks the token and validates every body against
fleet-spec/schema/worker-protocol.v1.schema.json, records what arrived, and can simulate an outage.
`ParamsMirror` serves a manifest and files with HTTP Range support (resume). `write_fakes` puts a fake
`aria2c` (downloads through curl) and a fake `ssh` on PATH; the cuzk binaries are the product's own CPU
stand-ins in worker-image/standin.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema

from reconciler.domain.tokens import machine_claim

REPO = Path(__file__).resolve().parents[1]
WORKER_IMAGE = REPO / "worker-image"
STANDIN_DIR = WORKER_IMAGE / "standin"
SCHEMA_PATH = REPO / "fleet-spec" / "schema" / "worker-protocol.v1.schema.json"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_BODY_BYTES = 256 * 1024
ENDPOINT = re.compile(r"^/api/v1/instances/(?P<instance>[^/]+)/(?P<kind>register|events|logs|result)$")
KIND_TO_DEF = {"register": "register", "events": "event", "logs": "log_batch", "result": "result"}

SECRET = b"test-controller-secret"
INSTANCE_ID = "rtx4090-0-3f9a1c"


def token_for(instance_id: str, secret: bytes = SECRET) -> str:
    """The controller's token scheme: hex HMAC-SHA256(secret, instance_id)."""
    return hmac.new(secret, instance_id.encode(), hashlib.sha256).hexdigest()


def protocol_validators() -> dict[str, jsonschema.protocols.Validator]:
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return {name: cls({**schema, "$ref": f"#/$defs/{name}"}) for name in KIND_TO_DEF.values()}


@dataclass(frozen=True)
class Received:
    """One request as the controller saw it."""

    seq: int
    kind: str  # register | events | logs | result | other
    instance_id: str
    authorization: str
    raw: bytes
    body: Any
    answered: str  # "200", "503", "closed", "400 schema", ...


# An outage policy looks at (kind, parsed body) and says how to answer: "ok", an HTTP status, or "close".
OutagePolicy = Callable[[str, Any], "str | int"]


class ControllerReceiver:
    """Records worker reports; validates auth and schema for every request; optional outage policy."""

    def __init__(self, token: str, policy: OutagePolicy | None = None) -> None:
        self.token = token
        self.policy = policy
        self._validators = protocol_validators()
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self.problems: list[str] = []
        self.directive_gets = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                receiver._handle(self)

            def do_GET(self) -> None:
                if self.path == f"/api/v1/instances/{INSTANCE_ID}/directive":
                    # A controller without directives (serve.sh then serves as before); counted, not a problem.
                    receiver.directive_gets += 1
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                receiver._problem(f"unexpected GET {self.path}")
                self.send_response(405)
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ControllerReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        match = ENDPOINT.match(handler.path)
        kind = match["kind"] if match else "other"
        instance_id = match["instance"] if match else ""
        auth = handler.headers.get("Authorization") or ""
        answer: str | int = "ok"
        body: Any = None
        if not match:
            self._problem(f"unknown endpoint {handler.path}")
            answer = 404
        elif auth != f"Bearer {self.token}":
            self._problem(f"bad Authorization on {handler.path}: {auth[:20]!r}")
            answer = 401
        elif handler.headers.get("Content-Type") != "application/json":
            self._problem(f"Content-Type {handler.headers.get('Content-Type')!r} on {handler.path}")
            answer = 415
        elif len(raw) > MAX_BODY_BYTES:
            self._problem(f"{kind} body of {len(raw)} bytes exceeds 256 KiB")
            answer = 413
        else:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                self._problem(f"{kind} body is not JSON: {exc}: {raw[:200]!r}")
                answer = 400
            else:
                errors = sorted(self._validators[KIND_TO_DEF[kind]].iter_errors(body), key=str)
                if errors:
                    self._problem(f"{kind} body violates the schema: {errors[0].message} in {body}")
                    answer = 400
        if answer == "ok" and self.policy is not None:
            answer = self.policy(kind, body)
        with self._lock:
            self._received.append(
                Received(len(self._received), kind, instance_id, auth, raw, body, str(answer))
            )
        if answer == "close":
            handler.close_connection = True
            return
        status = 200 if answer == "ok" else int(answer)
        reply = b'{"ok": true}' if status == 200 else b'{"error": "simulated"}'
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(reply)))
        handler.end_headers()
        handler.wfile.write(reply)

    # -- what arrived (accepted requests only, in arrival order) --------------------------------------

    def all(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def accepted(self, kind: str | None = None) -> list[Received]:
        return [r for r in self.all() if r.answered == "ok" and (kind is None or r.kind == kind)]

    def events(self) -> list[dict[str, Any]]:
        return [r.body for r in self.accepted("events")]

    def phase_statuses(self) -> list[tuple[str, str]]:
        return [(e["phase"], e["status"]) for e in self.events()]

    def failed_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["status"] == "failed"]

    def results(self) -> list[dict[str, Any]]:
        return [r.body for r in self.accepted("result")]

    def log_lines(self) -> list[str]:
        return [line for r in self.accepted("logs") for line in r.body["lines"]]

    def dropped_total(self) -> int:
        return sum(r.body.get("dropped", 0) for r in self.accepted("logs"))

    def wait_for(self, predicate: Callable[[ControllerReceiver], bool], timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.05)
        return predicate(self)


@dataclass
class ParamsMirror:
    """A params mirror: `manifest.txt` (`<b2sum>  <size>  <name>`) and the files, with Range support."""

    files: dict[str, bytes]
    wrong_checksum: set[str] = field(default_factory=set)  # manifest lies about these
    fail_status: dict[str, int] = field(default_factory=dict)  # these answer with an error
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)

    def __post_init__(self) -> None:
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                mirror._get(self)

            def do_HEAD(self) -> None:
                mirror._get(self, head=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,), daemon=True)
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/params"

    def start(self) -> ParamsMirror:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def manifest(self) -> str:
        lines = []
        for name, data in self.files.items():
            digest = hashlib.blake2b(data, digest_size=64).hexdigest()
            if name in self.wrong_checksum:
                digest = hashlib.blake2b(data + b"tampered", digest_size=64).hexdigest()
            lines.append(f"{digest}  {len(data)}  {name}\n")
        return "".join(lines)

    def gets_of(self, name: str) -> list[str | None]:
        """Range headers of the GETs of one file (None = whole file)."""
        with self._lock:
            return [rng for path, rng in self.requests if path == f"/params/{name}"]

    def _get(self, handler: BaseHTTPRequestHandler, head: bool = False) -> None:
        path = handler.path
        rng = handler.headers.get("Range")
        with self._lock:
            self.requests.append((path, rng))
        name = path.removeprefix("/params/")
        if path == "/params/manifest.txt":
            data = self.manifest().encode()
        elif path.startswith("/params/") and name in self.files and name not in self.fail_status:
            data = self.files[name]
        else:
            status = self.fail_status.get(name, 404)
            handler.send_response(status)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        start = 0
        status = 200
        match = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if match:
            start = int(match[1])
            if start >= len(data):
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{len(data)}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            status = 206
        handler.send_response(status)
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("Content-Length", str(len(data) - start))
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        handler.end_headers()
        if not head:
            handler.wfile.write(data[start:])


def sample_params() -> dict[str, bytes]:
    """Small stand-ins for the real params files (names as in the real cache), plus the c1.json input."""
    seed = hashlib.sha256(b"fleet-params").digest()
    blob = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(12_000))  # 384 KB
    return {
        "v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher-"
        "82a357d2f2ca81dc61bb45f4a762807aedee1b0a53fd6c4e77b46a01bfef7820.params": blob,
        "v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher-"
        "82a357d2f2ca81dc61bb45f4a762807aedee1b0a53fd6c4e77b46a01bfef7820.vk": blob[:4096],
        "c1.json": json.dumps({"SectorNum": 1, "Phase1Out": "c3RhbmQtaW4="}).encode(),
    }


FAKE_ARIA2C = r"""#!/usr/bin/env bash
# FAKE aria2c for tests: records its arguments, then downloads with curl (resuming like --continue).
# FAKE_ARIA2C_FAIL=1: fails like aria2c does when the resource is missing (exit 3).
set -uo pipefail
printf '%s\n' "$*" >>"${FAKE_ARIA2C_LOG:-/dev/null}"
dir=. out="" url=""
while (($#)); do
  case $1 in
    -d) dir=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -*) shift ;;
    *) url=$1; shift ;;
  esac
done
if [[ ${FAKE_ARIA2C_FAIL:-0} == 1 ]]; then
  echo "[ERROR] CUID#7 - Download aborted. URI=$url"
  echo "Exception: [AbstractCommand.cc:351] errorCode=3 Resource not found"
  exit 3
fi
curl -fsS -C - -o "$dir/${out:-$(basename "$url")}" "$url" || {
  echo "Exception: errorCode=3 Resource not found: $url"
  exit 3
}
"""

FAKE_SSH = r"""#!/usr/bin/env bash
# FAKE ssh for tests: records its arguments and fails like an unreachable host.
printf '%s\n' "$*" >>"${FAKE_SSH_LOG:-/dev/null}"
echo "ssh: connect to host ${!#} port 22: Connection refused" >&2
exit 255
"""


def write_fakes(bin_dir: Path, aria2c: bool = True, ssh: bool = False) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text, wanted in (("aria2c", FAKE_ARIA2C, aria2c), ("ssh", FAKE_SSH, ssh)):
        if wanted:
            path = bin_dir / name
            path.write_text(text)
            path.chmod(0o755)
    return bin_dir


def fake_cgroup(directory: Path, memory_max: str = str(128 * 2**30)) -> Path:
    """A cgroup v2 directory as a rented container sees it: memory.max (bytes or "max") and memory.events."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "memory.max").write_text(memory_max + "\n")
    events = directory / "memory.events"
    if not events.exists():
        events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    return directory


def worker_env(tmp: Path, controller_url: str, params_url: str | None, **overrides: str) -> dict[str, str]:
    """Worker environment (the FLEET_* contract) with test-speed knobs; overrides win, "" removes.
    The container's memory limit is a fake cgroup (128 GiB) under tmp, so the worker's memory budget does
    not depend on the machine running the tests."""
    cgroup = fake_cgroup(tmp / "cgroup") if not (tmp / "cgroup" / "memory.max").exists() else tmp / "cgroup"
    env = {
        "PATH": f"{tmp / 'bin'}:{STANDIN_DIR}:{SYSTEM_PATH}",
        "HOME": str(tmp),
        "FLEET_CONTROLLER_URL": controller_url,
        "FLEET_INSTANCE_ID": INSTANCE_ID,
        "FLEET_TOKEN": token_for(INSTANCE_ID),
        "FLEET_POOL": "rtx4090",
        "FLEET_SLOT": "rtx4090-0",
        "FLEET_MACHINE_ID": "m-10452",
        "FLEET_MACHINE_CLAIM": machine_claim(SECRET, INSTANCE_ID, "m-10452"),
        "FLEET_HOST_ID": "h-771",
        "FLEET_GPU_NAME": "RTX 4090",
        "FLEET_IMAGE_DIGEST": "sha256:" + "ab" * 32,
        "FLEET_BENCH_PROOF_TYPE": "porep",
        "FLEET_BENCH_PROOFS": "5",
        "FLEET_BENCH_CONCURRENCY": "1",
        "FLEET_BENCH_TIMEOUT_S": "60",
        "FLEET_AFTER_BENCH": "exit",
        "FLEET_PARAMS_SECTOR_SIZE": "32GiB",
        "FLEET_PARAMS_TIMEOUT_S": "60",
        "FLEET_PARAMS_DIR": str(tmp / "params"),
        "FLEET_STATE_DIR": str(tmp / "state"),
        # Test speed: short waits and backoffs (the scripts' defaults are minutes, not these).
        "FLEET_REPORT_RETRY_BASE_S": "0.05",
        "FLEET_REPORT_RETRY_CAP_S": "0.2",
        "FLEET_LOG_SHIP_INTERVAL_S": "0.2",
        "FLEET_PROGRESS_INTERVAL_S": "0",
        "FLEET_PARAMS_POLL_S": "0.1",
        "FLEET_DAEMON_POLL_S": "0.1",
        "FLEET_DAEMON_WAIT_S": "20",
        "FLEET_LOG_FINAL_FLUSH_S": "10",
        "FLEET_CGROUP_DIR": str(cgroup),
        # The host's kernel log is not the worker's (and dmesg is host state): a file the test controls.
        "FLEET_KERNEL_LOG_FILE": str(tmp / "kmsg"),
        "STANDIN_KMSG_FILE": str(tmp / "kmsg"),
        "STANDIN_CGROUP_DIR": str(cgroup),
        "STANDIN_STATE_DIR": str(tmp / "standin"),
        "STANDIN_SECONDS_PER_PROOF": "0.05",
        "STANDIN_DAEMON_STARTUP_S": "0.1",
        "FAKE_ARIA2C_LOG": str(tmp / "aria2c.log"),
        "FAKE_SSH_LOG": str(tmp / "ssh.log"),
    }
    if params_url is not None:
        env["FLEET_PARAMS_BASE_URL"] = params_url
    for key, value in overrides.items():
        if value == "":
            env.pop(key, None)
        else:
            env[key] = value
    return env


class WorkerProcess:
    """entrypoint.sh as a child in its own session, output to files (never a pipe: a stray grandchild
    holding a pipe open would hang the test). `finish` kills whatever is left of its process group."""

    def __init__(self, env: Mapping[str, str], log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.out_path = log_dir / "worker.out"
        self.err_path = log_dir / "worker.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.popen = subprocess.Popen(
                ["bash", str(WORKER_IMAGE / "entrypoint.sh")],
                env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
            )

    def poll(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def finish(self, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        return subprocess.CompletedProcess(
            self.popen.args,
            self.popen.returncode,
            self.out_path.read_text(errors="replace"),
            self.err_path.read_text(errors="replace"),
        )


def run_entrypoint(env: Mapping[str, str], log_dir: Path, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    return WorkerProcess(env, log_dir).finish(timeout_s)


@dataclass
class WorkerBench:
    """One test's world: a controller receiver, a params mirror, a tmp dir with fakes."""

    tmp: Path
    receiver: ControllerReceiver
    mirror: ParamsMirror
    runs: int = 0

    def env(self, **overrides: str) -> dict[str, str]:
        return worker_env(self.tmp, self.receiver.url, self.mirror.url, **overrides)

    def run(self, **overrides: str) -> subprocess.CompletedProcess[str]:
        self.runs += 1
        return run_entrypoint(self.env(**overrides), self.tmp / f"run{self.runs}")

    def start(self, **overrides: str) -> WorkerProcess:
        self.runs += 1
        return WorkerProcess(self.env(**overrides), self.tmp / f"run{self.runs}")


def bench_world(tmp: Path, policy: OutagePolicy | None = None, aria2c: bool = True) -> Iterator[WorkerBench]:
    """Generator for a pytest fixture: starts the servers, yields, stops them."""
    write_fakes(tmp / "bin", aria2c=aria2c, ssh=True)
    receiver = ControllerReceiver(token_for(INSTANCE_ID), policy).start()
    mirror = ParamsMirror(sample_params()).start()
    try:
        yield WorkerBench(tmp, receiver, mirror)
    finally:
        receiver.stop()
        mirror.stop()


def explain(proc: subprocess.CompletedProcess[str], receiver: ControllerReceiver) -> str:
    """Failure message for asserts: the worker's output and what the controller saw."""
    seen = "\n".join(f"  {r.kind} [{r.answered}] {r.raw[:300]!r}" for r in receiver.all())
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    return f"exit {proc.returncode}\n--- worker output ---\n{output}\n--- received ---\n{seen}"
