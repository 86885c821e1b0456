"""GpuPool: one dynamic-provider resource per pool slot `<pool>-<i>`, each one rented instance.

The resource's CRUD is `reconciler.adapters.pulumi_provider.SlotResourceProvider` (the same SlotProvider `fleet apply`
drives). Its inputs carry everything a create or diff needs: the pool's constraints, the image pinned by
digest, and the bad-machine set and perf history read from fleet-spec/ at program time. So a new bad
record changes the input of every slot, and the provider's diff replaces exactly the slot whose machine
it names (delete before replace: never two instances for one slot).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.dynamic import Resource

from reconciler.adapters.pulumi_provider import SlotResourceProvider
from reconciler.domain.planner import pool_pause
from reconciler.domain.records import RecordSet
from reconciler.domain.slots import digest_of_image_ref, slot_inputs
from reconciler.domain.spec import FleetSpec, PoolSpec

#: Outputs each slot resource exposes (declared as None inputs so Pulumi treats them as outputs).
SLOT_OUTPUTS = ("instance_id", "contract_id", "machine_id", "host_id", "gpu_name", "price_usd_per_hour", "status")


class GpuSlot(Resource, module="fleet", name="Slot"):
    instance_id: pulumi.Output[str]
    contract_id: pulumi.Output[str]
    machine_id: pulumi.Output[str]
    host_id: pulumi.Output[str]
    price_usd_per_hour: pulumi.Output[float]
    status: pulumi.Output[str]

    def __init__(self, provider: SlotResourceProvider, name: str, props: Mapping[str, Any],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(provider, name, {**{k: None for k in SLOT_OUTPUTS}, **props}, opts)


@dataclass
class GpuPoolArgs:
    spec: FleetSpec
    pool: PoolSpec
    records: RecordSet
    image_ref: pulumi.Input[str]  # WorkerImage.repo_digest: repo@sha256:...
    backend: Mapping[str, Any] = field(default_factory=lambda: {"kind": "vastai"})
    params_dir: str | None = None


class GpuPool(pulumi.ComponentResource):
    slots: dict[str, GpuSlot]

    def __init__(self, name: str, args: GpuPoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-fleet:index:GpuPool", name, None, opts)
        provider = SlotResourceProvider(args.backend)
        image_ref = pulumi.Output.from_input(args.image_ref)
        digest = image_ref.apply(digest_of_image_ref)
        pause = digest.apply(lambda d: _pause_reason(args.pool, args.records, d))
        self.slots = {}
        for slot in args.pool.slot_names():
            # Everything but the image comes from spec + records, known now; image fields follow the build.
            static = slot_inputs(args.spec, args.pool, slot, args.records, image="", image_digest="",
                                 params_dir=args.params_dir).to_props()
            props: dict[str, Any] = {**static, "image": image_ref, "image_digest": digest, "paused_reason": pause}
            self.slots[slot] = GpuSlot(provider, slot, props, pulumi.ResourceOptions(
                parent=self, delete_before_replace=True,
                # A rented GPU costs money every hour: give the market time, but never hang an update.
                custom_timeouts=pulumi.CustomTimeouts(create="15m", delete="10m")))
        self.register_outputs({s: r.instance_id for s, r in self.slots.items()})


def _pause_reason(pool: PoolSpec, records: RecordSet, digest: str) -> str | None:
    pause = pool_pause(pool.name, records, digest)
    return pause.describe() if pause else None

