"""Small injected fakes shared across the suite (tests never sleep on real time)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from reconciler.adapters.capacity_files import CAPACITY_FILE, parse_capacity
from reconciler.adapters.git import CommitRequest, FileChange, PublishResult, PushRejected
from reconciler.adapters.marketplace.hosts import (
    CAUSE_PULL_REFUSED,
    CAUSE_UNKNOWN_GPU,
    ContainerRequest,
    ContainerView,
    EngineInfo,
    HostError,
)
from reconciler.adapters.record_files import parse_image_record, parse_machine_record
from reconciler.adapters.spec_files import check_spec_text
from reconciler.domain.capacity import CapacityEntry, apply_entries
from reconciler.domain.marketplace import Instance, InstanceRequest, Offer, OfferQuery, OfferTakenError
from reconciler.domain.records import (
    IMAGES_DIR,
    MACHINES_DIR,
    ImageSuspectRecord,
    MachineRecord,
    RecordError,
    RecordSet,
)
from reconciler.domain.spec import FleetSpec, SpecError, SpecProblem


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


@dataclass(frozen=True)
class FakeCommit:
    sha: str
    request: CommitRequest
    files: Mapping[str, str]  # the whole tree after it


class FakeFleetTree:
    """The shared fake of the pass's `FleetTree` port (flows/judge.py): the repository as a dict of file texts, its
    history as a list of commits. The view parses the files with the same functions the git adapter's loaders use
    (spec schema and semantics, record schema), so what a pass commits is what the next pass reads.

    `refuse_pushes`: that many pushes are refused (a busy branch); `on_refused` runs after each refusal with the
    refused request, before the tree is read again (another leader or a human pushed meanwhile: `edit`). `edit`
    stands for someone else's commit."""

    def __init__(self, files: Mapping[str, str], *, spec_dir: str = "fleet-spec", max_attempts: int = 3) -> None:
        self.files: dict[str, str] = dict(files)
        self.spec_dir = spec_dir
        self.max_attempts = max_attempts
        self.commits: list[FakeCommit] = []
        self.refuse_pushes = 0
        self.on_refused: Callable[[CommitRequest], None] | None = None
        self.views = 0  # how many times a pass read the tree (once per attempt)

    def edit(self, changes: Mapping[str, str | None], message: str = "human edit") -> None:
        """A human's commit (a pardon, a ban)."""
        self._commit(CommitRequest(message, "", (), tuple(FileChange(path, text) for path, text in changes.items())))

    def commit(self, request: CommitRequest) -> str:
        """Someone else's commit as it is (another leader's records and trailers)."""
        return self._commit(request)

    def publish(self, build: Callable[[FakeTreeView], CommitRequest | None], *,
                before_push: Callable[[], None] | None = None) -> PublishResult:
        for attempt in range(1, self.max_attempts + 1):
            self.views += 1
            request = build(FakeTreeView(self, dict(self.files)))
            if request is None or _applied(self.files, request) == self.files:
                return PublishResult(None, attempt, False)  # no empty commits
            if before_push is not None:
                before_push()
            if self.refuse_pushes:
                self.refuse_pushes -= 1
                if self.on_refused is not None:
                    self.on_refused(request)
                continue
            return PublishResult(self._commit(request), attempt, True)
        raise PushRejected(f"push failed {self.max_attempts} time(s); the next pass recomputes and retries")

    def _commit(self, request: CommitRequest) -> str:
        self.files = _applied(self.files, request)
        sha = hashlib.sha1(f"{len(self.commits)}:{request.message()}".encode()).hexdigest()  # noqa: S324 - an id
        self.commits.append(FakeCommit(sha, request, dict(self.files)))
        return sha

    def trailer_values(self, key: str) -> frozenset[str]:
        return frozenset(v for c in self.commits for k, v in c.request.trailers if k == key)

    def file(self, path: str) -> str | None:
        return self.files.get(f"{self.spec_dir}/{path}")


def _applied(files: Mapping[str, str], request: CommitRequest) -> dict[str, str]:
    out = dict(files)
    for change in request.changes:
        if change.content is None:
            out.pop(change.path, None)
        else:
            out[change.path] = change.content
    return out


class FakeTreeView:
    """One tip of a FakeFleetTree, as the pass's `FleetTreeView` port."""

    def __init__(self, tree: FakeFleetTree, files: Mapping[str, str]) -> None:
        self._tree = tree
        self._files = files
        self.spec_dir = tree.spec_dir

    def spec(self) -> FleetSpec:
        path = f"{self.spec_dir}/fleet.yaml"
        if path not in self._files:
            raise SpecError([SpecProblem(path, "$", "file not found")])
        spec, problems = check_spec_text(self._files[path], path)
        if spec is None:
            raise SpecError(problems)
        if not any(p.min_count is not None for p in spec.pools):
            return spec
        entries, problems = parse_capacity(self._files.get(f"{self.spec_dir}/{CAPACITY_FILE}", ""), CAPACITY_FILE)
        if problems:
            raise SpecError(problems)
        return apply_entries(spec, entries)

    def records(self) -> RecordSet:
        machines: dict[str, MachineRecord] = {}
        images: dict[str, ImageSuspectRecord] = {}
        problems: list[str] = []
        unreadable: set[str] = set()
        for path, text in sorted(self._files.items()):
            where = Path(path)
            if where.suffix != ".yaml" or str(where.parent.parent) != self.spec_dir:
                continue
            try:
                if where.parent.name == MACHINES_DIR:
                    rec = parse_machine_record(text, where)
                    machines[rec.machine_id] = rec
                elif where.parent.name == IMAGES_DIR:
                    img = parse_image_record(text, where)
                    images[img.image_digest] = img
            except RecordError as exc:
                problems.append(str(exc))
                if where.parent.name == MACHINES_DIR:
                    unreadable.add(where.stem)
        return RecordSet(machines, images, tuple(problems), frozenset(unreadable))

    def capacity(self) -> Mapping[str, CapacityEntry]:
        return parse_capacity(self._files.get(f"{self.spec_dir}/{CAPACITY_FILE}", ""), CAPACITY_FILE)[0]

    def trailer_values(self, key: str) -> frozenset[str]:
        return self._tree.trailer_values(key)

    def text(self, path: str) -> str | None:
        return self._files.get(f"{self.spec_dir}/{path}")

    def names(self, directory: str) -> list[str]:
        prefix = f"{self.spec_dir}/{directory}/"
        return sorted(p.removeprefix(f"{self.spec_dir}/") for p in self._files if p.startswith(prefix))
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
