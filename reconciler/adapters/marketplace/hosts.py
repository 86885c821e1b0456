"""The `hosts` marketplace adapter: owned Docker hosts (fleet-spec/hosts.yaml) behind the same port as vast.ai.

Place in the flow: the slot provider (both drivers: `pulumi up`'s dynamic provider and `fleet apply`) searches,
rents, reads and destroys through this exactly as through vast.ai (one planner, two drivers). An offer is one free
GPU of an active inventory host (machine id `<host>.<GPU UUID>`, price = the host's declared cost per GPU-hour);
renting it pulls the worker image by digest on that host and starts the worker container pinned to that one GPU
(`NVIDIA_VISIBLE_DEVICES=<uuid>` with the NVIDIA runtime, or a device request for it), with the environment and
label a rented instance gets plus Docker labels naming fleet label, host, GPU and machine; destroying stops and
removes it; statuses come from the Docker API. The contract id is `<host>.<container id, 12 hex>`.

Each host is reached through the small `DockerEngine` port below (its real adapter: `docker_engine.py`, the Docker
SDK over Docker's SSH transport or TLS). A host that cannot be used - unreachable, SSH refused, a changed or
unknown host key, Docker down, no NVIDIA runtime, a registry it cannot pull from - is one `HostError` line naming
the host and the cause; a search skips it (its GPUs are not offered: the slot goes to another host or is held),
a rent on it tries the next offer, a read reports its instances `unknown` (never gone: nothing is dropped or
destroyed on a failed look), a destroy on it fails and is retried later.
"""

from __future__ import annotations

import logging
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from reconciler.domain.hosts import DAEMON_BASE_PORT, GPU_UUID, OwnedHost, gpu_machine_id
from reconciler.domain.marketplace import (
    Instance,
    InstanceRequest,
    MarketplaceError,
    Offer,
    OfferList,
    OfferQuery,
    OfferTakenError,
    PermanentMarketplaceError,
)

log = logging.getLogger(__name__)

#: Docker labels on every worker container (the fleet label is the one the sweep and adoption read).
LABEL_FLEET = "io.gpu-fleet.label"
LABEL_HOST = "io.gpu-fleet.host"
LABEL_GPU = "io.gpu-fleet.gpu"
LABEL_MACHINE = "io.gpu-fleet.machine"
#: Container states (Docker's State.Status) -> the port's normalised instance statuses.
_STATUS = {"created": "loading", "running": "running", "paused": "frozen", "restarting": "rebooting",
           "removing": "stopped", "exited": "exited", "dead": "exited"}
#: States in which a container holds its GPU.
_HOLDS_GPU = frozenset({"created", "running", "paused", "restarting"})
#: The image that lists a host's GPUs when the inventory gives only their count: any image works, the NVIDIA
#: runtime mounts the driver's nvidia-smi into it (NVIDIA container toolkit docs, "Running a Sample Workload").
DISCOVERY_IMAGE = "ubuntu:24.04"

#: Why a host cannot be used (HostError.cause): one line each, naming the host.
CAUSE_UNREACHABLE = "unreachable"
CAUSE_AUTH_REFUSED = "ssh-auth-refused"
CAUSE_HOST_KEY_CHANGED = "host-key-changed"
CAUSE_HOST_KEY_UNKNOWN = "host-key-unknown"
CAUSE_DOCKER_DOWN = "docker-down"
CAUSE_NO_NVIDIA_RUNTIME = "no-nvidia-runtime"
CAUSE_NO_GPU_TOOLS = "no-gpu-tools"
CAUSE_UNKNOWN_GPU = "unknown-gpu"
CAUSE_PULL_REFUSED = "pull-refused"
CAUSE_REFUSED = "docker-refused"
CAUSE_NOT_IN_INVENTORY = "not-in-inventory"

_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")


class HostError(MarketplaceError):
    """One owned host cannot be used now. `cause` is one of the CAUSE_* constants; the message names the host."""

    def __init__(self, host: str, cause: str, detail: str, *, temporary: bool):
        super().__init__(f"host {host}: {detail} [{cause}]")
        self.host = host
        self.cause = cause
        self.temporary = temporary


# --- the port each host is reached through ------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineInfo:
    runtimes: frozenset[str]
    server_version: str
    default_runtime: str = "runc"


@dataclass(frozen=True)
class ContainerView:
    """What the engine says about one container (no environment: it carries the worker's token)."""

    id: str
    name: str
    labels: Mapping[str, str]
    state: str
    exit_code: int | None = None
    error: str | None = None
    image: str = ""
    started_at: float | None = None
    runtime: str = ""


