"""Slot planner: create missing, replace bad/dead/stale, delete extra, honour the circuit breaker."""

from __future__ import annotations

from datetime import UTC, datetime

from reconciler.domain.planner import (
    REASON_IMAGE_CHANGED,
    REASON_INSTANCE_DEAD,
    REASON_INSTANCE_GONE,
    REASON_MACHINE_BAD,
    REASON_MISSING,
    REASON_POOL_PAUSED,
    REASON_POOL_REMOVED,
    REASON_SCALED_DOWN,
    STATUS_GONE,
    Create,
    Delete,
    Hold,
    Keep,
    ObservedSlot,
    Replace,
    desired_slots,
    plan,
    replace_reason,
)
from reconciler.domain.records import ImageSuspectRecord, MachineRecord, RecordSet
from reconciler.domain.spec import ControllerSettings, FleetSpec, ImageSettings, PoolSpec

NOW = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
DIGEST = "sha256:" + "a" * 64
OLD_DIGEST = "sha256:" + "b" * 64


def spec(**counts: int) -> FleetSpec:
    pools = tuple(PoolSpec(name=name.replace("_", "-"), gpu_name="RTX 4090", count=n, min_rate_proofs_per_hour=40,
                           max_price_usd_per_hour=0.6) for name, n in counts.items())
    return FleetSpec(image=ImageSettings(repository="r/x"), controller=ControllerSettings(url="http://c"),
                     pools=pools)


def seen(slot: str, machine: str, status: str = "running", digest: str | None = DIGEST) -> ObservedSlot:
    return ObservedSlot(slot=slot, pool=slot.rsplit("-", 1)[0], instance_id=f"{slot}-abc123", machine_id=machine,
                        image_digest=digest, status=status, contract_id=f"c-{machine}")


def records(bad: tuple[str, ...] = (), suspect: ImageSuspectRecord | None = None) -> RecordSet:
    machines = {m: MachineRecord(machine_id=m, status="bad") for m in bad}
    images = {suspect.image_digest: suspect} if suspect else {}
    return RecordSet(machines=machines, images=images)


def by_slot(p) -> dict:
    return {a.slot: a for a in p.actions}


def test_empty_fleet_creates_every_slot_in_spec_order() -> None:
    p = plan(spec(a=2, b=1), {}, records(), DIGEST, NOW)
    assert [(a.kind, a.slot, a.pool) for a in p.actions] == [
        ("create", "a-0", "a"), ("create", "a-1", "a"), ("create", "b-0", "b")]
    assert all(a.reason == REASON_MISSING for a in p.actions)
    assert not p.converged


def test_healthy_fleet_is_a_noop() -> None:
    obs = {"a-0": seen("a-0", "m1"), "a-1": seen("a-1", "m2", status="loading")}
    p = plan(spec(a=2), obs, records(), DIGEST, NOW)
    assert all(isinstance(a, Keep) for a in p.actions)
    assert p.changes == () and p.converged


def test_new_bad_record_replaces_exactly_that_slot() -> None:
    obs = {"a-0": seen("a-0", "m1"), "a-1": seen("a-1", "m2"), "a-2": seen("a-2", "m3")}
    p = plan(spec(a=3), obs, records(bad=("m2",)), DIGEST, NOW)
    assert p.changes == (Replace("a-1", "a", REASON_MACHINE_BAD, "machine m2 is recorded bad"),)


def test_dead_and_gone_instances() -> None:
    obs = {"a-0": seen("a-0", "m1", status="exited"), "a-1": seen("a-1", "m2", status="offline"),
           "a-2": seen("a-2", "m3", status=STATUS_GONE)}
    acts = by_slot(plan(spec(a=3), obs, records(), DIGEST, NOW))
    assert isinstance(acts["a-0"], Replace) and acts["a-0"].reason == REASON_INSTANCE_DEAD
    assert isinstance(acts["a-1"], Replace) and acts["a-1"].reason == REASON_INSTANCE_DEAD
    assert isinstance(acts["a-2"], Create) and acts["a-2"].reason == REASON_INSTANCE_GONE


def test_image_digest_change_replaces_every_slot_but_unknown_digest_does_not() -> None:
    obs = {"a-0": seen("a-0", "m1", digest=OLD_DIGEST), "a-1": seen("a-1", "m2")}
    acts = by_slot(plan(spec(a=2), obs, records(), DIGEST, NOW))
    assert isinstance(acts["a-0"], Replace) and acts["a-0"].reason == REASON_IMAGE_CHANGED
    assert isinstance(acts["a-1"], Keep)
    assert plan(spec(a=2), obs, records(), None, NOW).changes == ()


