"""Slot provider: create, read, diff and delete the one instance behind a pool slot.

The same CRUD serves both drivers (one planner, two drivers):
- `SlotResourceProvider` is the Pulumi dynamic provider (infra/hosts.py declares one resource per slot);
  it lives here, in the installed package, because Pulumi pickles the provider by reference and the
  provider process must be able to import it;
- `fleet apply` (reconciler/commands/apply.py) calls `SlotProvider` directly, after `planner.plan()`.

create: query the market with the pool's constraints minus the bad machines, rank the offers
(ranking.py), mint our instance id `<slot>-<6 hex>` and its token, rent the best offer with the worker env
and label = instance id. diff: replace when the instance is dead, its machine is now recorded bad, or the
image digest changed (planner.replace_reason), always delete-before-replace (never pay for two).
read: refresh from the market (gone -> None). delete: destroy (idempotent) and tell the controller.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)

from reconciler.controller_client import admin_client_from
from reconciler.marketplace.base import (
    InstanceRequest,
    Marketplace,
    MarketplaceError,
    PermanentMarketplaceError,
    TemporaryMarketplaceError,
)
from reconciler.planner import (
    REASON_IMAGE_CHANGED,
    REASON_MACHINE_BAD,
    STATUS_GONE,
    ObservedSlot,
    pool_pause,
    replace_reason,
)
from reconciler.ranking import RankedOffer, offer_query, rank_offers
from reconciler.records import RecordSet, write_text_atomic
from reconciler.spec import BenchmarkSettings, FleetSpec, ParamsSettings, PoolSpec
from reconciler.tokens import instance_token, machine_claim

log = logging.getLogger(__name__)

#: Pulumi's placeholder for a value not known during preview (pulumi.runtime.rpc.UNKNOWN).
PULUMI_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"

#: Offers tried per create: the best one may have been rented a moment ago - by someone else, or by a
#: sibling slot that Pulumi creates in parallel from the same ranking.
CREATE_ATTEMPTS = 8

CONTROLLER_SECRET_ENV = "FLEET_CONTROLLER_SECRET"  # noqa: S105 - a variable name, not a secret
VAST_API_KEY_ENV = "VAST_API_KEY"


class SlotError(Exception):
    """A slot could not be created. `temporary`: worth trying again on a later apply."""

    temporary = True


class NoOfferError(SlotError):
    """No offer on the market fits the pool right now (temporary: markets change by the minute)."""


class PoolPausedError(SlotError):
    """The circuit breaker holds this pool: creating would only reproduce a suspect-image failure."""


class SlotInputError(SlotError, ValueError):
    """The slot's inputs are malformed (a bug in a driver, or a hand-edited state file). Permanent."""

    temporary = False


