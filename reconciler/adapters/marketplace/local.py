"""Local marketplace: declared machines on this host, each "instance" a detached worker process.

The `Marketplace` adapter for the demo, for `fleet apply --backend local` and for tests: no GPU, no vast.ai
account. Machines are declared in a YAML file (machine_id, host_id, gpu_name, price, reliability, ... plus
`env`: the behaviour of the CPU stand-in `cuzk-bench` on that machine, e.g. STANDIN_SECONDS_PER_PROOF).
Renting one starts the worker entrypoint from the worker-image directory given as the request's `image`
(`bash <image>/entrypoint.sh`, with `<image>/standin` first on PATH) in its own process group, output to
`<state_dir>/instances/<contract_id>/worker.log`.

State lives in `<state_dir>/marketplace.json` (written atomically under an flock), so separate `fleet apply`
runs and the reconciler see the same instances. A process that has ended is reported `exited`, like a
vast.ai instance that stopped; a rented machine is not offered again until its instance is destroyed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.domain import errors
from reconciler.domain.marketplace import (
    Instance,
    InstanceRequest,
    Offer,
    OfferQuery,
    PermanentMarketplaceError,
    TemporaryMarketplaceError,
)
from reconciler.domain.records import RecordError, check_machine_id

STATE_FILE = "marketplace.json"
LOCK_FILE = "marketplace.lock"

#: Only these variables of the caller's environment reach a worker: the worker gets what a rented
#: container would have (its request env), not the operator's shell (API keys, tokens).
_INHERITED_ENV = ("HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")

_MACHINES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["machines"],
    "properties": {
        "machines": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["machine_id", "host_id", "gpu_name", "price_usd_per_hour"],
                "properties": {
                    "machine_id": {"type": ["string", "integer"]},
                    "host_id": {"type": ["string", "integer"]},
                    "gpu_name": {"type": "string", "minLength": 1},
                    "num_gpus": {"type": "integer", "minimum": 1},
                    "price_usd_per_hour": {"type": "number", "minimum": 0},
                    "reliability": {"type": "number", "minimum": 0, "maximum": 1},
                    "inet_down_mbps": {"type": "number", "minimum": 0},
                    "disk_gb": {"type": "number", "minimum": 0},
                    "cpu_ram_gb": {"type": "number", "minimum": 0},
                    "cuda_max_good": {"type": "number", "minimum": 0},
                    "verified": {"type": "boolean"},
                    "geolocation": {"type": "string"},
                    "note": {"type": "string"},
                    "env": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
                },
            },
        },
    },
}


class LocalMachinesError(errors.PermanentError, ValueError):
    """The declared-machines file cannot be used. Names the file, the field and the value."""


@dataclass(frozen=True)
class LocalMachine:
    machine_id: str
    host_id: str
    gpu_name: str
    price_usd_per_hour: float
    reliability: float = 0.99
    num_gpus: int = 1
    inet_down_mbps: float = 1000.0
    disk_gb: float = 500.0
    cpu_ram_gb: float = 256.0
    cuda_max_good: float = 12.4
    verified: bool = True
    geolocation: str | None = None
    note: str | None = None
    #: Stand-in behaviour on this machine (STANDIN_SECONDS_PER_PROOF, STANDIN_FAIL_AFTER, STANDIN_ERROR_LINE...).
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def offer_id(self) -> str:
        return f"offer-{self.machine_id}"

    def offer(self) -> Offer:
        return Offer(offer_id=self.offer_id, machine_id=self.machine_id, host_id=self.host_id,
                     gpu_name=self.gpu_name, num_gpus=self.num_gpus, price_usd_per_hour=self.price_usd_per_hour,
                     reliability=self.reliability, inet_down_mbps=self.inet_down_mbps, disk_gb=self.disk_gb,
                     cpu_ram_gb=self.cpu_ram_gb, cuda_max_good=self.cuda_max_good, verified=self.verified,
                     geolocation=self.geolocation)


def parse_local_machines(text: str, file: str = "<machines>") -> list[LocalMachine]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LocalMachinesError(f"{file}: not valid YAML: {exc}") from None
    errors = sorted(jsonschema.Draft202012Validator(_MACHINES_SCHEMA).iter_errors(doc),
                    key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = []
        for err in errors:
            path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
            lines.append(f"{file}: {path}: {err.message}")
        raise LocalMachinesError("\n".join(lines))
    machines: list[LocalMachine] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(doc["machines"]):
        try:
            machine_id = check_machine_id(item["machine_id"])
        except RecordError as exc:
            raise LocalMachinesError(f"{file}: $.machines[{i}].machine_id: {exc}") from None
        if machine_id in seen:
            raise LocalMachinesError(f"{file}: $.machines[{i}].machine_id: duplicate {machine_id!r} "
                                     f"(first at $.machines[{seen[machine_id]}])")
        seen[machine_id] = i
        fields = {k: v for k, v in item.items() if k not in ("machine_id", "host_id", "env")}
        env = {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in item.get("env", {}).items()}
        machines.append(LocalMachine(machine_id=machine_id, host_id=str(item["host_id"]), env=env, **fields))
    return machines


def load_local_machines(path: str | Path) -> list[LocalMachine]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LocalMachinesError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LocalMachinesError(f"{path}: cannot read: {exc}") from None
    return parse_local_machines(text, str(path))


# Popen objects of workers started by this process, kept so that their exit is reaped (no zombies that
# would look alive) and their exit code can be reported. Workers started by another process are checked
# through /proc only.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (Linux /proc), to tell a recycled pid from ours."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after its closing parenthesis.
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[19])  # field 22 overall


def _process_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[0]


def _alive(pid: int, start_ticks: int | None) -> tuple[bool, int | None]:
    """(is the worker still running, its exit code if we know it)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        code = child.poll()
        if code is not None:
            return False, code
        return True, None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, None
    except PermissionError:
        pass
    if _process_state(pid) == "Z":
        return False, None
    if start_ticks is not None and _process_start_ticks(pid) not in (None, start_ticks):
        return False, None  # the pid now belongs to another process
    return True, None