def test_count_decrease_deletes_highest_slots_first_and_removed_pool_entirely() -> None:
    obs = {s: seen(s, f"m{i}") for i, s in enumerate(["a-0", "a-1", "a-2", "a-3", "gone-0"])}
    p = plan(spec(a=2), obs, records(), DIGEST, NOW)
    deletes = [a for a in p.changes if isinstance(a, Delete)]
    assert [(d.slot, d.reason) for d in deletes] == [
        ("a-3", REASON_SCALED_DOWN), ("a-2", REASON_SCALED_DOWN), ("gone-0", REASON_POOL_REMOVED)]


def test_pool_names_with_dashes_and_double_digit_slots() -> None:
    s = spec(rtx_pro_4000=12)
    assert list(desired_slots(s))[-1] == "rtx-pro-4000-11"
    obs = {f"rtx-pro-4000-{i}": seen(f"rtx-pro-4000-{i}", f"m{i}") for i in range(12)}
    p = plan(spec(rtx_pro_4000=2), obs, records(), DIGEST, NOW)
    assert [d.slot for d in p.changes][:2] == ["rtx-pro-4000-11", "rtx-pro-4000-10"]


def test_circuit_breaker_pauses_listed_pool_only_for_suspect_digest() -> None:
    suspect = ImageSuspectRecord(image_digest=DIGEST, signature="command not found", status="suspect",
                                 machines=("m7", "m8"), tripped_at="2026-12-02T15:00:00Z", pools=("a",))
    obs = {"a-0": seen("a-0", "m1", digest=OLD_DIGEST), "a-1": seen("a-1", "m2", status="exited", digest=OLD_DIGEST),
           "a-2": seen("a-2", "m3", digest=OLD_DIGEST), "b-0": seen("b-0", "m4", digest=OLD_DIGEST)}
    p = plan(spec(a=4, b=2), obs, records(bad=("m3",), suspect=suspect), DIGEST, NOW)
    acts = by_slot(p)
    # paused pool: keep the running instances (even on the old digest / a bad machine), create nothing
    assert isinstance(acts["a-0"], Keep) and acts["a-0"].reason == REASON_POOL_PAUSED
    assert isinstance(acts["a-2"], Keep) and acts["a-2"].reason == REASON_POOL_PAUSED
    assert isinstance(acts["a-1"], Delete) and acts["a-1"].reason == REASON_INSTANCE_DEAD
    assert isinstance(acts["a-3"], Hold)
    # the other pool proceeds normally
    assert isinstance(acts["b-0"], Replace) and acts["b-0"].reason == REASON_IMAGE_CHANGED
    assert isinstance(acts["b-1"], Create)
    assert set(p.paused) == {"a"}
    assert any("pool a paused" in n and "command not found" in n and "3.0h ago" in n for n in p.notes)
    assert not p.converged

    # a cleared record, or another desired digest, pauses nothing
    cleared = ImageSuspectRecord(**{**suspect.__dict__, "status": "cleared"})
    assert not plan(spec(a=4), obs, records(suspect=cleared), DIGEST, NOW).paused
    assert not plan(spec(a=4), obs, records(suspect=suspect), OLD_DIGEST, NOW).paused


def test_suspect_record_without_pools_pauses_every_pool() -> None:
    suspect = ImageSuspectRecord(image_digest=DIGEST, signature="x", status="suspect", machines=("m1",),
                                 tripped_at="2026-12-02T15:00:00Z")
    p = plan(spec(a=1, b=1), {}, records(suspect=suspect), DIGEST, NOW)
    assert set(p.paused) == {"a", "b"} and p.changes == ()
    assert len(p.held) == 2


def test_unreadable_records_are_noted() -> None:
    rs = RecordSet(problems=("fleet-spec/machines/x.yaml: bad",), unreadable_machine_ids=frozenset({"x"}))
    p = plan(spec(a=1), {"a-0": seen("a-0", "x")}, rs, DIGEST, NOW)
    assert p.changes[0].reason == REASON_MACHINE_BAD
    assert any("unreadable" in n for n in p.notes)


