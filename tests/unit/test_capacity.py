"""Capacity that follows demand, pure (domain/capacity.py), the spec's bounds and the bot's capacity.yaml.

Every time is a computed datetime (no clock): heartbeats are events at chosen minutes (tests/capacity_support).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from reconciler.adapters.capacity_files import parse_capacity, render_capacity
from reconciler.adapters.spec_files import check_spec_text
from reconciler.domain.capacity import (
    HELD_BREAKER,
    HELD_COOLDOWN,
    HELD_KILL_BUDGET,
    HELD_MISSING_DATA,
    HELD_ON_THE_WAY,
    HELD_SPEND_CAP,
    CapacityEntry,
    QueueSnapshot,
    apply_entries,
    decide_all,
    utilization,
)
from reconciler.domain.planner import REASON_DRAINING, ObservedSlot, plan
from reconciler.domain.records import RecordSet
from reconciler.domain.spec import SpecError
from tests.capacity_support import AUTOSCALED_SPEC, at, autoscaled_spec, benchmarking, serving

SPEC = autoscaled_spec()
BUSY_HOUR = [True] * 12  # heartbeats at minutes 1, 6, ..., 56
IDLE_HOUR = [False] * 12
NO_QUEUE = {"rtx4090": QueueSnapshot({"PoRep": 0}, {"PoRep": 0})}


def entry(desired: int, slots: tuple[int, ...] | None = None, draining: tuple[int, ...] = (),
          changed_min: float | None = -120) -> dict[str, CapacityEntry]:
    return {"rtx4090": CapacityEntry("rtx4090", desired, slots if slots is not None else tuple(range(desired)),
                                     draining, None if changed_min is None else at(changed_min), "up", "earlier")}


def one(spec, entries, reports, queues, now, **kw):  # type: ignore[no-untyped-def]
    (decision,) = decide_all(apply_entries(spec, entries), entries, reports, queues, now, **kw)
    return decision


# --- signals -------------------------------------------------------------------------------------------


def test_utilization_is_busy_time_over_wall_time_within_the_window() -> None:
    report = serving("i-0", "rtx4090-0", [True, True, False, False, True])  # beats at 1, 6, 11, 16, 21
    u = utilization([report], at(21), timedelta(minutes=18))
    # Intervals ending at 6 (3 of its 5 min inside the window from minute 3), 11, 16, 21, busy by the
    # trapezoid of both ends: 6: both busy (180 s); 11: half (150 s); 16: idle; 21: half (150 s).
    assert (u.wall_s, u.busy_s, u.machines) == (1080.0, 480.0, 1)
    assert u.value == pytest.approx(480 / 1080) and u.covered


def test_a_machine_seen_for_part_of_the_window_is_not_enough_data() -> None:
    u = utilization([serving("i-0", "rtx4090-0", [True, True])], at(6), timedelta(minutes=30))
    assert u.value == 1.0 and not u.covered


# --- up ------------------------------------------------------------------------------------------------


def test_scale_up_on_sustained_utilization_and_waiting_tasks_once_per_shortfall() -> None:
    reports = [serving("i-0", "rtx4090-0", BUSY_HOUR), serving("i-1", "rtx4090-1", BUSY_HOUR)]
    queue = {"rtx4090": QueueSnapshot({"PoRep": 31}, {"PoRep": 2}, oldest_waiting_at=at(32))}
    d = one(SPEC, entry(2), reports, queue, at(57))
    # 2 machines busy + 31 tasks / (40/h x 20 min) = 4.3 machine-equivalents, over target 0.8 -> 6.
    assert (d.before, d.after, d.scaled, d.changed) == (2, 6, True, True)
    assert d.trailer() == "rtx4090 2 -> 6 (utilization 1.00 for 20 min; 31 waiting PoRep tasks, oldest 25 min)"
    assert d.entry.slots == (0, 1, 2, 3, 4, 5) and d.entry.direction == "up" and d.entry.changed_at == at(57)
    assert d.entry.signals["queue"]["waiting"] == {"PoRep": 31}
    # The new machines are still in params/benchmark 25 min later (cooldown over), the queue the same:
    # they are capacity on its way, so the same shortfall does not rent again.
    later = [*reports, *(benchmarking(f"n-{i}", f"rtx4090-{i}", 60) for i in range(2, 6))]
    again = one(SPEC, {"rtx4090": d.entry}, [serving("i-0", "rtx4090-0", BUSY_HOUR + BUSY_HOUR[:5]),
                                            serving("i-1", "rtx4090-1", BUSY_HOUR + BUSY_HOUR[:5]), *later[2:]],
                queue, at(82))
    assert (again.after, again.changed, again.held_by) == (6, False, None)


def test_a_task_waiting_long_enough_grows_an_empty_pool() -> None:
    spec = autoscaled_spec(AUTOSCALED_SPEC.replace("min: 1, max: 8", "min: 0, max: 8"))
    queue = {"rtx4090": QueueSnapshot({"PoRep": 5}, {}, oldest_waiting_at=at(30))}
    d = one(spec, entry(0), [], queue, at(50))
    assert (d.before, d.after) == (0, 1) and "5 waiting PoRep tasks, oldest 20 min" in d.entry.reason
    young = {"rtx4090": QueueSnapshot({"PoRep": 5}, {}, oldest_waiting_at=at(45))}
    assert one(spec, entry(0), [], young, at(50)).after == 0  # waiting 5 min < scale_up_after 20: not yet


def test_sectors_past_precommit_grow_the_pool_before_their_porep_tasks_arrive() -> None:
    """curio posts a sector's PoRep task once its seed is on chain, ~75 min after precommit: more than a cold
    start ahead, so the pool grows while the machines are still idle, and does not shrink below that demand."""
    reports = [serving("i-0", "rtx4090-0", IDLE_HOUR)]
    coming = {"rtx4090": QueueSnapshot({"PoRep": 0}, {"PoRep": 0}, upcoming=150)}
    d = one(SPEC, entry(1), reports, coming, at(57))
    # 150 PoRep over 75 min = 120/h = 3 machines at 40/h, over target 0.8 -> 4.
    assert (d.before, d.after) == (1, 4)
    assert d.trailer() == ("rtx4090 1 -> 4 (utilization 0.00 for 20 min; 150 sectors past precommit (PoRep due "
                           "within ~75 min))")
    idle = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(4)]
    held = one(SPEC, entry(4), idle, coming, at(57))
    assert (held.after, held.changed) == (4, False)  # not below what the coming sectors need
    assert one(SPEC, entry(4), idle, NO_QUEUE, at(57)).after == 1


def test_cooldown_breaker_kill_budget_and_spend_cap_hold_a_scale_up() -> None:
    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(4)]
    cooling = one(SPEC, entry(4, changed_min=50), reports, NO_QUEUE, at(57))
    assert (cooling.after, cooling.held_by) == (4, HELD_COOLDOWN)
    paused = one(SPEC, entry(4), reports, NO_QUEUE, at(57), paused_pools=["rtx4090"])
    assert (paused.after, paused.held_by) == (4, HELD_BREAKER)
    failing = one(SPEC, entry(4), reports, NO_QUEUE, at(57), exhausted_pools=["rtx4090"])
    assert (failing.after, failing.held_by) == (4, HELD_KILL_BUDGET)
    capped = autoscaled_spec(AUTOSCALED_SPEC.replace("max_total_dph: 6.0", "max_total_dph: 2.0")
                             .replace("max: 8", "max: 4"))
    d = one(capped, entry(3), reports[:3], NO_QUEUE, at(57))
    # Demand wants ceil(3 / 0.8) = 4 = max; the cap ($2/h at $0.50/slot) allows 4: granted.
    assert d.after == 4
    tight = autoscaled_spec(AUTOSCALED_SPEC.replace("max_total_dph: 6.0", "max_total_dph: 1.9")
                            .replace("max: 8", "max: 3"))
    t = one(tight, entry(2), [*reports[:2], serving("i-9", "rtx4090-9", BUSY_HOUR)], NO_QUEUE, at(57))
    assert (t.after, t.held_by) == (3, None)  # 3 x 0.5 = 1.5 <= 1.9
    t4 = one(tight, entry(3), reports[:3], NO_QUEUE, at(57))
    assert t4.after == 3  # at max: held at the bound


def test_the_spend_cap_is_shared_with_the_other_pools() -> None:
    text = AUTOSCALED_SPEC.replace("max_total_dph: 6.0", "max_total_dph: 3.0").replace("max: 8", "max: 4") + """\
  - name: other
    gpu_name: RTX 4090
    count: 3
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.5
"""
    spec = autoscaled_spec(text)
    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(2)]
    d = one(spec, entry(2), reports, NO_QUEUE, at(57))
    # Wants 3; other pool 3 x 0.5 + 2 x 0.5 = $2.50/h of $3.00: room for one more -> 3.
    assert (d.after, d.held_by) == (3, None)
    d = one(spec, entry(3, slots=(0, 1, 2)), [*reports, serving("i-2", "rtx4090-2", BUSY_HOUR)], NO_QUEUE, at(57))
    assert (d.after, d.held_by) == (3, HELD_SPEND_CAP)


# --- down ----------------------------------------------------------------------------------------------


def test_scale_down_drains_the_worst_usd_per_proof_first_and_releases_when_drained() -> None:
    rates = {0: 50.0, 1: 30.0, 2: 45.0, 3: 60.0}
    reports = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR, rate=r) for i, r in rates.items()]
    d = one(SPEC, entry(4), reports, NO_QUEUE, at(57))
    assert (d.before, d.after, d.entry.direction) == (4, 1, "down")
    assert d.trailer() == "rtx4090 4 -> 1 (utilization 0.00 for 30 min; no task waiting)"
    assert d.drain == ("i-1", "i-2", "i-0")  # $/proof 0.5/30, 0.5/45, 0.5/50; the 60/h machine stays
    assert d.entry.slots == (0, 1, 2, 3) and d.entry.draining == (0, 1, 2) and not d.released
    # Nothing is deleted mid-proof: the planner keeps the draining slots' instances and never re-rents them.
    spec_now = apply_entries(SPEC, {"rtx4090": d.entry})
    observed = {f"rtx4090-{i}": ObservedSlot(f"rtx4090-{i}", "rtx4090", f"i-{i}", f"m-i-{i}", None, "running")
                for i in range(4)}
    actions = {a.slot: a for a in plan(spec_now, observed, RecordSet(machines={}), None, at(57)).actions}
    assert actions["rtx4090-1"].kind == "keep" and actions["rtx4090-1"].reason == REASON_DRAINING
    # i-1 finished its proofs and stopped: its slot is released (then deleted); the others keep draining.
    reports[1] = serving("i-1", "rtx4090-1", IDLE_HOUR, rate=30.0, stopped_at=58)
    nxt = one(SPEC, {"rtx4090": d.entry}, reports, NO_QUEUE, at(60))
    assert nxt.released == ("rtx4090-1",) and nxt.changed and not nxt.scaled
    assert nxt.entry.slots == (0, 2, 3) and nxt.entry.draining == (0, 2)
    spec_after = apply_entries(SPEC, {"rtx4090": nxt.entry})
    deletes = [a for a in plan(spec_after, observed, RecordSet(machines={}), None, at(60)).actions
               if a.kind == "delete"]
    assert [a.slot for a in deletes] == ["rtx4090-1"]


def test_never_scale_down_on_missing_data() -> None:
    reports = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(3)]
    unreadable = {"rtx4090": QueueSnapshot(error="OperationalError: connection refused")}
    d = one(SPEC, entry(3), reports, unreadable, at(57))
    assert (d.after, d.held_by, d.changed) == (3, HELD_MISSING_DATA, False)
    short = [serving(f"i-{i}", f"rtx4090-{i}", [False] * 3, start=45) for i in range(3)]
    assert one(SPEC, entry(3), short, NO_QUEUE, at(57)).held_by == HELD_MISSING_DATA
    # A machine still benchmarking: the answer to an earlier shortfall has not landed yet.
    on_way = one(SPEC, entry(3), [*reports[:2], benchmarking("n-2", "rtx4090-2", 40)], NO_QUEUE, at(57))
    assert (on_way.after, on_way.held_by) == (3, HELD_ON_THE_WAY)


def test_a_queue_that_cannot_be_read_still_scales_up_on_utilization() -> None:
    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(2)]
    d = one(SPEC, entry(2), reports, {"rtx4090": QueueSnapshot(error="InsufficientPrivilege: denied")}, at(57))
    assert d.after == 3 and "queue unavailable: utilization only" in d.entry.reason


def test_growing_again_cancels_drains_before_renting() -> None:
    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(4)]
    d = one(SPEC, entry(2, slots=(0, 1, 2, 3), draining=(2, 3)), reports, NO_QUEUE, at(57))
    assert d.after == 3 and d.entry.slots == (0, 1, 2, 3) and d.entry.draining == (3,)


def test_no_flapping_a_change_then_the_opposite_within_the_cooldown_is_held() -> None:
    reports = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(3)]
    d = one(SPEC, entry(3, changed_min=50), reports, NO_QUEUE, at(57))
    assert (d.after, d.held_by) == (3, HELD_COOLDOWN)


# --- bounds, pinning, the file -------------------------------------------------------------------------


def test_min_equal_max_pins_and_new_bounds_apply_at_once() -> None:
    pinned = autoscaled_spec(AUTOSCALED_SPEC.replace("min: 1, max: 8", "min: 5, max: 5"))
    assert apply_entries(pinned, entry(2)).pool("rtx4090").count == 5
    d = one(pinned, entry(2), [serving("i-0", "rtx4090-0", IDLE_HOUR)], NO_QUEUE, at(57))
    assert (d.after, d.held_by, d.note) == (5, None, "pinned at 5 (min == max)")
    lowered = autoscaled_spec(AUTOSCALED_SPEC.replace("min: 1, max: 8", "min: 1, max: 3"))
    pool = apply_entries(lowered, entry(6)).pool("rtx4090")
    assert (pool.count, pool.slot_names()) == (3, ["rtx4090-0", "rtx4090-1", "rtx4090-2"])
    fresh = apply_entries(SPEC, {}).pool("rtx4090")
    assert (fresh.count, fresh.desired_count) == (1, 1)  # no decision yet: the pool starts at its min


def test_capacity_file_round_trips_one_line_per_pool_and_a_bad_one_names_the_field() -> None:
    d = one(SPEC, entry(2), [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(2)], NO_QUEUE, at(57))
    text = render_capacity({"rtx4090": d.entry})
    assert next(line for line in text.splitlines() if not line.startswith("#")).startswith('"rtx4090": {"desired": 3')
    parsed, problems = parse_capacity(text, "capacity.yaml")
    assert not problems and parsed["rtx4090"] == replace(d.entry, signals=parsed["rtx4090"].signals)
    _, problems = parse_capacity('rtx4090: {"desired": 2, "slots": [0, 1], "draining": [5]}\n', "capacity.yaml")
    assert [str(p) for p in problems] == [
        "capacity.yaml: error: $.rtx4090.draining: got [5], expected slot indices that are in slots"]
    _, problems = parse_capacity('rtx4090: {"desired": -1, "slots": []}\n', "capacity.yaml")
    assert problems[0].json_path == "$.rtx4090.desired"


@pytest.mark.parametrize(("edit", "path", "words"), [
    (("min: 1, max: 8", "min: 4, max: 2"), "$.pools[0].count.max", "got max 2 < min 4"),
    (("max: 8}", "max: 20}"), "$.pools[0].count.max",
     "20 x max_price_usd_per_hour $0.5/h = $10.00/h is above the fleet spend cap max_total_dph $6/h"),
    (("task_types: [PoRep]", "task_types: [PoRep, Porep]"), "$.pools[0].queue.task_types[1]",
     "got 'Porep', not one of curio's proof task types"),
])
def test_validate_names_the_field_of_bad_bounds_and_task_types(edit: tuple[str, str], path: str, words: str) -> None:
    spec, problems = check_spec_text(AUTOSCALED_SPEC.replace(*edit), "fleet.yaml")
    errors = [p for p in problems if p.severity == "error"]
    assert spec is None and [p.json_path for p in errors] == [path] and words in errors[0].message


def test_an_integer_count_is_still_a_fixed_pool() -> None:
    spec, problems = check_spec_text(AUTOSCALED_SPEC.replace("count: {min: 1, max: 8}", "count: 4"), "fleet.yaml")
    assert spec is not None and spec.pool("rtx4090").count == 4 and spec.pool("rtx4090").min_count is None
    assert {p.json_path for p in problems if p.severity == "warning"} == {"$.pools[0].scaling", "$.pools[0].queue"}
    assert decide_all(spec, {}, [], {}, at(0)) == []


def test_the_cached_spec_follows_the_leaders_capacity_file(tmp_path: Path) -> None:
    """status, plan and apply read the spec through its cache: a new capacity.yaml must change their slots."""
    from reconciler.adapters.spec_files import load_spec_cached

    (tmp_path / "fleet.yaml").write_text(AUTOSCALED_SPEC)
    cache = tmp_path / "spec.pickle"
    assert load_spec_cached(tmp_path / "fleet.yaml", cache).pool("rtx4090").count == 1  # no file: min
    (tmp_path / "capacity.yaml").write_text(render_capacity(entry(3, slots=(0, 2, 5))))
    pool = load_spec_cached(tmp_path / "fleet.yaml", cache).pool("rtx4090")
    assert pool.slot_names() == ["rtx4090-0", "rtx4090-2", "rtx4090-5"] and pool.desired_count == 3
    (tmp_path / "capacity.yaml").write_text('rtx4090: {"desired": "many"}\n')
    with pytest.raises(SpecError) as caught:
        load_spec_cached(tmp_path / "fleet.yaml", cache)
    assert "capacity.yaml: error: $.rtx4090.desired: got 'many', expected an integer >= 0" in str(caught.value)


def test_a_slots_inputs_stay_the_same_while_the_pool_scales_and_a_draining_slot_is_never_replaced() -> None:
    """Pulumi compares every slot's inputs: capacity changes must not touch the slots that stay, and the
    dynamic provider's diff must not re-rent a draining slot whose worker already stopped."""
    from reconciler.domain.slots import SlotOutputs, decode_slot_inputs, slot_diff, slot_inputs

    records = RecordSet(machines={})
    small = apply_entries(SPEC, entry(2)).pool("rtx4090")
    big = apply_entries(SPEC, entry(5)).pool("rtx4090")
    props = [slot_inputs(SPEC, p, "rtx4090-0", records, image="i", image_digest="sha256:" + "a" * 64).to_props()
             for p in (small, big)]
    assert props[0] == props[1] and "draining" not in props[0]
    assert decode_slot_inputs(props[0]).pool.queue == SPEC.pool("rtx4090").queue  # the spec's settings travel
    shrinking = apply_entries(SPEC, entry(1, slots=(0, 1), draining=(1,))).pool("rtx4090")
    inputs = slot_inputs(SPEC, shrinking, "rtx4090-1", records, image="i", image_digest="sha256:" + "a" * 64)
    assert inputs.draining and decode_slot_inputs(inputs.to_props()).draining
    exited = SlotOutputs("rtx4090-1", "rtx4090", "rtx4090-1-abcdef", "c-1", "m-1", "h-1", "RTX 4090", 0.4, "i",
                         "sha256:" + "a" * 64, status="exited")
    diff = slot_diff(exited, inputs)
    assert not diff.replace and "held: draining" in diff.detail


