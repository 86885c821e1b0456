"""Small injected fakes shared across the suite (tests never sleep on real time)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from reconciler.adapters.marketplace.hosts import (
    CAUSE_PULL_REFUSED,
    CAUSE_UNKNOWN_GPU,
    ContainerRequest,
    ContainerView,
    EngineInfo,
    HostError,
)
from reconciler.domain.marketplace import Instance, InstanceRequest, Offer, OfferQuery, OfferTakenError


class Sleeps:
    """The injected sleep: records what the code under test asked for and never waits."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class FakeMarket:
    """The shared fake of our `Marketplace` port, in memory; records every call.

    `filter_queries=False` returns every offer whatever the query says (the slot provider must not trust a
    market's filtering); True filters by GPU and exclusions, as a well-behaved market would. A machine
    rented and not destroyed leaves later searches when `exclusive` (Pulumi creates slots in parallel, and
    renting one taken meanwhile is refused, as on a real market). `refuse` names offers that sold.
    """

    def __init__(self, offers: Sequence[Offer], *, filter_queries: bool = False, exclusive: bool = False,
                 first_contract_id: int = 1000):
        self.offers = list(offers)
        self.filter_queries = filter_queries
        self.exclusive = exclusive
        self.first_contract_id = first_contract_id
        self.lock = threading.Lock()
        self.queries: list[OfferQuery] = []
        self.created: dict[str, tuple[Offer, InstanceRequest]] = {}
        self.statuses: dict[str, str] = {}
        self.refuse: set[str] = set()
        self.destroyed: list[str] = []

    @property
    def rented(self) -> dict[str, str]:
        """contract id -> machine id of instances not destroyed."""
        return {cid: self.created[cid][0].machine_id for cid in self.statuses}

    def search_offers(self, query: OfferQuery) -> Sequence[Offer]:
        with self.lock:
            self.queries.append(query)
            taken = set(self.rented.values()) if self.exclusive else set()
            return [o for o in self.offers if o.machine_id not in taken and (
                not self.filter_queries
                or (o.gpu_name == query.gpu_name and o.machine_id not in query.exclude_machine_ids))]

    def create_instance(self, offer_id: str, request: InstanceRequest) -> str:
        with self.lock:
            found = next((o for o in self.offers if o.offer_id == offer_id), None)
            taken = self.exclusive and found is not None and found.machine_id in self.rented.values()
            if found is None or offer_id in self.refuse or taken:
                raise OfferTakenError(f"offer {offer_id} no longer available")
            cid = str(self.first_contract_id + len(self.created))
            self.created[cid] = (found, request)
            self.statuses[cid] = "loading"
            return cid

    def list_instances(self) -> Sequence[Instance]:
        return [i for c in list(self.statuses) if (i := self.get_instance(c)) is not None]

    def get_instance(self, contract_id: str) -> Instance | None:
        if contract_id not in self.statuses:
            return None
        found, request = self.created[contract_id]
        return Instance(contract_id=contract_id, label=request.label, machine_id=found.machine_id,
                        host_id=found.host_id, status=self.statuses[contract_id], gpu_name=found.gpu_name,
                        price_usd_per_hour=found.price_usd_per_hour, image=request.image)

    def destroy_instance(self, contract_id: str) -> None:
        with self.lock:
            self.destroyed.append(contract_id)
            self.statuses.pop(contract_id, None)


class FakeDockerEngine:
    """Our fake of the hosts adapter's `DockerEngine` port: one host's containers in memory.

    `fault`: a HostError every call raises (the host is down, refuses SSH, ...); `runtimes`: what `docker info`
    lists; `gpus`: what nvidia-smi would list; `pull_error`/`start_error`: a registry's or the runtime's refusal."""

    def __init__(self, host: str, *, runtimes: Sequence[str] = ("nvidia", "runc"), gpus: Sequence[str] = (),
                 pull_error: str | None = None, start_error: str | None = None) -> None:
        self.host = host
        self.runtimes = frozenset(runtimes)
        self.gpus = list(gpus)
        self.pull_error = pull_error
        self.start_error = start_error
        self.fault: HostError | None = None
        self.runs: list[ContainerRequest] = []
        self.pulled: list[tuple[str, object]] = []
        self.removed: list[str] = []
        self.by_id: dict[str, ContainerView] = {}

    def _check(self) -> None:
        if self.fault is not None:
            raise self.fault

    def info(self) -> EngineInfo:
        self._check()
        return EngineInfo(runtimes=self.runtimes, server_version="28.2.2")

    def containers(self, label_key: str) -> list[ContainerView]:
        self._check()
        return [c for c in self.by_id.values() if label_key in c.labels]

    def container(self, container_id: str) -> ContainerView | None:
        self._check()
        return next((c for cid, c in self.by_id.items() if cid.startswith(container_id)), None)

    def pull(self, image: str, auth: object) -> None:
        self._check()
        if self.pull_error:
            raise HostError(self.host, CAUSE_PULL_REFUSED, f"cannot pull {image}: {self.pull_error}", temporary=False)
        self.pulled.append((image, auth))

    def run(self, request: ContainerRequest) -> str:
        self._check()
        if self.start_error:
            raise HostError(self.host, CAUSE_UNKNOWN_GPU, self.start_error, temporary=False)
        cid = f"{len(self.runs) + 1:012x}" + "0" * 52
        self.runs.append(request)
        self.by_id[cid] = ContainerView(id=cid, name=request.name, labels=dict(request.labels), state="running",
                                        image=request.image, started_at=1700.0, runtime=request.runtime or "")
        return cid

    def set_state(self, container_id: str, state: str, exit_code: int | None = None) -> None:
        cid = next(c for c in self.by_id if c.startswith(container_id))
        self.by_id[cid] = replace(self.by_id[cid], state=state, exit_code=exit_code)

    def remove(self, container_id: str) -> None:
        self._check()
        for cid in [c for c in self.by_id if c.startswith(container_id)]:
            del self.by_id[cid]
            self.removed.append(cid)

    def gpu_uuids(self, image: str) -> list[str]:
        self._check()
        return list(self.gpus)

    def close(self) -> None:
        pass
