"""GpuPool: one dynamic-provider resource per pool slot `<pool>-<i>`, each one rented instance.

The resource's CRUD is `reconciler.adapters.pulumi_provider.SlotResourceProvider` (the same SlotProvider
`fleet apply` drives). Its inputs carry everything a create or diff needs: the pool's constraints, the image
pinned by digest, and a reference to the pool's records-derived data (excluded machines, measured rates):
that data is written ONCE per pool as a content-addressed file and each slot carries only its digest and
counts, so inputs are sized by the pool, not by records x slots. A new bad record changes the digest of
the pools it concerns, and the provider's diff replaces exactly the slot whose machine it names (delete
before replace: never two instances for one slot); the pool's other slots preview as no change.

No `custom_timeouts`: the engine does not forward them to a dynamic provider (the SDK's host never reads the
request's timeout); the slot provider keeps its own deadlines.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pulumi
from pulumi.dynamic import Resource

from reconciler.adapters.pulumi_provider import SlotResourceProvider, write_pool_data
from reconciler.domain.planner import pool_pause
from reconciler.domain.records import RecordSet
from reconciler.domain.retests import retests_pending
from reconciler.domain.slots import PoolData, digest_of_image_ref, slot_inputs
from reconciler.domain.spec import FleetSpec, PoolSpec

#: Outputs each slot resource exposes (declared as None inputs so Pulumi treats them as outputs).
SLOT_OUTPUTS = ("instance_id", "contract_id", "machine_id", "host_id", "gpu_name", "price_usd_per_hour", "status")


@contextlib.contextmanager
def pickler_restored() -> Iterator[None]:
    """Undo what the SDK's `serialize_provider` leaves behind.

    pulumi/dynamic/dynamic.py:287-300 (pulumi 3.260-3.272) wraps `pickle._Pickler._batch_setitems` in a
    sorting wrapper on every dynamic resource and never restores it: each resource nests one more level,
    and a few hundred resources in one program raise RecursionError. Restoring the two attributes after
    each resource keeps the nesting at one level; the serialisation itself is unchanged."""
    pickler = pickle._Pickler  # type: ignore[attr-defined]
    saved = {name: pickler.__dict__.get(name) for name in ("_batch_setitems", "save_dict")}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is not None:
                setattr(pickler, name, value)


class GpuSlot(Resource, module="fleet", name="Slot"):
    instance_id: pulumi.Output[str]
    contract_id: pulumi.Output[str]
    machine_id: pulumi.Output[str]
    host_id: pulumi.Output[str]
    price_usd_per_hour: pulumi.Output[float]
    status: pulumi.Output[str]

    def __init__(self, provider: SlotResourceProvider, name: str, props: Mapping[str, Any],
                 opts: pulumi.ResourceOptions | None = None):
        with pickler_restored():
            super().__init__(provider, name, {**{k: None for k in SLOT_OUTPUTS}, **props}, opts)


@dataclass
class GpuPoolArgs:
    spec: FleetSpec
    pool: PoolSpec
    records: RecordSet
    image_ref: pulumi.Input[str]  # WorkerImage.repo_digest (repo@sha256:...) or, locally, a directory
    backend: Mapping[str, Any] = field(default_factory=lambda: {"kind": "vastai"})
    params_dir: str | None = None
    image_digest: pulumi.Input[str] | None = None  # default: the digest in image_ref


class GpuPool(pulumi.ComponentResource):
    slots: dict[str, GpuSlot]

    def __init__(self, name: str, args: GpuPoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-fleet:index:GpuPool", name, None, opts)
        provider = SlotResourceProvider(args.backend)
        image_ref = pulumi.Output.from_input(args.image_ref)
        digest = (pulumi.Output.from_input(args.image_digest) if args.image_digest is not None
                  else image_ref.apply(digest_of_image_ref))
        pause = digest.apply(lambda d: _pause_reason(args.pool, args.records, d))
        static = static_slot_props(args.spec, args.pool, args.records, pool_data_dir=args.backend["pool_data_dir"],
                                   params_dir=args.params_dir)
        self.slots = {}
        for slot, props in static.items():
            props = {**props, "image": image_ref, "image_digest": digest, "paused_reason": pause}
            self.slots[slot] = GpuSlot(provider, slot, props, pulumi.ResourceOptions(
                parent=self, delete_before_replace=True))
        self.register_outputs({s: r.instance_id for s, r in self.slots.items()})


def static_slot_props(spec: FleetSpec, pool: PoolSpec, records: RecordSet, *, pool_data_dir: str,
                      params_dir: str | None = None) -> dict[str, dict[str, Any]]:
    """Each slot's inputs except the image fields (which follow the build): spec + records, known now.

    Built once per pool (not per slot: the records are read once), with the pool's records-derived data
    written once to `pool_data_dir` and referenced by digest from every slot."""
    # The time of this `pulumi up`: bad records that expired by now put their machines on probation.
    now = datetime.now(UTC)
    base = slot_inputs(spec, pool, f"{pool.name}-0", records, image="", image_digest="", params_dir=params_dir,
                       now=now)
    ref = write_pool_data(pool_data_dir, PoolData(bad_machine_ids=base.bad_machine_ids, measured=base.measured))
    static = replace(base, bad_machine_ids=frozenset(), measured={}).to_props()
    for name in ("bad_machine_ids", "measured", "image", "image_digest", "paused_reason"):
        static.pop(name, None)
    retests = retest_machines_by_slot(spec, pool, records, base.bad_machine_ids, now)
    # A draining slot (an autoscaled pool shrinking) keeps its instance until the leader releases it.
    return {slot: {**static, "slot": slot, "pool_data": ref, **({"draining": True} if slot in pool.draining else {}),
                   **({"retest_machine_ids": sorted(retests[slot])} if slot in retests else {})}
            for slot in pool.slot_names()}


def retest_machines_by_slot(spec: FleetSpec, pool: PoolSpec, records: RecordSet, bad: frozenset[str],
                            now: datetime) -> dict[str, set[str]]:
    """Per slot, the machines held for a retest whose unknown failure was that slot's instance (the planner's
    `retest_machine` for `fleet apply`): the slot's next create rents that machine first while it is offered. A
    slot's instance ids are `<slot>-<nonce>` (adapters/slot_provider.py). Only steers a create: the provider's
    diff makes it an update, never a replacement of a working instance."""
    slots = set(pool.slot_names())
    out: dict[str, set[str]] = {}
    for pending in retests_pending(records, spec, now).values():
        slot = pending.instance_id.rpartition("-")[0]
        if pending.pool == pool.name and slot in slots and pending.machine_id not in bad:
            out.setdefault(slot, set()).add(pending.machine_id)
    return out


def _pause_reason(pool: PoolSpec, records: RecordSet, digest: str) -> str | None:
    pause = pool_pause(pool.name, records, digest)
    return pause.describe() if pause else None
