"""Owned Docker hosts: the inventory (fleet-spec/hosts.yaml) as pure data, and how its GPUs are named.

Place in the flow: `reconciler.adapters.hosts_files` loads and validates the inventory beside the fleet spec (the
spec carries it as `FleetSpec.hosts`); the `hosts` marketplace adapter offers each free GPU of an active host as
a one-GPU offer; the fit rule (domain/ranking.py) matches pools to hosts by GPU model and labels; the planner
replaces slots on banned hosts. On owned hardware the unit that goes bad is a GPU: a GPU's machine id is
`<host>.<GPU UUID>`, so a bad card never bans its siblings, and `host_of_machine` finds the host again (records,
`fleet why <host>`, the host verdict when several of its GPUs fail alike).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from reconciler.domain.observations import parse_time
from reconciler.domain.records import MachineRecord

#: active: takes new workers; drain: takes none, its running workers stay until they end or are replaced for
#: another reason; banned: takes none and every slot on it is replaced (an operator's PR, like a machine ban).
HOST_STATES = ("active", "drain", "banned")
#: How a container sees its one GPU: the NVIDIA runtime with NVIDIA_VISIBLE_DEVICES=<uuid> (`runtime`), or a
#: Docker device request (`docker run --gpus device=<uuid>`, the NVIDIA container toolkit's hook: `device-request`).
GPU_ACCESS = ("runtime", "device-request")
#: Container networking: Docker's default bridge, or the host's network (each GPU's daemon then gets its own port).
NETWORK_MODES = ("bridge", "host")

#: Host names are ids (safe in file names and machine ids): with a GPU UUID (40 characters) a machine id stays
#: within the records' 64-character limit.
HOST_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,22}\Z")
#: nvidia-smi's form of a GPU UUID (`nvidia-smi -L`, NVML nvmlDeviceGetUUID): GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
#: The first port of a GPU's cuzk daemon under host networking (cuzk-daemon's default listen port); the GPU at
#: index i of its host listens on this + i.
DAEMON_BASE_PORT = 9820


@dataclass(frozen=True)
class HostSelector:
    """Which owned hosts a pool may use: those with the pool's GPU model and every one of these labels."""

    labels: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.labels.items())) or "any label"


@dataclass(frozen=True)
class DockerTls:
    """Client certificates for a `tcp://` Docker endpoint (Docker's `--tlsverify` with ca/cert/key)."""

    ca: str
    cert: str
    key: str


@dataclass(frozen=True)
class OwnedHost:
    name: str
    #: `ssh://user@host[:port]` (Docker's SSH transport) or `tcp://host:port` (with `tls`).
    docker: str
    gpu_name: str
    #: Declared GPU UUIDs; empty when only `gpu_count` is declared (discovered through nvidia-smi on the host).
    gpu_uuids: tuple[str, ...]
    gpu_count: int
    ram_gb: float
    disk_gb: float
    #: Amortised hardware + power per GPU-hour: what ranking, the spend cap and $/proof count for this host.
    cost_usd_per_gpu_hour: float
    labels: Mapping[str, str] = field(default_factory=dict)
    state: str = "active"
    network: str = "bridge"
    gpu_access: str = "runtime"
    tls: DockerTls | None = None

    @property
    def ram_per_gpu_gb(self) -> float:
        """Each GPU's worker gets an equal share of the host's RAM (its container's memory limit)."""
        return self.ram_gb / max(self.gpu_count, 1)

    @property
    def disk_per_gpu_gb(self) -> float:
        return self.disk_gb / max(self.gpu_count, 1)

    def serves(self, gpu_name: str, selector: HostSelector) -> bool:
        """Whether a pool of `gpu_name` with `selector` may use this host (its state aside)."""
        return self.gpu_name == gpu_name and labels_match(self.labels, selector.labels)


def labels_match(have: Mapping[str, str], want: Mapping[str, str]) -> bool:
    return all(have.get(k) == v for k, v in want.items())


def gpu_machine_id(host: str, gpu_uuid: str) -> str:
    """The machine id of one GPU of an owned host: records, verdicts and ranking history are per GPU."""
    return f"{host}.{gpu_uuid}"


def host_of_machine(machine_id: str) -> str | None:
    """The owned host of a GPU machine id (`gpu-a.GPU-...` -> `gpu-a`), None for a marketplace machine."""
    host, sep, gpu = machine_id.partition(".")
    return host if sep and GPU_UUID.match(gpu) and HOST_NAME.match(host) else None


