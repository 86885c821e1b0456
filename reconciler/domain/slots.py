"""Slot model: what one pool slot asks of the market, what it got, and whether it must be replaced.

Pure. The Pulumi dynamic provider (`reconciler.adapters.pulumi_provider`) and `fleet apply`
(`reconciler.flows.provision`) both carry `SlotInputs`/`SlotOutputs` and ask `slot_diff`; the worker's
environment is built here from the inputs, the rented offer and the minted token.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from datetime import datetime
from typing import Any

from reconciler.domain import errors
from reconciler.domain.hosts import excluded_by_hosts
from reconciler.domain.marketplace import Offer, OfferQuery
from reconciler.domain.planner import (
    REASON_IMAGE_CHANGED,
    REASON_MACHINE_BAD,
    ObservedSlot,
    pool_pause,
    replace_reason,
)
from reconciler.domain.ranking import RankedOffer, describe_wants, misfit, offer_query
from reconciler.domain.records import RecordSet
from reconciler.domain.spec import FleetSpec, ParamsSettings, PoolSpec, fleet_label_prefix

#: Pulumi's placeholder for a value not known during preview (pulumi.runtime.rpc.UNKNOWN): the wire form.
#: In Check and Diff the SDK's provider host hands the provider `pulumi.output.Unknown` objects instead;
#: the Pulumi adapter maps those to `UNKNOWN` below before decoding (the domain does not import pulumi).
PULUMI_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


class _Unknown:
    """A value not known yet (Pulumi preview). Deliberately falsy-proof: using it as a bool is a bug."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        raise TypeError("an unknown (preview) value has no truth value: decode it first")

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


class SlotError(errors.FleetError):
    """A slot could not be created. `temporary`: worth trying again on a later apply."""

    temporary = True


class NoOfferError(SlotError):
    """No offer on the market fits the pool right now (temporary: markets change by the minute)."""

    reason = errors.NO_OFFER


class PoolPausedError(SlotError):
    """The circuit breaker holds this pool: creating would only reproduce a suspect-image failure."""

    reason = errors.POOL_PAUSED


class SpendCapError(SlotError):
    """Renting for this slot could take the fleet past its spend cap (`max_total_dph`). Temporary: spend
    drops when instances go, and the cap may be raised in the spec."""

    reason = errors.SPEND_CAP