class LocalMarketplace:
    """`Marketplace` over declared machines; instances are local worker processes."""

    def __init__(self, state_dir: str | Path, machines: Sequence[LocalMachine],
                 worker_command: Sequence[str] | None = None, *, stop_grace_seconds: float = 5.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time):
        self.state_dir = Path(state_dir)
        self.machines = {m.machine_id: m for m in machines}
        self.worker_command = list(worker_command) if worker_command else None
        self.stop_grace_seconds = stop_grace_seconds
        self._sleep = sleep
        self._clock = clock

    # --- state ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write of the state file under an exclusive lock; written back on success."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._read()
            before = json.dumps(state, sort_keys=True)
            yield state
            if json.dumps(state, sort_keys=True) != before:
                write_text_atomic(self.state_dir / STATE_FILE, json.dumps(state, indent=2, sort_keys=True) + "\n")

    def _read(self) -> dict[str, Any]:
        path = self.state_dir / STATE_FILE
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"version": 1, "next_contract": 1, "instances": {}}
        except (OSError, ValueError) as exc:
            # Never start over silently: that would forget running processes we pay for (here: CPU).
            raise TemporaryMarketplaceError(f"local marketplace state {path} unreadable: {exc}") from None
        if not isinstance(state, dict) or not isinstance(state.get("instances"), dict):
            raise PermanentMarketplaceError(f"local marketplace state {path}: expected an object with "
                                            "'instances'; move the file away to start over")
        return state

    def _instance(self, rec: Mapping[str, Any]) -> Instance:
        alive, code = _alive(int(rec["pid"]), rec.get("start_ticks"))
        status_msg = "worker running" if alive else (
            f"worker exited with code {code}" if code is not None else "worker process ended")
        return Instance(contract_id=rec["contract_id"], label=rec.get("label"), machine_id=rec["machine_id"],
                        host_id=rec["host_id"], status="running" if alive else "exited",
                        gpu_name=rec.get("gpu_name"), price_usd_per_hour=rec.get("price_usd_per_hour"),
                        image=rec.get("image"), status_msg=status_msg, start_date=rec.get("start_date"))

    # --- Marketplace ---------------------------------------------------------------------------------

    def search_offers(self, query: OfferQuery) -> Sequence[Offer]:
        with self._locked() as state:
            rented = {rec["machine_id"] for rec in state["instances"].values()}
        # A pre-filter on the raw fields a market's search takes (GPU model and count, exclusions), cheapest first,
        # as vast's server answers; whether an offer fits the pool is the ranking's to decide (domain/ranking.py).
        offers = [m.offer() for m in self.machines.values() if m.machine_id not in rented
                  and m.gpu_name == query.gpu_name and m.num_gpus == query.num_gpus
                  and m.machine_id not in query.exclude_machine_ids]
        offers.sort(key=lambda o: (o.price_usd_per_hour, o.machine_id))
        return offers[: query.limit]

    def create_instance(self, offer_id: str, request: InstanceRequest) -> str:
        machine = next((m for m in self.machines.values() if m.offer_id == offer_id), None)
        if machine is None:
            raise PermanentMarketplaceError(f"offer {offer_id!r} does not exist in the local marketplace")
        argv, image_dir = self._command(request)
        with self._locked() as state:
            if any(rec["machine_id"] == machine.machine_id for rec in state["instances"].values()):
                raise PermanentMarketplaceError(f"offer {offer_id!r} is no longer available "
                                                f"(machine {machine.machine_id} is rented)")
            contract_id = f"local-{state['next_contract']}"
            state["next_contract"] += 1
            workdir = self.state_dir / "instances" / contract_id
            workdir.mkdir(parents=True, exist_ok=True)
            env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
            # Each instance gets its own worker state dir, as a container has its own filesystem: workers
            # sharing one (the image default /var/lib/fleet-worker) would overwrite each other's tokens.
            env["FLEET_STATE_DIR"] = str(workdir / "worker-state")
            # The machine's RAM as its container sees it: a cgroup v2 memory.max, from which the worker sizes
            # cuzk-daemon's memory budget (the daemon itself would read this host's /proc/meminfo).
            cgroup = workdir / "cgroup"
            cgroup.mkdir(exist_ok=True)
            (cgroup / "memory.max").write_text(f"{int(machine.cpu_ram_gb * 1e9)}\n")
            (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
            env["FLEET_CGROUP_DIR"] = env["STANDIN_CGROUP_DIR"] = str(cgroup)
            env.update(request.env)
            env.update(machine.env)
            path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
            env["PATH"] = f"{image_dir / 'standin'}:{path}" if image_dir else path
            log_path = workdir / "worker.log"
            try:
                with open(log_path, "ab") as log:
                    proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise PermanentMarketplaceError(f"cannot start worker {argv[0]!r}: {exc}") from None
            _CHILDREN[proc.pid] = proc
            state["instances"][contract_id] = {
                "contract_id": contract_id, "label": request.label, "machine_id": machine.machine_id,
                "host_id": machine.host_id, "gpu_name": machine.gpu_name,
                "price_usd_per_hour": machine.price_usd_per_hour, "image": request.image, "pid": proc.pid,
                "start_ticks": _process_start_ticks(proc.pid), "start_date": self._clock(),
                "log": str(log_path), "workdir": str(workdir),
            }
        return contract_id

    def list_instances(self) -> Sequence[Instance]:
        with self._locked() as state:
            records = list(state["instances"].values())
        return [self._instance(rec) for rec in sorted(records, key=lambda r: int(r["contract_id"].split("-")[-1]))]

    def get_instance(self, contract_id: str) -> Instance | None:
        with self._locked() as state:
            rec = state["instances"].get(contract_id)
        return None if rec is None else self._instance(rec)

    def destroy_instance(self, contract_id: str) -> None:
        with self._locked() as state:
            rec = state["instances"].get(contract_id)
            if rec is None:
                return
            self._stop(int(rec["pid"]), rec.get("start_ticks"))
            del state["instances"][contract_id]

    # --- helpers -------------------------------------------------------------------------------------

    def log_path(self, contract_id: str) -> Path:
        return self.state_dir / "instances" / contract_id / "worker.log"

    def _command(self, request: InstanceRequest) -> tuple[list[str], Path | None]:
        image_dir = Path(request.image) if Path(request.image).is_dir() else None
        if self.worker_command:
            return list(self.worker_command), image_dir
        if image_dir is None or not (image_dir / "entrypoint.sh").is_file():
            raise PermanentMarketplaceError(
                f"the local marketplace runs a worker-image directory with entrypoint.sh; image {request.image!r} "
                "is not one")
        return ["bash", str(image_dir / "entrypoint.sh")], image_dir

    def _stop(self, pid: int, start_ticks: int | None) -> None:
        """SIGTERM the worker's process group, SIGKILL what is left after the grace period.

        The group id is the worker's pid (it was started as a session leader). Only a group that still
        has live members is signalled, so a recycled pid of a stranger is never targeted."""
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            child.poll()
        if not _group_members(pid):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        waited = 0.0
        while waited < self.stop_grace_seconds:
            if child is not None:
                child.poll()
            if not _group_members(pid):
                return
            self._sleep(0.05)
            waited += 0.05
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=self.stop_grace_seconds)


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(entry.name))
    return members
