"""A retest through the driver (issue 29 item 4): `fleet apply` replaces the slot whose instance failed `unknown` with
an instance on the same machine while the market offers it - even when a cheaper offer came up meanwhile - and the
record of the retest's verdict then names the unknown it retested. Shared fakes of our ports (FakeMarket), a real
state file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from reconciler.adapters.slot_provider import SlotProvider
from reconciler.domain.marketplace import Offer
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordSet
from reconciler.domain.retests import HELD_FOR_RETEST
from reconciler.domain.spec import ControllerSettings, FleetSpec, ImageSettings, PoolSpec
from reconciler.flows.provision import Image, apply_fleet
from tests.fakes import FakeMarket

NOW = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
IMAGE = Image("registry.example/worker@sha256:" + "e" * 64, "sha256:" + "e" * 64)
SPEC = FleetSpec(image=ImageSettings(repository="registry.example/worker"),
                 controller=ControllerSettings(url="http://c"),
                 pools=(PoolSpec(name="a", gpu_name="RTX 4090", count=1, min_rate_proofs_per_hour=40,
                                 max_price_usd_per_hour=0.6),))


def _offer(machine: str, price: float) -> Offer:
    return Offer(offer_id=f"o-{machine}", machine_id=machine, host_id=f"h-{machine}", gpu_name="RTX 4090", num_gpus=1,
                 price_usd_per_hour=price, reliability=0.99, inet_down_mbps=1000, disk_gb=500, cpu_ram_gb=256,
                 cuda_max_good=12.4)


def _held(instance_id: str, at: datetime) -> RecordSet:
    entry = BenchmarkEntry(instance_id=instance_id, at=at.strftime("%Y-%m-%dT%H:%M:%SZ"), verdict="benchmark-error",
                           blame="unknown", marks_bad=False, reason="benchmark-error: not recognised: odd", pool="a",
                           image_digest=IMAGE.digest, signature="benchmark-error-unrecognized-x",
                           held_by=HELD_FOR_RETEST)
    return RecordSet(machines={"m1": MachineRecord(machine_id="m1", benchmarks=(entry,))})


def test_apply_rents_the_same_machine_again_for_its_retest(tmp_path: Path) -> None:
    market = FakeMarket([_offer("m1", 0.40)])
    provider = SlotProvider(market, b"s" * 32, nonce=iter(["n1", "n2", "n3"]).__next__)
    state = tmp_path / "state" / "slots.json"
    lines: list[str] = []
    first = apply_fleet(SPEC, RecordSet(), provider, state, IMAGE, NOW, lines.append)
    (rented,) = first.slots.values()
    assert rented.machine_id == "m1"
    # Its benchmark failed `unknown` and was held for a retest; the worker exited; a cheaper offer came up.
    (contract,) = market.statuses
    market.statuses[contract] = "exited"
    market.offers.append(_offer("m9", 0.20))
    second = apply_fleet(SPEC, _held(rented.instance_id, NOW + timedelta(minutes=30)), provider, state, IMAGE,
                         NOW + timedelta(minutes=40), lines.append)
    (again,) = second.slots.values()
    assert again.machine_id == "m1" and again.instance_id != rented.instance_id
    assert any(f"retest of machine m1 (unknown failure of {rented.instance_id}" in line for line in lines), lines
    # Without a retest pending, the same situation rents the cheaper offer.
    market.statuses[next(c for c, m in market.rented.items() if m == "m1")] = "exited"
    third = apply_fleet(SPEC, RecordSet(), provider, state, IMAGE, NOW + timedelta(minutes=50), lines.append)
    assert next(iter(third.slots.values())).machine_id == "m9"
