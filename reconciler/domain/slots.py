"""Slot model: what one pool slot asks of the market, what it got, and whether it must be replaced.

Pure. The Pulumi dynamic provider (`reconciler.adapters.pulumi_provider`) and `fleet apply`
(`reconciler.flows.provision`) both carry `SlotInputs`/`SlotOutputs` and ask `slot_diff`; the worker's
environment is built here from the inputs, the rented offer and the minted token.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from reconciler.domain import errors
from reconciler.domain.planner import (
    REASON_IMAGE_CHANGED,
    REASON_MACHINE_BAD,
    ObservedSlot,
    pool_pause,
    replace_reason,
)
from reconciler.domain.ranking import RankedOffer
from reconciler.domain.records import RecordSet
from reconciler.domain.spec import BenchmarkSettings, FleetSpec, ParamsSettings, PoolSpec

#: Pulumi's placeholder for a value not known during preview (pulumi.runtime.rpc.UNKNOWN).
PULUMI_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


class SlotError(errors.FleetError):
    """A slot could not be created. `temporary`: worth trying again on a later apply."""

    temporary = True


class NoOfferError(SlotError):
    """No offer on the market fits the pool right now (temporary: markets change by the minute)."""

    reason = errors.NO_OFFER


class PoolPausedError(SlotError):
    """The circuit breaker holds this pool: creating would only reproduce a suspect-image failure."""

    reason = errors.POOL_PAUSED


class SlotInputError(SlotError, ValueError):
    """The slot's inputs are malformed (a bug in a driver, or a hand-edited state file). Permanent."""

    temporary = False
    reason = errors.STATE_INVALID


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


def digest_of_image_ref(ref: str) -> str:
    """`repo@sha256:abc` -> `sha256:abc`. A ref without a digest is refused: mutable tags are not pinned."""
    _, sep, digest = ref.rpartition("@")
    if not sep or not digest.startswith("sha256:"):
        raise SlotInputError(f"image reference {ref!r} is not pinned by digest (expected repo@sha256:...)")
    return digest