class SlotInputError(SlotError, ValueError):
    """The slot's inputs are malformed (a bug in a driver, or a hand-edited state file). Permanent."""

    temporary = False
    reason = errors.STATE_INVALID

    def __init__(self, message: str, *, field: str | None = None, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.field = field


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
    #: Marketplace label prefix of this fleet (`gpu-fleet/<spec name>/`): label = prefix + instance id.
    label_prefix: str = fleet_label_prefix("main")
    #: Fleet spend cap ($/h over every instance carrying `label_prefix`); None: no cap.
    max_total_dph: float | None = None
    #: An autoscaled pool shrinks by this slot: its worker finishes its proofs; never replaced meanwhile.
    draining: bool = False
    #: Machines to benchmark once more (an unknown failure no correlation decided: domain/correlation.py): an
    #: offer on one of them is rented first, while the market offers it (it is never a reason to replace).
    retest_machine_ids: frozenset[str] = frozenset()

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
        props["label_prefix"] = self.label_prefix
        if self.max_total_dph is not None:
            props["max_total_dph"] = self.max_total_dph
        if self.draining:
            props["draining"] = True
        if self.retest_machine_ids:
            props["retest_machine_ids"] = sorted(self.retest_machine_ids)
        return props

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> SlotInputs:
        return decode_slot_inputs(props)


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
    #: Since when (epoch s) the instance has had `status` (the status table's deadlines count from here).
    status_since: float | None = None
    label: str | None = None  # the marketplace label (None in state written before labels had a prefix)

    def to_props(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> SlotOutputs:
        return decode_slot_outputs(props)

    def observed(self) -> ObservedSlot:
        return ObservedSlot(slot=self.slot, pool=self.pool_name, instance_id=self.instance_id,
                            machine_id=self.machine_id, image_digest=self.image_digest, status=self.status,
                            contract_id=self.contract_id,
                            status_since=self.status_since if self.status_since is not None else self.created_at,
                            price_usd_per_hour=self.price_usd_per_hour)


# --- the typed boundary: one decode for provider inputs and outputs ------------------------------------------
#
# Values that crossed Pulumi's gRPC boundary are protobuf Struct values: every number is a double (an int
# field arrives as 10.0), None-valued keys are dropped, and during preview some values are unknown. Every
# read of provider props goes through `decode_slot_inputs` / `decode_slot_outputs`, which coerce each
# field to its declared type (int, float, bool, str, list/tuple/frozenset, mapping, nested dataclass) and
# refuse anything else naming the slot and the field - so no "10.0" reaches a worker's environment, the
# marketplace or the controller.

#: Inputs that come from other resources (the image build) and may be unknown during preview.
MAY_BE_UNKNOWN = frozenset({"image", "image_digest", "paused_reason"})


def is_unknown(value: object) -> bool:
    return value is UNKNOWN or (isinstance(value, str) and value == PULUMI_UNKNOWN)


class _FieldError(ValueError):
    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path


def _coerce(value: Any, hint: Any, path: str) -> Any:
    if is_unknown(value):
        raise _FieldError(path, "value is unknown (preview) where a known value is required")
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        real = [a for a in args if a is not type(None)]
        if len(real) == 1:
            return _coerce(value, real[0], path)
        raise _FieldError(path, f"unsupported union type {hint}")
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _FieldError(path, f"expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _FieldError(path, f"expected an integer, got {value!r}")
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise _FieldError(path, f"expected an integer, got {value!r}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _FieldError(path, f"expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _FieldError(path, f"expected text, got {value!r}")
        return value
    if origin in (tuple, list, frozenset, set):
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple | set | frozenset):
            raise _FieldError(path, f"expected a list, got {value!r}")
        args = typing.get_args(hint)
        item_hint = args[0] if args else Any
        items = [_coerce(v, item_hint, f"{path}[{i}]") for i, v in enumerate(value)]
        return frozenset(items) if origin in (frozenset, set) else tuple(items) if origin is tuple else items
    if origin in (dict, Mapping, typing.Mapping) or hint is dict:
        if not isinstance(value, Mapping):
            raise _FieldError(path, f"expected a mapping, got {value!r}")
        args = typing.get_args(hint)
        key_hint, val_hint = args if args else (Any, Any)
        return {_coerce(k, key_hint, path): _coerce(v, val_hint, f"{path}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and is_dataclass(hint):
        return _decode_dataclass(hint, value, path)
    raise _FieldError(path, f"unsupported field type {hint}")


def _decode_dataclass(cls: Any, value: Any, path: str, *, skip: frozenset[str] = frozenset()) -> Any:
    if not isinstance(value, Mapping):
        raise _FieldError(path or cls.__name__, f"expected a mapping, got {value!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unexpected = sorted(set(value) - known - skip)
    if unexpected:
        raise _FieldError(f"{path}.{unexpected[0]}" if path else unexpected[0], "unknown field")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in skip or f.name not in value:
            continue  # absent (Pulumi drops None values): the dataclass default applies
        sub = f"{path}.{f.name}" if path else f.name
        kwargs[f.name] = _coerce(value[f.name], hints[f.name], sub)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise _FieldError(path or cls.__name__, f"missing field(s): {exc}") from None


@dataclass(frozen=True)
class PoolData:
    """The records-derived part of a pool's slot inputs: machines excluded and measured rates.

    Sized by the records, not by the pool: under Pulumi it travels once per pool (content-addressed by
    `digest`), and each slot carries only the digest and the counts, so 1,000 slots do not each carry
    10,000 machine ids. A new bad machine changes the digest of its pool only."""

    bad_machine_ids: frozenset[str] = frozenset()
    measured: Mapping[str, float] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.to_json().encode()).hexdigest()

    def to_json(self) -> str:
        return json.dumps({"bad_machine_ids": sorted(self.bad_machine_ids),
                           "measured": dict(sorted(self.measured.items()))}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, where: str) -> PoolData:
        try:
            doc = json.loads(text)
            return typing.cast(PoolData, _decode_dataclass(cls, doc, ""))
        except (ValueError, TypeError) as exc:
            raise SlotInputError(f"{where}: unreadable pool data: {exc}") from None

    def ref(self) -> dict[str, Any]:
        return {"digest": self.digest, "excluded": len(self.bad_machine_ids), "measured": len(self.measured)}


#: Resolves a pool-data digest to its content (the Pulumi adapter reads a content-addressed file).
PoolDataResolver = Callable[[str], PoolData]


def decode_slot_inputs(props: Mapping[str, Any], *, resolve_pool_data: PoolDataResolver | None = None,
                       allow_unknown: bool = False) -> SlotInputs:
    """Provider props -> SlotInputs, coerced per field; refuses a bad value naming slot and field.

    `pool_data` (a digest reference, see PoolData) is resolved with `resolve_pool_data`; inline
    `bad_machine_ids`/`measured` (fleet apply, older stacks) are read as they are. With `allow_unknown`
    (Pulumi preview: Check, Diff) the fields in MAY_BE_UNKNOWN may be unknown and decode to UNKNOWN."""
    slot = props.get("slot")
    label = slot if isinstance(slot, str) else "?"
    try:
        # `__provider` is the host's own key (the pickled provider); outputs declared by the resource class
        # may sit beside the inputs. Neither is an input.
        data = {k: v for k, v in props.items() if not k.startswith("__") and k not in _OUTPUT_ONLY}
        unknowns: dict[str, Any] = {}
        for name in MAY_BE_UNKNOWN:
            if name in data and is_unknown(data[name]):
                if not allow_unknown:
                    raise _FieldError(name, "value is unknown outside a preview")
                unknowns[name] = UNKNOWN
                del data[name]
        ref = data.pop("pool_data", None)
        if ref is not None:
            ref_doc = _coerce(ref, dict[str, Any], "pool_data")
            digest = _coerce(ref_doc.get("digest"), str, "pool_data.digest")
            if resolve_pool_data is None:
                raise _FieldError("pool_data", "a pool-data reference needs a resolver")
            pool_data = resolve_pool_data(digest)
            if pool_data.digest != digest:
                raise _FieldError("pool_data.digest", f"content of {digest} hashes to {pool_data.digest}")
            data["bad_machine_ids"] = sorted(pool_data.bad_machine_ids)
            data["measured"] = dict(pool_data.measured)
        for name in unknowns:
            data[name] = None if name == "paused_reason" else ""  # placeholder, replaced below
        inputs = _decode_dataclass(SlotInputs, data, "")
        if unknowns:
            # The unknown marker is the value; nothing downstream may read it as text or as a bool.
            inputs = SlotInputs(**{**{f.name: getattr(inputs, f.name) for f in fields(SlotInputs)}, **unknowns})
        return typing.cast(SlotInputs, inputs)
    except _FieldError as exc:
        raise SlotInputError(f"slot {label}: input {exc}", field=exc.path) from None


_OUTPUT_ONLY = frozenset(SlotOutputs.__dataclass_fields__) - frozenset(SlotInputs.__dataclass_fields__)


def decode_slot_outputs(props: Mapping[str, Any]) -> SlotOutputs:
    """Provider state -> SlotOutputs, coerced per field (inputs merged into the state are ignored)."""
    slot = props.get("slot")
    label = slot if isinstance(slot, str) else "?"
    names = {f.name for f in fields(SlotOutputs)}
    try:
        return typing.cast(SlotOutputs, _decode_dataclass(SlotOutputs, {k: v for k, v in props.items()
                                                                        if k in names}, ""))
    except _FieldError as exc:
        raise SlotInputError(f"slot {label}: output {exc}", field=exc.path) from None


@dataclass(frozen=True)
class SlotDiff:
    replace: bool
    reason: str | None = None
    detail: str = ""
    replaces: tuple[str, ...] = ()  # input properties that force the replacement (for Pulumi's diff display)


def slot_inputs(spec: FleetSpec, pool: PoolSpec, slot: str, records: RecordSet, *, image: str,
                image_digest: str, params_dir: str | None = None, now: datetime | None = None,
                retest_machine_ids: frozenset[str] = frozenset()) -> SlotInputs:
    """The inputs of one slot, as both drivers build them from the spec and the records.

    `now`: bad records whose expiry passed are on probation and not excluded (without it nothing expires).
    `retest_machine_ids`: machines the planner wants benchmarked once more (planner.Create/Replace.retest_machine).

    Measured rates are limited to machines of the pool's GPU model (or of unknown model): other machines
    can never match the pool's query, and keeping them out keeps every slot's inputs small and stable."""
    pause = pool_pause(pool.name, records, image_digest)
    draining = slot in pool.draining
    if pool.min_count is not None:
        # An autoscaled pool's slots and draining set change with every capacity decision; a slot needs none
        # of it (only whether it drains itself), so its inputs stay the same while the pool grows or shrinks.
        pool = replace(pool, count=pool.bounds[0], slot_indices=None, draining=(), desired_count=None)
    measured = {m: p.median_proofs_per_hour for m, p in sorted(records.perf_history().items())
                if p.gpu_name in (None, pool.gpu_name)}
    prior = spec.prior_proofs_per_hour(pool.gpu_name)
    return SlotInputs(
        slot=slot, pool=pool, image=image, image_digest=image_digest, controller_url=spec.controller.url,
        params=spec.params, bad_machine_ids=records.bad_machine_ids(now) | excluded_by_hosts(spec.hosts),
        measured=measured,
        priors={pool.gpu_name: prior} if prior is not None else {},
        paused_reason=pause.describe() if pause else None, params_dir=params_dir, label_prefix=spec.label_prefix,
        max_total_dph=spec.max_total_dph, draining=draining,
        retest_machine_ids=retest_machine_ids - records.bad_machine_ids(now))


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
    # Only when set, so existing slots keep their inputs (and are not replaced by this addition).
    if bench.memory_budget_gib is not None:
        env["FLEET_MEMORY_BUDGET_GIB"] = str(bench.memory_budget_gib)
    if bench.miner_id != 1000:
        env["FLEET_BENCH_MINER_ID"] = str(bench.miner_id)
    if bench.sector_num is not None:
        env["FLEET_BENCH_SECTOR_NUM"] = str(bench.sector_num)
    if inputs.params.base_url:
        env["FLEET_PARAMS_BASE_URL"] = inputs.params.base_url
    if inputs.params_dir:
        env["FLEET_PARAMS_DIR"] = inputs.params_dir
    return env


def new_nonce() -> str:
    return secrets.token_hex(3)


def slot_diff(old: SlotOutputs, new: SlotInputs, now: float | None = None) -> SlotDiff:
    """Pure: must the slot's instance be replaced to match `new`? (planner.replace_reason decides.)

    A digest Pulumi does not know yet (preview of a rebuild) is reported as a possible replacement. A
    paused pool replaces nothing: delete-before-replace would destroy a working instance and then be
    refused a new one. `now` (epoch s): judge the status table's deadlines; None: only at-once rules."""
    unknown = is_unknown(new.image_digest)
    since = old.status_since if old.status_since is not None else old.created_at
    age = None if now is None or since is None else max(0.0, now - since)
    why = replace_reason(old.machine_id, old.image_digest, old.status, new.bad_machine_ids,
                         None if unknown else new.image_digest, age)
    if why is None and unknown:
        why = (REASON_IMAGE_CHANGED, "image digest not known until the image is built: may change")
    if why is None:
        return SlotDiff(replace=False)
    # An unknown hold (it depends on the digest being built) is not a hold: never read an Unknown as truthy.
    held = None if is_unknown(new.paused_reason) else new.paused_reason
    if new.draining:  # the leader releases the slot once its worker stopped: renting again would undo the drain
        held = "draining (capacity shrinks the pool; the slot goes once its worker stopped)"
    if held:
        return SlotDiff(replace=False, reason=why[0], detail=f"{why[1]}; held: {held}")
    prop = {REASON_MACHINE_BAD: "bad_machine_ids", REASON_IMAGE_CHANGED: "image_digest"}.get(why[0], "status")
    return SlotDiff(replace=True, reason=why[0], detail=why[1], replaces=(prop,))


def describe_constraints(pool: PoolSpec) -> str:
    return describe_wants(offer_query(pool, ()))


def broad_query(pool: PoolSpec, limit: int = 200) -> OfferQuery:
    """The pool's GPU model and count only (and where it runs: owned hosts or the market): what there is at all,
    to say what a failed search lacked."""
    return OfferQuery(gpu_name=pool.gpu_name, num_gpus=pool.gpus_per_instance, max_price_usd_per_hour=1e9,
                      min_reliability=0.0, verified_only=False, limit=limit, owned_hosts=pool.hosts is not None)


def describe_shortfall(pool: PoolSpec, bad_machine_ids: frozenset[str], offers: Iterable[Offer]) -> str:
    """Pure: why none of `offers` (a broad search: GPU model only) fits `pool` - what was short, counted.

    E.g. "the market lists 7 RTX 4090 x1 offers: 3 on machines recorded bad (excluded), 2 above the price cap
    $0.60/h (cheapest $0.72/h), 2 below reliability 0.98"."""
    query = offer_query(pool, bad_machine_ids)
    listed = [o for o in offers if o.gpu_name == pool.gpu_name and o.num_gpus == pool.gpus_per_instance]
    if not listed:
        return f"the market lists no {pool.gpu_name} x{pool.gpus_per_instance} offer right now (GPU short)"
    counts: dict[str, int] = {}
    over_cap: list[float] = []
    price_key = ""
    for offer in listed:
        found = misfit(offer, query)
        if found is None:
            continue
        key = found[0].shortfall(query)
        if found[0].name == "price":
            over_cap.append(offer.price_usd_per_hour)
            price_key = key
        counts[key] = counts.get(key, 0) + 1
    parts = []
    for key, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if key == price_key:
            key += f" (cheapest of them ${min(over_cap):.2f}/h)"
        parts.append(f"{n} {key}")
    fitting = len(listed) - sum(counts.values())
    tail = f"; {fitting} fit but were taken meanwhile" if fitting else ""
    return (f"the market lists {len(listed)} {pool.gpu_name} x{pool.gpus_per_instance} offer(s): "
            + ", ".join(parts) + tail)


def digest_of_image_ref(ref: str) -> str:
    """`repo@sha256:abc` -> `sha256:abc`. A ref without a digest is refused: mutable tags are not pinned."""
    _, sep, digest = ref.rpartition("@")
    if not sep or not digest.startswith("sha256:"):
        raise SlotInputError(f"image reference {ref!r} is not pinned by digest (expected repo@sha256:...)")
    return digest


def instance_of_label(label: str | None, prefix: str) -> str | None:
    """Our instance id in a marketplace label (`<prefix><slot>-<6 hex>`), or None: not this fleet's."""
    if not label or not label.startswith(prefix):
        return None
    instance_id = label[len(prefix):]
    slot, sep, nonce = instance_id.rpartition("-")
    if not sep or not slot or len(nonce) != 6 or any(c not in "0123456789abcdef" for c in nonce):
        return None
    return instance_id


def slot_of_instance(instance_id: str) -> str:
    """`rtx4090-3-a1b2c3` -> `rtx4090-3`."""
    return instance_id.rpartition("-")[0]