@dataclass(frozen=True)
class ContainerRequest:
    name: str
    image: str
    env: Mapping[str, str]
    labels: Mapping[str, str]
    network_mode: str = "bridge"
    runtime: str | None = None
    gpu_device: str | None = None
    mem_limit_bytes: int | None = None


class DockerEngine(Protocol):
    """One host's Docker engine. Every method raises HostError (naming the host) when the host cannot answer."""

    def info(self) -> EngineInfo: ...

    def containers(self, label_key: str) -> list[ContainerView]:
        """Every container (any state) carrying the label `label_key`."""
        ...

    def container(self, container_id: str) -> ContainerView | None:
        """None when the engine answered and has no such container."""
        ...

    def pull(self, image: str, auth: Mapping[str, str] | None) -> None: ...

    def run(self, request: ContainerRequest) -> str:
        """Create and start; a container that would not start is removed again. Returns its id."""
        ...

    def remove(self, container_id: str) -> None:
        """Stop (with a grace period) and remove; a missing container is not an error."""
        ...

    def gpu_uuids(self, image: str) -> list[str]: ...

    def close(self) -> None: ...


# --- the adapter ---------------------------------------------------------------------------------------------------


@dataclass
class _HostView:
    """One host as a search or list saw it: its GPUs and the fleet's containers on it."""

    host: OwnedHost
    gpus: tuple[str, ...]
    containers: list[ContainerView] = field(default_factory=list)