def test_replace_reason_order_dead_before_bad_before_image() -> None:
    assert replace_reason("m", OLD_DIGEST, "exited", {"m"}, DIGEST)[0] == REASON_INSTANCE_DEAD  # type: ignore[index]
    assert replace_reason("m", OLD_DIGEST, "running", {"m"}, DIGEST)[0] == REASON_MACHINE_BAD  # type: ignore[index]
    assert replace_reason("m", OLD_DIGEST, "running", set(), DIGEST)[0] == REASON_IMAGE_CHANGED  # type: ignore[index]
    assert replace_reason("m", DIGEST, "running", {"other"}, DIGEST) is None


# --- a retest: the same machine once more after an unknown failure (issue 29) --------------------------------


def _retest_records(machine: str, at: str = "2026-12-02T17:00:00Z") -> RecordSet:
    from reconciler.domain.records import BenchmarkEntry
    from reconciler.domain.retests import HELD_FOR_RETEST

    entry = BenchmarkEntry(instance_id="a-0-f00d", at=at, verdict="benchmark-error", blame="unknown",
                           marks_bad=False, reason="benchmark-error: not recognised: odd", pool="a",
                           image_digest=DIGEST, signature="benchmark-error-unrecognized-x", held_by=HELD_FOR_RETEST)
    return RecordSet(machines={machine: MachineRecord(machine_id=machine, benchmarks=(entry,))})


def test_a_slot_whose_machine_waits_for_a_retest_rents_it_again() -> None:
    observed = {"a-0": seen("a-0", "m1", status="exited"), "a-1": seen("a-1", "m2")}
    actions = by_slot(plan(spec(a=2), observed, _retest_records("m1"), DIGEST, NOW))
    replace = actions["a-0"]
    assert isinstance(replace, Replace) and replace.reason == REASON_INSTANCE_DEAD
    assert replace.retest_machine == "m1" and "retest of machine m1 (unknown failure of a-0-f00d" in replace.detail
    assert isinstance(actions["a-1"], Keep)
    # The instance already gone from the market: the create of its slot carries the retest too.
    gone = by_slot(plan(spec(a=1), {"a-0": seen("a-0", "m1", status=STATUS_GONE)}, _retest_records("m1"), DIGEST, NOW))
    assert isinstance(gone["a-0"], Create) and gone["a-0"].retest_machine == "m1"


def test_no_retest_once_it_is_stale_or_for_a_machine_of_another_pool() -> None:
    observed = {"a-0": seen("a-0", "m1", status="exited")}
    stale = by_slot(plan(spec(a=1), observed, _retest_records("m1", at="2026-11-30T17:00:00Z"), DIGEST, NOW))
    assert isinstance(stale["a-0"], Replace) and stale["a-0"].retest_machine is None
    elsewhere = by_slot(plan(spec(b=1), {"b-0": seen("b-0", "m1", status="exited")}, _retest_records("m1"), DIGEST,
                             NOW))
    assert elsewhere["b-0"].retest_machine is None  # type: ignore[union-attr]
    nothing = by_slot(plan(spec(a=1), observed, records(), DIGEST, NOW))  # no record at all: no retest
    assert nothing["a-0"].retest_machine is None  # type: ignore[union-attr]


def test_the_slot_provider_rents_the_retest_machine_first_while_it_is_offered() -> None:
    from reconciler.adapters.slot_provider import SlotProvider
    from reconciler.domain.marketplace import Offer
    from reconciler.domain.slots import SlotInputs
    from tests.fakes import FakeMarket

    pool = spec(a=1).pools[0]
    offers = [Offer(offer_id=f"o-{m}", machine_id=m, host_id=f"h-{m}", gpu_name="RTX 4090", num_gpus=1,
                    price_usd_per_hour=price, reliability=0.99, inet_down_mbps=1000, disk_gb=500, cpu_ram_gb=256,
                    cuda_max_good=12.4) for m, price in (("cheap", 0.2), ("m1", 0.5))]
    base = SlotInputs(slot="a-0", pool=pool, image="r/x@" + DIGEST, image_digest=DIGEST, controller_url="http://c")
    assert SlotProvider(FakeMarket(offers), b"s" * 32, nonce=lambda: "n1").create(base).machine_id == "cheap"
    retest = SlotInputs(**{**base.__dict__, "retest_machine_ids": frozenset({"m1"})})
    assert SlotProvider(FakeMarket(offers), b"s" * 32, nonce=lambda: "n2").create(retest).machine_id == "m1"
    # Not offered any more: the slot is filled as usual (the retest stays pending until its window ends).
    assert SlotProvider(FakeMarket(offers[:1]), b"s" * 32, nonce=lambda: "n3").create(retest).machine_id == "cheap"
    assert SlotInputs.from_props(retest.to_props()).retest_machine_ids == frozenset({"m1"})