def machine_id_of_argument(text: str) -> str:
    """`fleet why` takes `<host>/<GPU UUID>` for an owned GPU: the machine id it stands for."""
    host, sep, gpu = text.partition("/")
    return gpu_machine_id(host, gpu) if sep and HOST_NAME.match(host) and gpu.startswith("GPU-") else text


def banned_hosts(hosts: Iterable[OwnedHost]) -> frozenset[str]:
    return frozenset(h.name for h in hosts if h.state == "banned")


def excluded_by_hosts(hosts: Iterable[OwnedHost], machine_ids: Iterable[str] = ()) -> frozenset[str]:
    """GPUs no slot may keep or get because their host is banned: every declared GPU of a banned host, and of
    `machine_ids` (the slots' machines) those on a banned host (a host whose GPUs are discovered, not declared)."""
    hosts = tuple(hosts)
    banned = banned_hosts(hosts)
    declared = {gpu_machine_id(h.name, u) for h in hosts if h.name in banned for u in h.gpu_uuids}
    return frozenset(declared | {m for m in machine_ids if host_of_machine(m) in banned})


# --- a host's story: its GPUs' records, and whether several failed alike ---------------------------------------------

#: Blames under which failures of several GPUs of one host point at the host (its power, PCIe, cooling, driver):
#: the machine's own, an unexplained one, or a setting of that machine. Image and network failures have their own
#: correlations (the breaker; the network's second strike).
_HOST_BLAMES = frozenset({"machine", "unknown", "configuration"})


@dataclass(frozen=True)
class HostVerdict:
    """Several GPUs of one owned host failed alike (one signature) within the window: the host, not each card."""

    host: str
    signature: str
    gpus: tuple[str, ...]  # machine ids, sorted
    first_at: str
    last_at: str

    def describe(self) -> str:
        return (f"host {self.host}: {len(self.gpus)} of its GPUs failed alike ({self.signature}) between "
                f"{self.first_at} and {self.last_at}: the host is the suspect (power, PCIe, cooling, its driver), "
                "not each card; drain or ban it in hosts.yaml after a look")


def host_verdicts(records: Iterable[MachineRecord], now: datetime, window_hours: float = 24.0,
                  min_gpus: int = 2) -> list[HostVerdict]:
    """Pure: for each owned host, the signatures with which at least `min_gpus` of its GPUs failed within the last
    `window_hours` (positive evidence only: entries that name a signature; none is inferred from silence)."""
    since = now - timedelta(hours=window_hours)
    failed: dict[tuple[str, str], dict[str, list[str]]] = {}
    for record in records:
        host = host_of_machine(record.machine_id)
        if host is None:
            continue
        for entry in record.benchmarks:
            try:
                at = parse_time(entry.at)
            except ValueError:
                continue  # an entry without a readable time is no evidence of "within the window"
            if entry.signature and entry.blame in _HOST_BLAMES and since <= at <= now:
                failed.setdefault((host, entry.signature), {}).setdefault(record.machine_id, []).append(entry.at)
    verdicts = []
    for (host, signature), gpus in sorted(failed.items()):
        if len(gpus) >= min_gpus:
            times = sorted(t for ts in gpus.values() for t in ts)
            verdicts.append(HostVerdict(host, signature, tuple(sorted(gpus)), times[0], times[-1]))
    return verdicts


def host_story(host: str, records: Iterable[MachineRecord], now: datetime, window_hours: float = 24.0) -> list[str]:
    """`fleet why <host>`: each GPU of the host on record, where it stands and its last verdict, then the host's
    verdict when several of its GPUs failed alike. Empty when no GPU of `host` is on record."""
    mine = sorted((r for r in records if host_of_machine(r.machine_id) == host), key=lambda r: r.machine_id)
    if not mine:
        return []
    lines = [f"host {host}: {len(mine)} GPU(s) on record"]
    for record in mine:
        last = record.benchmarks[-1] if record.benchmarks else None
        signature = f", {last.signature}" if last and last.signature else ""
        said = f"last {last.verdict} at {last.at} (blame {last.blame}{signature})" if last else "no verdict yet"
        lines.append(f"  {record.machine_id.partition('.')[2]}  {record.standing(now).state:<9} {said}")
    found = [v for v in host_verdicts(mine, now, window_hours) if v.host == host]
    lines += [f"verdict: {v.describe()}" for v in found] or [
        f"verdict: no two GPUs of {host} failed alike within {window_hours:g} h: each card answers for itself "
        f"(fleet why {host}/<GPU UUID>)"]
    return lines