class HostsMarketplace:
    """`Marketplace` over owned Docker hosts, one worker container per GPU."""

    def __init__(self, hosts: Sequence[OwnedHost], engine_for: Callable[[OwnedHost], DockerEngine], *,
                 notify: Callable[[str], None] | None = None, discovery_image: str = DISCOVERY_IMAGE,
                 clock: Callable[[], float] = time.time):
        self.hosts = {h.name: h for h in hosts}
        self._engine_for = engine_for
        self._engines: dict[str, DockerEngine] = {}
        self._discovered: dict[str, tuple[str, ...]] = {}
        self.notify = notify
        self._discovery_image = discovery_image
        self._clock = clock
        #: The last HostError of each host (status, `fleet apply` output); cleared when it answers again.
        self.faults: dict[str, HostError] = {}
        #: Hosts that refused a worker for a lasting reason (pull refused, no runtime) during this adapter's life.
        self._refused: dict[str, HostError] = {}

    def __repr__(self) -> str:
        return f"HostsMarketplace({', '.join(self.hosts)})"

    def claims(self, ident: str) -> bool:
        """Whether an offer or contract id is one of this adapter's (`<host>.<...>` with a known host)."""
        host, sep, _ = ident.partition(".")
        return bool(sep) and host in self.hosts

    # --- the port ---------------------------------------------------------------------------------------------

    def search_offers(self, query: OfferQuery) -> Sequence[Offer]:
        """The free GPUs of active hosts with the query's GPU model (a pre-filter on raw fields: whether a GPU
        fits the pool - labels, price, RAM, disk - is the ranking's to decide). A host that cannot be used is
        skipped with one line; its GPUs are simply not offered."""
        offers: list[Offer] = []
        skipped = 0
        for host in self.hosts.values():
            if host.state != "active" or host.gpu_name != query.gpu_name or query.num_gpus != 1:
                continue
            try:
                view = self._look(host, check_runtime=True)
            except HostError as exc:
                self._fault(exc)
                skipped += 1
                continue
            busy = {c.labels.get(LABEL_GPU) for c in view.containers if c.state in _HOLDS_GPU}
            offers += [self._offer(host, uuid) for uuid in view.gpus if uuid not in busy
                       and gpu_machine_id(host.name, uuid) not in query.exclude_machine_ids]
        offers.sort(key=lambda o: (o.price_usd_per_hour, o.machine_id))
        return OfferList(offers[: query.limit], dropped=skipped)

    def create_instance(self, offer_id: str, request: InstanceRequest) -> str:
        """Start the worker on the offer's GPU. A host that cannot take it raises OfferTakenError (the slot
        provider tries the next offer, maybe on another host) carrying the host's one-line cause."""
        host, uuid = self._parse_offer(offer_id)
        refused = self._refused.get(host.name)
        if refused is not None:
            # This host just refused a worker for a reason of its own: its other GPUs would refuse too.
            raise HostOfferError(refused)
        try:
            view = self._look(host, check_runtime=True)
            if uuid not in view.gpus:
                raise HostError(host.name, CAUSE_UNKNOWN_GPU, f"GPU {uuid} is not one of the host's GPUs "
                                f"({', '.join(view.gpus) or 'none found'})", temporary=False)
            if any(c.labels.get(LABEL_GPU) == uuid and c.state in _HOLDS_GPU for c in view.containers):
                raise OfferTakenError(f"host {host.name}: GPU {uuid} is busy (another worker runs on it)")
            engine = self._engine(host)
            engine.pull(request.image, _registry_auth(request.image_login))
            container_id = engine.run(self._container(host, uuid, view.gpus, request))
        except HostError as exc:
            self._fault(exc)
            if not exc.temporary:
                self._refused[host.name] = exc
            raise HostOfferError(exc) from None
        self.faults.pop(host.name, None)
        log.info("host %s: started %s on GPU %s (container %s)", host.name, request.label, uuid, container_id[:12])
        return f"{host.name}.{container_id[:12]}"

    def list_instances(self) -> Sequence[Instance]:
        """The fleet's containers on every host that answers (a host that does not is skipped with one line:
        nothing on it is read as gone, so the sweep never acts on it)."""
        instances: list[Instance] = []
        for host in self.hosts.values():
            try:
                containers = self._ours(host, self._engine(host))
            except HostError as exc:
                self._fault(exc)
                continue
            instances += [self._instance(host, c) for c in containers]
        return instances

    def get_instance(self, contract_id: str) -> Instance | None:
        host_name, _, container_id = contract_id.partition(".")
        host = self.hosts.get(host_name)
        if host is None:
            # The host left the inventory: we cannot look, so it is unknown - never gone.
            return Instance(contract_id, None, "", host_name, "unknown",
                            status_msg=f"host {host_name} is not in the inventory (hosts.yaml) any more: cannot look "
                                       f"[{CAUSE_NOT_IN_INVENTORY}]")
        try:
            container = self._engine(host).container(container_id)
            if container is not None and container.labels.get(LABEL_HOST) not in (None, host.name):
                container = None
        except HostError as exc:
            self._fault(exc)
            return Instance(contract_id, None, "", host.name, "unknown", gpu_name=host.gpu_name,
                            price_usd_per_hour=host.cost_usd_per_gpu_hour, status_msg=str(exc))
        return None if container is None else self._instance(host, container)

    def destroy_instance(self, contract_id: str) -> None:
        host_name, _, container_id = contract_id.partition(".")
        host = self.hosts.get(host_name)
        if host is None:
            raise PermanentMarketplaceError(f"host {host_name} is not in the inventory (hosts.yaml): cannot remove "
                                            f"container {container_id} [{CAUSE_NOT_IN_INVENTORY}]")
        try:
            self._engine(host).remove(container_id)
        except HostError as exc:
            self._fault(exc)
            raise
        log.info("host %s: removed container %s", host.name, container_id)

    # --- helpers ----------------------------------------------------------------------------------------------

    def _engine(self, host: OwnedHost) -> DockerEngine:
        if host.name not in self._engines:
            self._engines[host.name] = self._engine_for(host)
        return self._engines[host.name]

    def _look(self, host: OwnedHost, *, check_runtime: bool) -> _HostView:
        engine = self._engine(host)
        if check_runtime and host.gpu_access == "runtime":
            info = engine.info()
            if "nvidia" not in info.runtimes:
                raise HostError(host.name, CAUSE_NO_NVIDIA_RUNTIME, "Docker has no NVIDIA runtime (runtimes: "
                                f"{', '.join(sorted(info.runtimes)) or 'none'}): install the NVIDIA container toolkit "
                                "and run `nvidia-ctk runtime configure --runtime=docker`", temporary=False)
        view = _HostView(host, self._gpus(host, engine), self._ours(host, engine))
        self.faults.pop(host.name, None)
        return view

    @staticmethod
    def _ours(host: OwnedHost, engine: DockerEngine) -> list[ContainerView]:
        """The fleet's containers this host started: a container labelled for another inventory host (one engine
        reached under two names) is that host's to read and remove, never this one's."""
        return [c for c in engine.containers(LABEL_FLEET) if c.labels.get(LABEL_HOST) in (None, host.name)]

    def _gpus(self, host: OwnedHost, engine: DockerEngine) -> tuple[str, ...]:
        if host.gpu_uuids:
            return host.gpu_uuids
        if host.name not in self._discovered:
            found = [u for u in engine.gpu_uuids(self._discovery_image) if GPU_UUID.match(u)]
            if len(found) != host.gpu_count:
                raise HostError(host.name, CAUSE_UNKNOWN_GPU, f"nvidia-smi lists {len(found)} GPU(s), hosts.yaml "
                                f"declares {host.gpu_count}: fix the count (or list the UUIDs)", temporary=False)
            self._discovered[host.name] = tuple(found)
        return self._discovered[host.name]

    def _fault(self, exc: HostError) -> None:
        if self.faults.get(exc.host) is None or str(self.faults[exc.host]) != str(exc):
            if self.notify is not None:
                self.notify(str(exc))
            else:
                log.warning("%s", exc)
        self.faults[exc.host] = exc
        if exc.cause in (CAUSE_UNREACHABLE, CAUSE_DOCKER_DOWN):
            engine = self._engines.pop(exc.host, None)
            if engine is not None:
                engine.close()

    def _parse_offer(self, offer_id: str) -> tuple[OwnedHost, str]:
        host_name, _, uuid = offer_id.partition(".")
        host = self.hosts.get(host_name)
        if host is None or not GPU_UUID.match(uuid):
            raise PermanentMarketplaceError(f"offer {offer_id!r} is not a GPU of an inventory host")
        if host.state != "active":
            raise OfferTakenError(f"host {host.name} is {host.state} (hosts.yaml): it takes no new worker")
        return host, uuid

    @staticmethod
    def _offer(host: OwnedHost, uuid: str) -> Offer:
        return Offer(offer_id=gpu_machine_id(host.name, uuid), machine_id=gpu_machine_id(host.name, uuid),
                     host_id=host.name, gpu_name=host.gpu_name, num_gpus=1,
                     price_usd_per_hour=host.cost_usd_per_gpu_hour, reliability=1.0, disk_gb=host.disk_per_gpu_gb,
                     cpu_ram_gb=host.ram_per_gpu_gb, verified=True, owned=True,
                     labels=tuple(sorted(host.labels.items())))

    @staticmethod
    def _container(host: OwnedHost, uuid: str, gpus: Sequence[str], request: InstanceRequest) -> ContainerRequest:
        env = dict(request.env)
        env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
        if host.gpu_access == "runtime":
            env["NVIDIA_VISIBLE_DEVICES"] = uuid
        if host.network == "host":
            # Every GPU's worker shares the host's ports: each cuzk daemon gets its own.
            port = DAEMON_BASE_PORT + list(gpus).index(uuid)
            env["FLEET_DAEMON_LISTEN"] = f"127.0.0.1:{port}"
            env["FLEET_DAEMON_ADDR"] = f"http://127.0.0.1:{port}"
        labels = {LABEL_FLEET: request.label, LABEL_HOST: host.name, LABEL_GPU: uuid,
                  LABEL_MACHINE: gpu_machine_id(host.name, uuid)}
        return ContainerRequest(
            name=_NAME_UNSAFE.sub("-", request.label).strip("-.") or "gpu-fleet-worker", image=request.image, env=env,
            labels=labels, network_mode=host.network, runtime="nvidia" if host.gpu_access == "runtime" else None,
            gpu_device=uuid if host.gpu_access == "device-request" else None,
            mem_limit_bytes=int(host.ram_per_gpu_gb * 1e9))

    def _instance(self, host: OwnedHost, c: ContainerView) -> Instance:
        status = _STATUS.get(c.state, "unknown")
        message = f"container {c.state}"
        if c.exit_code is not None:
            message += f" with code {c.exit_code}"
        if c.error:
            message += f": {c.error}"
        uuid = c.labels.get(LABEL_GPU, "")
        return Instance(contract_id=f"{host.name}.{c.id[:12]}", label=c.labels.get(LABEL_FLEET),
                        machine_id=c.labels.get(LABEL_MACHINE) or gpu_machine_id(host.name, uuid), host_id=host.name,
                        status=status, gpu_name=host.gpu_name, price_usd_per_hour=host.cost_usd_per_gpu_hour,
                        image=c.image, status_msg=message, start_date=c.started_at)


class HostOfferError(OfferTakenError):
    """Renting on this host failed for a reason of the host's (HostError): the next offer may be elsewhere."""

    def __init__(self, fault: HostError):
        super().__init__(str(fault))
        self.fault = fault
        self.temporary = fault.temporary


def _registry_auth(image_login: str | None) -> dict[str, str] | None:
    """vast's `-u USER -p PASS SERVER` login string (the slot provider's form) -> the Engine API's auth config."""
    if not image_login:
        return None
    words = shlex.split(image_login)
    auth: dict[str, str] = {}
    rest = []
    it = iter(words)
    for word in it:
        if word == "-u":
            auth["username"] = next(it, "")
        elif word == "-p":
            auth["password"] = next(it, "")
        else:
            rest.append(word)
    if rest:
        auth["serveraddress"] = rest[0]
    return auth if auth.get("username") and auth.get("password") else None