def test_a_human_bound_change_is_committed_as_such_and_release_reasons_do_not_pile_up() -> None:
    pinned = autoscaled_spec(AUTOSCALED_SPEC.replace("min: 1, max: 8", "min: 5, max: 5"))
    d = one(pinned, entry(2), [serving("i-0", "rtx4090-0", IDLE_HOUR)], NO_QUEUE, at(57))
    assert d.changed and d.trailer() == "rtx4090 2 -> 5 (bounds 5..5 in fleet.yaml (pinned at 5 (min == max)))"
    first = {"rtx4090": replace(entry(1, slots=(0, 1, 2), draining=(1, 2))["rtx4090"],
                                reason="utilization 0.10 for 30 min; released rtx4090-3")}
    reports = [serving("i-0", "rtx4090-0", IDLE_HOUR), serving("i-1", "rtx4090-1", IDLE_HOUR, stopped_at=50),
               serving("i-2", "rtx4090-2", IDLE_HOUR)]
    d = one(SPEC, first, reports, NO_QUEUE, at(57))
    assert d.entry.reason == "utilization 0.10 for 30 min; released rtx4090-1"


def test_fleet_validate_says_what_each_autoscaled_pool_may_cost(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from reconciler.cli import main

    (tmp_path / "fleet.yaml").write_text(AUTOSCALED_SPEC)
    assert main(["validate", str(tmp_path / "fleet.yaml")]) == 0
    assert ("  pool rtx4090: 1..8 slots (autoscaled): up to $0.50/h at min, $4.00/h at max (max price $0.5/h per "
            "slot)") in capsys.readouterr().out
    (tmp_path / "capacity.yaml").write_text('rtx4090: {"desired": 2, "slots": "0,1"}\n')
    assert main(["validate", str(tmp_path / "fleet.yaml")]) == 1
    assert "capacity.yaml: error: $.rtx4090.slots: got '0,1', expected a list of distinct slot indices >= 0" in \
        capsys.readouterr().err


def test_known_prices_decide_the_worst_usd_per_proof() -> None:
    # Same measured rate; the dearer machine is the worse $/proof and drains first.
    reports = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR, rate=50.0) for i in range(2)]
    d = one(SPEC, entry(2), reports, NO_QUEUE, at(57), prices={"i-0": 0.45, "i-1": 0.30})
    assert d.drain == ("i-0",)
    d = one(SPEC, entry(2), reports, NO_QUEUE, at(57), prices={"i-0": 0.30, "i-1": 0.45})
    assert d.drain == ("i-1",)