# --- inputs and outputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotInputs:
    """Everything a slot's create/diff needs. Plain data: it is Pulumi resource input and JSON state."""

    slot: str
    pool: PoolSpec
    image: str  # what the market runs: `repo@sha256:...` (never a mutable tag) or, locally, a directory
    image_digest: str
    controller_url: str
    params: ParamsSettings = field(default_factory=ParamsSettings)
    bad_machine_ids: frozenset[str] = frozenset()
    measured: Mapping[str, float] = field(default_factory=dict)  # machine_id -> median proofs/hour
    priors: Mapping[str, float] = field(default_factory=dict)  # gpu model -> proofs/hour per GPU
    paused_reason: str | None = None  # set by the driver when planner.pool_pause() holds the pool
    params_dir: str | None = None

    def to_props(self) -> dict[str, Any]:
        pool = asdict(self.pool)
        props: dict[str, Any] = {
            "slot": self.slot, "pool": pool, "image": self.image, "image_digest": self.image_digest,
            "controller_url": self.controller_url, "params": {k: v for k, v in asdict(self.params).items()
                                                              if v is not None},
            "bad_machine_ids": sorted(self.bad_machine_ids), "measured": dict(sorted(self.measured.items())),
            "priors": dict(sorted(self.priors.items())),
        }
        if self.paused_reason:
            props["paused_reason"] = self.paused_reason
        if self.params_dir:
            props["params_dir"] = self.params_dir
        return props

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> SlotInputs:
        try:
            pool_raw = dict(props["pool"])
            bench = BenchmarkSettings(**dict(pool_raw.pop("benchmark", {}) or {}))
            pool = PoolSpec(**pool_raw, benchmark=bench)
            return cls(
                slot=str(props["slot"]), pool=pool, image=str(props["image"]),
                image_digest=str(props["image_digest"]), controller_url=str(props["controller_url"]),
                params=ParamsSettings(**dict(props.get("params") or {})),
                bad_machine_ids=frozenset(str(m) for m in props.get("bad_machine_ids") or ()),
                measured={str(k): float(v) for k, v in dict(props.get("measured") or {}).items()},
                priors={str(k): float(v) for k, v in dict(props.get("priors") or {}).items()},
                paused_reason=props.get("paused_reason") or None,
                params_dir=props.get("params_dir") or None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SlotInputError(f"slot inputs {props.get('slot', '?')!r}: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class SlotOutputs:
    """What a created slot is: our instance id, the market's contract, the machine, the image it runs."""

    slot: str
    pool_name: str  # not `pool`: Pulumi state merges inputs and outputs, and the input `pool` is the spec
    instance_id: str
    contract_id: str
    machine_id: str
    host_id: str
    gpu_name: str
    price_usd_per_hour: float
    image: str
    image_digest: str
    status: str = "loading"
    expected_proofs_per_hour: float | None = None
    ranking_basis: str | None = None
    created_at: float | None = None

    def to_props(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> SlotOutputs:
        names = cls.__dataclass_fields__
        try:
            values = {k: v for k, v in props.items() if k in names}
            return cls(**values)
        except TypeError as exc:
            raise SlotInputError(f"slot outputs {props.get('slot', '?')!r}: {exc}") from None

    def observed(self) -> ObservedSlot:
        return ObservedSlot(slot=self.slot, pool=self.pool_name, instance_id=self.instance_id,
                            machine_id=self.machine_id, image_digest=self.image_digest, status=self.status,
                            contract_id=self.contract_id)


@dataclass(frozen=True)
class SlotDiff:
    replace: bool
    reason: str | None = None
    detail: str = ""
    replaces: tuple[str, ...] = ()  # input properties that force the replacement (for Pulumi's diff display)


def slot_inputs(spec: FleetSpec, pool: PoolSpec, slot: str, records: RecordSet, *, image: str,
                image_digest: str, params_dir: str | None = None) -> SlotInputs:
    """The inputs of one slot, as both drivers build them from the spec and the records.

    Measured rates are limited to machines of the pool's GPU model (or of unknown model): other machines
    can never match the pool's query, and keeping them out keeps every slot's inputs small and stable."""
    pause = pool_pause(pool.name, records, image_digest)
    measured = {m: p.median_proofs_per_hour for m, p in sorted(records.perf_history().items())
                if p.gpu_name in (None, pool.gpu_name)}
    prior = spec.prior_proofs_per_hour(pool.gpu_name)
    return SlotInputs(
        slot=slot, pool=pool, image=image, image_digest=image_digest, controller_url=spec.controller.url,
        params=spec.params, bad_machine_ids=records.bad_machine_ids(), measured=measured,
        priors={pool.gpu_name: prior} if prior is not None else {},
        paused_reason=pause.describe() if pause else None, params_dir=params_dir)


# --- the worker's environment --------------------------------------------------------------------------------


def worker_env(inputs: SlotInputs, instance_id: str, token: str, offer: RankedOffer, claim: str) -> dict[str, str]:
    """The FLEET_* variables the worker entrypoint reads (see HELPERS.md, worker protocol)."""
    bench = inputs.pool.benchmark
    env = {
        "FLEET_CONTROLLER_URL": inputs.controller_url,
        "FLEET_INSTANCE_ID": instance_id,
        "FLEET_TOKEN": token,
        "FLEET_POOL": inputs.pool.name,
        "FLEET_SLOT": inputs.slot,
        "FLEET_MACHINE_ID": offer.offer.machine_id,
        "FLEET_MACHINE_CLAIM": claim,
        "FLEET_HOST_ID": offer.offer.host_id,
        "FLEET_GPU_NAME": offer.offer.gpu_name,
        "FLEET_IMAGE_DIGEST": inputs.image_digest,
        "FLEET_BENCH_PROOF_TYPE": bench.proof_type,
        "FLEET_BENCH_PROOFS": str(bench.proofs),
        "FLEET_BENCH_CONCURRENCY": str(bench.concurrency),
        "FLEET_BENCH_TIMEOUT_S": str(round(bench.timeout_seconds)),
        "FLEET_AFTER_BENCH": bench.after,
        "FLEET_PARAMS_SECTOR_SIZE": inputs.params.sector_size,
        "FLEET_PARAMS_TIMEOUT_S": str(round(inputs.params.fetch_timeout_minutes * 60)),
    }
    if inputs.params.base_url:
        env["FLEET_PARAMS_BASE_URL"] = inputs.params.base_url
    if inputs.params_dir:
        env["FLEET_PARAMS_DIR"] = inputs.params_dir
    return env


def new_nonce() -> str:
    return secrets.token_hex(3)


# --- the provider ----------------------------------------------------------------------------------------


class SlotProvider:
    """CRUD of one slot's instance over a `Marketplace`. No Pulumi, no files: drivers own state."""

    def __init__(self, marketplace: Marketplace, controller_secret: bytes, *,
                 nonce: Callable[[], str] = new_nonce, clock: Callable[[], float] = time.time,
                 on_destroyed: Callable[[SlotOutputs], None] | None = None, image_login: str | None = None):
        """`image_login`: registry credentials for pulling a private image (vast's `-u USER -p PASS SERVER`)."""
        self.marketplace = marketplace
        self._image_login = image_login
        self._secret = controller_secret
        self._nonce = nonce
        self._clock = clock
        self._on_destroyed = on_destroyed

    def create(self, inputs: SlotInputs) -> SlotOutputs:
        if inputs.paused_reason:
            raise PoolPausedError(f"slot {inputs.slot}: {inputs.paused_reason}")
        query = offer_query(inputs.pool, inputs.bad_machine_ids)
        offers = self.marketplace.search_offers(query)
        ranked = rank_offers(offers, inputs.pool, inputs.measured, inputs.priors, inputs.bad_machine_ids)
        if not ranked:
            raise NoOfferError(f"slot {inputs.slot}: no offer fits pool {inputs.pool.name} "
                               f"({describe_constraints(inputs.pool)}; {len(inputs.bad_machine_ids)} bad machine(s) "
                               f"excluded; market returned {len(offers)} offer(s)); will retry on the next apply")
        instance_id = f"{inputs.slot}-{self._nonce()}"
        token = instance_token(self._secret, instance_id)
        errors: list[str] = []
        for candidate in ranked[:CREATE_ATTEMPTS]:
            request = InstanceRequest(image=inputs.image, disk_gb=inputs.pool.disk_gb, label=instance_id,
                                      env=worker_env(inputs, instance_id, token, candidate,
                                                     machine_claim(self._secret, instance_id,
                                                                   candidate.offer.machine_id)),
                                      image_login=self._image_login)
            try:
                contract_id = self.marketplace.create_instance(candidate.offer.offer_id, request)
            except PermanentMarketplaceError as exc:
                # Most often "offer no longer available": someone rented it after our search. Try the next.
                errors.append(f"{candidate.describe()}: {exc}")
                continue
            log.info("slot %s: rented %s as %s (contract %s)", inputs.slot, candidate.describe(), instance_id,
                     contract_id)
            return SlotOutputs(
                slot=inputs.slot, pool_name=inputs.pool.name, instance_id=instance_id, contract_id=str(contract_id),
                machine_id=candidate.offer.machine_id, host_id=candidate.offer.host_id,
                gpu_name=candidate.offer.gpu_name, price_usd_per_hour=candidate.offer.price_usd_per_hour,
                image=inputs.image, image_digest=inputs.image_digest, status="loading",
                expected_proofs_per_hour=candidate.expected_proofs_per_hour, ranking_basis=candidate.basis,
                created_at=self._clock())
        raise PermanentMarketplaceError(f"slot {inputs.slot}: every candidate offer was refused: " + "; ".join(errors))

    def diff(self, old: SlotOutputs, new: SlotInputs) -> SlotDiff:
        return slot_diff(old, new)

    def read(self, old: SlotOutputs) -> SlotOutputs | None:
        """The slot as the market sees it now; None when the market no longer knows the instance."""
        instance = self.marketplace.get_instance(old.contract_id)
        if instance is None:
            return None
        return replace(old, status=instance.status,
                       price_usd_per_hour=instance.price_usd_per_hour or old.price_usd_per_hour)

    def delete(self, old: SlotOutputs) -> None:
        self.marketplace.destroy_instance(old.contract_id)
        if self._on_destroyed is not None:
            # Telling the controller is a courtesy (it stops waiting for reports); failing it must not
            # leave a destroyed instance in state as if it still ran.
            try:
                self._on_destroyed(old)
            except Exception as exc:
                log.warning("slot %s: instance %s destroyed, but telling the controller failed: %s",
                            old.slot, old.instance_id, exc)

    def observe(self, stored: Mapping[str, SlotOutputs]) -> dict[str, ObservedSlot]:
        """Current state of every stored slot (market errors propagate: never plan on a failed look)."""
        out: dict[str, ObservedSlot] = {}
        for slot, outputs in stored.items():
            fresh = self.read(outputs)
            out[slot] = fresh.observed() if fresh is not None else replace(outputs, status=STATUS_GONE).observed()
        return out


def slot_diff(old: SlotOutputs, new: SlotInputs) -> SlotDiff:
    """Pure: must the slot's instance be replaced to match `new`? (planner.replace_reason decides.)

    A digest Pulumi does not know yet (preview of a rebuild) is reported as a possible replacement. A
    paused pool replaces nothing: delete-before-replace would destroy a working instance and then be
    refused a new one."""
    unknown = new.image_digest == PULUMI_UNKNOWN
    why = replace_reason(old.machine_id, old.image_digest, old.status, new.bad_machine_ids,
                         None if unknown else new.image_digest)
    if why is None and unknown:
        why = (REASON_IMAGE_CHANGED, "image digest not known until the image is built: may change")
    if why is None:
        return SlotDiff(replace=False)
    if new.paused_reason:
        return SlotDiff(replace=False, reason=why[0], detail=f"{why[1]}; held: {new.paused_reason}")
    prop = {REASON_MACHINE_BAD: "bad_machine_ids", REASON_IMAGE_CHANGED: "image_digest"}.get(why[0], "status")
    return SlotDiff(replace=True, reason=why[0], detail=why[1], replaces=(prop,))


def describe_constraints(pool: PoolSpec) -> str:
    return (f"gpu {pool.gpu_name} x{pool.gpus_per_instance}, <= ${pool.max_price_usd_per_hour}/h, reliability >= "
            f"{pool.min_reliability}, inet_down >= {pool.min_inet_down_mbps} Mbps, disk >= {pool.disk_gb} GB, "
            f"host RAM >= {pool.min_host_ram_gb} GB, CUDA >= {pool.min_cuda}"
            + (", verified hosts only" if pool.verified_only else ""))


# --- local worker-image digest ------------------------------------------------------------------------------

_DIGEST_SKIP = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def directory_digest(path: str | Path) -> str:
    """`sha256:` over every file of a worker-image directory (names, exec bits, contents).

    The local backend's stand-in for a registry digest: editing any script changes it, so the planner
    replaces the slots running the old one, exactly as a new pushed image does under Pulumi."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"worker image directory {root} not found")
    h = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file() and not (_DIGEST_SKIP & set(p.parts))):
        rel = file.relative_to(root).as_posix()
        executable = bool(file.stat().st_mode & stat.S_IXUSR)
        h.update(f"{rel}\0{int(executable)}\0".encode())
        h.update(hashlib.sha256(file.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


def digest_of_image_ref(ref: str) -> str:
    """`repo@sha256:abc` -> `sha256:abc`. A ref without a digest is refused: mutable tags are not pinned."""
    _, sep, digest = ref.rpartition("@")
    if not sep or not digest.startswith("sha256:"):
        raise SlotInputError(f"image reference {ref!r} is not pinned by digest (expected repo@sha256:...)")
    return digest


# --- `fleet apply` slot state file ----------------------------------------------------------------------

SLOT_STATE_FILE = "slots.json"


def load_slot_state(path: Path) -> dict[str, SlotOutputs]:
    """Slot -> outputs, as the last `fleet apply` left them. Missing file: no slots yet."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise SlotInputError(f"{path}: unreadable slot state ({exc}); fix or move it away (instances it "
                             "lists keep running and would be forgotten)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("slots"), dict):
        raise SlotInputError(f"{path}: expected {{\"version\": 1, \"slots\": {{...}}}}")
    return {slot: SlotOutputs.from_props(props) for slot, props in doc["slots"].items()}


def save_slot_state(path: Path, slots: Mapping[str, SlotOutputs]) -> None:
    doc = {"version": 1, "slots": {s: o.to_props() for s, o in sorted(slots.items())}}
    write_text_atomic(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


# --- marketplace from settings (both drivers) --------------------------------------------------------------


def build_marketplace(backend: Mapping[str, Any], secret_values: Mapping[str, str]) -> Marketplace:
    """A marketplace adapter from plain settings: what a pickled Pulumi provider can carry.

    backend["kind"] == "local": state_dir, machines_file, optional worker_command (list).
    backend["kind"] == "vastai": optional base_url; the API key comes from `secret_values["vast_api_key"]`
    (stack config secret) or the VAST_API_KEY environment variable.
    """
    kind = backend.get("kind")
    if kind == "local":
        from reconciler.marketplace.local import LocalMarketplace, load_local_machines

        machines = load_local_machines(backend["machines_file"])
        command = backend.get("worker_command") or None
        return LocalMarketplace(backend["state_dir"], machines, worker_command=command)
    if kind == "vastai":
        from reconciler.marketplace.vastai import DEFAULT_BASE_URL, VastAiMarketplace

        key = secret_values.get("vast_api_key") or os.environ.get(VAST_API_KEY_ENV)
        return VastAiMarketplace(key, base_url=backend.get("base_url") or DEFAULT_BASE_URL)
    raise PermanentMarketplaceError(f"unknown marketplace backend {kind!r} (expected local or vastai)")


def image_login_from(secret_values: Mapping[str, str]) -> str | None:
    """The market's pull credentials for the pushed image (the push credentials serve: same registry)."""
    parts = [secret_values.get(k) for k in ("registry_username", "registry_password", "registry_server")]
    if not all(parts):
        return None
    user, password, server = parts
    return f"-u {user} -p {password} {server}"


def controller_secret_from(secret_values: Mapping[str, str]) -> bytes:
    value = secret_values.get("controller_secret") or os.environ.get(CONTROLLER_SECRET_ENV)
    if not value:
        raise SlotInputError(f"no controller secret: set the stack config secret fleet:controllerSecret or "
                             f"{CONTROLLER_SECRET_ENV}")
    return value.encode("utf-8")


# --- Pulumi dynamic provider --------------------------------------------------------------------------------


class SlotResourceProvider(ResourceProvider):
    """Pulumi dynamic provider over `SlotProvider`. Carries only plain backend settings when pickled; the
    vast.ai API key and the controller secret are read in `configure` from the stack config secrets
    (`fleet:vastaiApiKey`, `fleet:controllerSecret`), or from the environment."""

    def __init__(self, backend: Mapping[str, Any]):
        super().__init__()
        self.backend = dict(backend)
        self._secrets: dict[str, str] = {}
        self._slot_provider: SlotProvider | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Never pickle secrets or live clients into the Pulumi state.
        return {"backend": self.backend, "_secrets": {}, "_slot_provider": None}

    def configure(self, req: Any) -> None:
        for key, name in (("vastaiApiKey", "vast_api_key"), ("controllerSecret", "controller_secret"),
                          ("controllerAdminToken", "controller_admin_token"),
                          ("registryServer", "registry_server"), ("registryUsername", "registry_username"),
                          ("registryPassword", "registry_password")):
            value = req.config.get(key)
            if value:
                self._secrets[name] = str(value)

    def slot_provider(self) -> SlotProvider:
        if self._slot_provider is None:
            notifier = admin_client_from(self.backend.get("controller_url"),
                                         self._secrets.get("controller_admin_token"))
            self._slot_provider = SlotProvider(
                build_marketplace(self.backend, self._secrets), controller_secret_from(self._secrets),
                image_login=image_login_from(self._secrets),
                on_destroyed=(lambda out: notifier.mark_destroyed(out.instance_id)) if notifier else None)
        return self._slot_provider

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        if any(v == PULUMI_UNKNOWN for v in news.values()):
            return CheckResult(news, [])
        try:
            SlotInputs.from_props(news)
        except SlotInputError as exc:
            return CheckResult(news, [CheckFailure("pool", str(exc))])
        return CheckResult(news, [])

    def create(self, props: dict[str, Any]) -> CreateResult:
        outputs = self.slot_provider().create(SlotInputs.from_props(props))
        return CreateResult(outputs.instance_id, {**_inputs_only(props), **outputs.to_props()})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # In a preview, inputs computed from other resources are PULUMI_UNKNOWN. The digest is judged by
        # slot_diff (may replace); any other unknown is read as its old value so the inputs still parse.
        news = {k: (olds.get(k) if v == PULUMI_UNKNOWN and k != "image_digest" else v) for k, v in news.items()}
        old = SlotOutputs.from_props(olds)
        result = slot_diff(old, SlotInputs.from_props(news))
        if result.replace:
            return DiffResult(changes=True, replaces=list(result.replaces), delete_before_replace=True)
        changed = _inputs_only(olds) != _inputs_only(news)
        return DiffResult(changes=changed, replaces=[], delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # Only inputs that steer the *next* create changed (ranking data, constraints): the instance stays.
        old = SlotOutputs.from_props(olds)
        return UpdateResult({**_inputs_only(news), **old.to_props()})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        fresh = self.slot_provider().read(SlotOutputs.from_props(props))
        if fresh is None:
            return ReadResult(None, {})
        return ReadResult(id_, {**_inputs_only(props), **fresh.to_props()})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        self.slot_provider().delete(SlotOutputs.from_props(props))


_INPUT_KEYS = frozenset(SlotInputs.__dataclass_fields__)


def _inputs_only(props: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in props.items() if k in _INPUT_KEYS}


def is_temporary(exc: BaseException) -> bool:
    """Whether a failed slot action is worth retrying on a later apply."""
    if isinstance(exc, SlotError):
        return exc.temporary
    return isinstance(exc, TemporaryMarketplaceError)


def describe_error(exc: BaseException) -> str:
    """One line for the operator: our own errors already say what happened; others get their type."""
    return str(exc) if isinstance(exc, SlotError | MarketplaceError) else f"{type(exc).__name__}: {exc}"

