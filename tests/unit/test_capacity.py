"""Capacity that follows demand, pure (domain/capacity.py), the spec's bounds and the bot's capacity.yaml.

Every time is a computed datetime (no clock): heartbeats are events at chosen minutes (tests/capacity_support).
The windows of AUTOSCALED_SPEC: up 20 min, down 30 min, cooldown 15 min; lost_after 20 min.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from reconciler.adapters.capacity_files import parse_capacity, render_capacity
from reconciler.adapters.spec_files import check_spec_text
from reconciler.domain.capacity import (
    HELD_AT_BOUND,
    HELD_BREAKER,
    HELD_COOLDOWN,
    HELD_KILL_BUDGET,
    HELD_MISSING_DATA,
    HELD_ON_THE_WAY,
    HELD_SPEND_CAP,
    HELD_UNHEARD,
    CapacityEntry,
    DemandSample,
    QueueSnapshot,
    apply_entries,
    decide_all,
    demand_history,
    lasted,
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
          changed_min: float | None = -120, direction: str = "up") -> dict[str, CapacityEntry]:
    return {"rtx4090": CapacityEntry("rtx4090", desired, slots if slots is not None else tuple(range(desired)),
                                     draining, None if changed_min is None else at(changed_min), direction,
                                     "earlier")}


def one(spec, entries, reports, queues, now, **kw):  # type: ignore[no-untyped-def]
    (decision,) = decide_all(apply_entries(spec, entries), entries, reports, queues, now, **kw)
    return decision


def samples(minutes: range | list[float], active: int, queued: float, coming: float = 0.0) -> list[DemandSample]:
    return [DemandSample(at(m), active, queued, 0.0, coming) for m in minutes]


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


def test_samples_cover_a_window_only_from_one_at_its_start_and_without_a_gap() -> None:
    window = timedelta(minutes=20)
    every_5 = samples(range(35, 60, 5), 2, 3.0)  # 35, 40, ..., 55
    assert [s.at for s in lasted(every_5, at(55), window) or []] == [at(35), at(40), at(45), at(50), at(55)]
    assert lasted(every_5, at(56), window) is None or lasted(every_5, at(56), window)[0].at == at(35)
    assert lasted(samples(range(40, 60, 5), 2, 3.0), at(55), window) is None  # none at or before minute 35
    gap = [s for s in every_5 if s.at not in (at(40), at(45))]  # 35, 50, 55: a 15 min gap > window / 2
    assert lasted(gap, at(55), window) is None
    kept = demand_history([*every_5, *samples([10, 20], 2, 1.0)], at(55), timedelta(minutes=30))
    assert [s.at for s in kept] == [at(20), *(s.at for s in every_5)]  # the one that starts the window, then all
    assert DemandSample.from_json(every_5[0].to_json()) == every_5[0]


# --- up: demand that lasted ----------------------------------------------------------------------------


def test_scale_up_when_a_task_waited_scale_up_after_once_per_shortfall() -> None:
    reports = [serving("i-0", "rtx4090-0", BUSY_HOUR), serving("i-1", "rtx4090-1", BUSY_HOUR)]
    queue = {"rtx4090": QueueSnapshot({"PoRep": 31}, {"PoRep": 2}, oldest_waiting_at=at(32))}
    d = one(SPEC, entry(2), reports, queue, at(57))
    # 2 machines busy + 31 tasks / (40/h x 20 min) = 4.3 machine-equivalents, over target 0.8 -> 6.
    assert (d.before, d.after, d.scaled, d.changed) == (2, 6, True, True)
    assert d.trailer() == ("rtx4090 2 -> 6 (the oldest of 31 waiting PoRep tasks has waited 25 min (scale_up_after "
                           "20 min): 2.0 busy + 2.3 to clear the waiting tasks need 6 machines at target 0.80)")
    assert d.entry.slots == (0, 1, 2, 3, 4, 5) and d.entry.direction == "up" and d.entry.changed_at == at(57)
    assert d.entry.signals["queue"]["waiting"] == {"PoRep": 31}
    # The new machines are still in params/benchmark 25 min later (cooldown over), the queue the same:
    # they are capacity on its way, so the same shortfall does not rent again.
    later = [*reports, *(benchmarking(f"n-{i}", f"rtx4090-{i}", 60) for i in range(2, 6))]
    again = one(SPEC, {"rtx4090": d.entry}, [serving("i-0", "rtx4090-0", BUSY_HOUR + BUSY_HOUR[:5]),
                                            serving("i-1", "rtx4090-1", BUSY_HOUR + BUSY_HOUR[:5]), *later[2:]],
                queue, at(82))
    assert (again.after, again.changed, again.held_by) == (6, False, None)


def test_a_deep_queue_that_does_not_last_grows_nothing() -> None:
    """curio claims tasks within seconds: a queue 40 deep that comes and goes between passes, idle machines."""
    reports = [serving(f"i-{i}", f"rtx4090-{i}", [i % 2 == 0 for i in range(12)]) for i in range(2)]
    flicker = {"rtx4090": QueueSnapshot({"PoRep": 40}, {"PoRep": 2}, oldest_waiting_at=at(56.9))}
    history = {"rtx4090": [DemandSample(at(m), 2, 0.0 if m % 2 else 3.0) for m in range(30, 57)]}
    d = one(SPEC, entry(2), reports, flicker, at(57), history=history)
    assert (d.after, d.changed) == (2, False)
    assert d.note.startswith("steady at 2")
    # The same depth for the whole 20 min window (a pass every minute): that demand lasted.
    lasting = {"rtx4090": samples(range(30, 57), 2, 3.0)}
    d = one(SPEC, entry(2), reports, flicker, at(57), history=lasting)
    assert d.after == 5 and d.entry.reason.startswith(
        "waiting work stayed above target 0.80 of the pool for the whole 20 min (at least 3.0 machine-equivalents)")


def test_a_task_waiting_long_enough_grows_an_empty_pool() -> None:
    spec = autoscaled_spec(AUTOSCALED_SPEC.replace("min: 1, max: 8", "min: 0, max: 8"))
    queue = {"rtx4090": QueueSnapshot({"PoRep": 5}, {}, oldest_waiting_at=at(30))}
    d = one(spec, entry(0), [], queue, at(50))
    assert (d.before, d.after) == (0, 1)
    assert d.entry.reason.startswith("the oldest of 5 waiting PoRep tasks has waited 20 min (scale_up_after 20 min)")
    young = {"rtx4090": QueueSnapshot({"PoRep": 5}, {}, oldest_waiting_at=at(45))}
    assert one(spec, entry(0), [], young, at(50)).after == 0  # waiting 5 min < scale_up_after 20: not yet


def test_sectors_past_precommit_grow_the_pool_once_they_lasted_a_window() -> None:
    """curio posts a sector's PoRep task once its seed is on chain, ~75 min after precommit: more than a cold
    start ahead, so the pool grows while the machines are still idle, and does not shrink below that demand."""
    reports = [serving("i-0", "rtx4090-0", IDLE_HOUR)]
    coming = {"rtx4090": QueueSnapshot({"PoRep": 0}, {"PoRep": 0}, upcoming=150)}
    # 150 PoRep over 75 min = 120/h = 3 machines at 40/h, over target 0.8 -> 4; once seen for the whole window.
    assert one(SPEC, entry(1), reports, coming, at(57)).after == 1  # first seen now: not yet
    history = {"rtx4090": samples(range(35, 57, 3), 1, 0.0, coming=3.0)}
    d = one(SPEC, entry(1), reports, coming, at(57), history=history)
    assert (d.before, d.after) == (1, 4)
    assert d.trailer() == ("rtx4090 1 -> 4 (waiting work and sectors past precommit stayed above target 0.80 of "
                           "the pool for the whole 20 min (at least 3.0 machine-equivalents): 3.0 busy need 4 "
                           "machines at target 0.80)")
    idle = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(4)]
    held = one(SPEC, entry(4), idle, coming, at(57))
    assert (held.after, held.changed) == (4, False)  # not below what the coming sectors need
    assert held.note.endswith("150 sectors past precommit need that many")
    assert one(SPEC, entry(4), idle, NO_QUEUE, at(57)).after == 1


def test_a_queue_that_cannot_be_read_still_scales_up_on_utilization() -> None:
    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(2)]
    d = one(SPEC, entry(2), reports, {"rtx4090": QueueSnapshot(error="InsufficientPrivilege: denied")}, at(57))
    assert d.after == 3 and d.entry.reason == (
        "utilization 1.00 over 20 min (above target 0.80) (curio's queue could not be read: utilization only): "
        "2.0 busy need 3 machines at target 0.80")


# --- holds, in the order a human checks them ------------------------------------------------------------


def test_the_bound_is_said_before_the_cooldown_and_each_guard_holds_in_one_sentence() -> None:
    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(4)]
    small = autoscaled_spec(AUTOSCALED_SPEC.replace("max: 8", "max: 4"))
    at_max = one(small, entry(4, changed_min=50), reports, NO_QUEUE, at(57))
    assert (at_max.after, at_max.held_by) == (4, HELD_AT_BOUND)
    assert at_max.note == ("held at max 4 (count.max in fleet.yaml): utilization 1.00 over 20 min (above target "
                           "0.80): 4.0 busy need 5 machines at target 0.80")
    cooling = one(SPEC, entry(4, changed_min=50), reports, NO_QUEUE, at(57))
    assert (cooling.after, cooling.held_by) == (4, HELD_COOLDOWN)
    assert cooling.note.endswith("; the last change (up at 2026-12-02T18:50:00Z) was 7 min ago (< cooldown 15 min)")
    paused = one(SPEC, entry(4), reports, NO_QUEUE, at(57), paused_pools=["rtx4090"])
    assert (paused.after, paused.held_by) == (4, HELD_BREAKER)
    assert paused.note.startswith("held by the circuit breaker: the pool's image is suspect")
    failing = one(SPEC, entry(4), reports, NO_QUEUE, at(57), exhausted_pools=["rtx4090"])
    assert (failing.after, failing.held_by) == (4, HELD_KILL_BUDGET)
    capped = autoscaled_spec(AUTOSCALED_SPEC.replace("max_total_dph: 6.0", "max_total_dph: 2.0")
                             .replace("max: 8", "max: 4"))
    assert one(capped, entry(3), reports[:3], NO_QUEUE, at(57)).after == 4  # 4 x $0.50 = the cap: granted
    tight = autoscaled_spec(AUTOSCALED_SPEC.replace("max_total_dph: 6.0", "max_total_dph: 1.9")
                            .replace("max: 8", "max: 3"))
    t = one(tight, entry(2), [*reports[:2], serving("i-9", "rtx4090-9", BUSY_HOUR)], NO_QUEUE, at(57))
    assert (t.after, t.held_by) == (3, None)  # 3 x 0.5 = 1.5 <= 1.9


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
    assert (d.after, d.held_by) == (3, HELD_SPEND_CAP) and d.note.startswith("held by the fleet spend cap: ")


def test_a_reversal_waits_the_cooldown_plus_the_window_of_its_own_evidence() -> None:
    idle = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(3)]
    # Up at minute 20: a shrink needs cooldown 15 + down window 30 = 45 min after it.
    held = one(SPEC, entry(3, changed_min=20), idle, NO_QUEUE, at(57))
    assert (held.after, held.held_by) == (3, HELD_COOLDOWN)
    assert held.note.endswith("(< cooldown 15 min + the 30 min window of a reversal)")
    assert one(SPEC, entry(3, changed_min=11), idle, NO_QUEUE, at(57)).after == 1
    # Down at minute 20: growing again needs cooldown 15 + up window 20 = 35 min; a shrink only the cooldown.
    busy = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(2)]
    assert one(SPEC, entry(2, changed_min=25, direction="down"), busy, NO_QUEUE, at(57)).held_by == HELD_COOLDOWN
    assert one(SPEC, entry(2, changed_min=20, direction="down"), busy, NO_QUEUE, at(57)).after == 3
    assert one(SPEC, entry(3, changed_min=40, direction="down"), idle, NO_QUEUE, at(57)).after == 1


def test_oscillating_demand_faster_than_the_window_stays_within_the_stated_bound() -> None:
    """Every pass (1 min) the queue flips between 0 and 60 waiting tasks claimed within a minute; the machines are
    busy, then busy every other heartbeat (2 min), then idle, then busy again, an hour each: the count follows
    the load that lasted, with at most one change per cooldown and never up-down-up within three windows
    (windows and cooldown all 10 min)."""
    spec = autoscaled_spec(AUTOSCALED_SPEC.replace(
        "scale_up_after_minutes: 20, scale_down_after_minutes: 30,\n              cooldown_minutes: 15",
        "scale_up_after_minutes: 10, scale_down_after_minutes: 10,\n              cooldown_minutes: 10"))
    entries = entry(2, changed_min=-600)
    history: list[DemandSample] = []
    changes: list[tuple[float, str]] = []
    phases = [lambda k: True, lambda k: k % 2 == 0, lambda k: False, lambda k: True]
    for minute in range(0, 240):
        current = apply_entries(spec, entries).pool("rtx4090")
        beats = [float(m) for m in range(1, minute + 1, 2)][-40:]
        busy = [phases[min(3, int(m) // 60)](k) for k, m in enumerate(beats)]
        reports = [serving(f"i-{i}", f"rtx4090-{i}", busy, beat_minutes=beats)
                   for i in current.slot_indices or () if f"rtx4090-{i}" not in current.draining]
        waiting = 60 if minute % 2 else 0
        queue = {"rtx4090": QueueSnapshot({"PoRep": waiting}, {"PoRep": 3},
                                          oldest_waiting_at=at(minute - 0.5) if waiting else None)}
        (d,) = decide_all(apply_entries(spec, entries), entries, reports, queue, at(minute),
                          history={"rtx4090": history})
        if d.scaled:
            changes.append((minute, d.entry.direction or ""))
        history = list(demand_history([*history, d.sample] if d.sample else history, at(minute),
                                      timedelta(minutes=10)))
        entries = {"rtx4090": replace(d.entry, slots=tuple(i for i in d.entry.slots if i not in d.entry.draining),
                                      draining=())}  # drained at once: a new slot serves at once here
    assert [d for _, d in changes][:1] == ["up"] and "down" in [d for _, d in changes], changes
    for (t0, _), (t1, _) in itertools.pairwise(changes):
        assert t1 - t0 >= 10, changes
    for (t0, a), (_, b), (t2, c) in zip(changes, changes[1:], changes[2:], strict=False):
        assert not (a == c == "up" and b == "down" and t2 - t0 < 30), changes


# --- down: positive evidence of idleness, and every shrink drains ----------------------------------------


def test_scale_down_drains_the_worst_usd_per_proof_first_and_releases_when_drained() -> None:
    rates = {0: 50.0, 1: 30.0, 2: 45.0, 3: 60.0}
    reports = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR, rate=r) for i, r in rates.items()]
    d = one(SPEC, entry(4), reports, NO_QUEUE, at(57))
    assert (d.before, d.after, d.entry.direction) == (4, 1, "down")
    assert d.trailer() == ("rtx4090 4 -> 1 (utilization 0.00 over 30 min with no task waiting: 1 machine keeps it at "
                           "most 0.65 busy (target 0.80 - margin 0.15); draining rtx4090-1 ($0.0167/proof), "
                           "rtx4090-2 ($0.0111/proof), rtx4090-0 ($0.0100/proof))")
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
    assert nxt.trailer() == "rtx4090 released rtx4090-1 (drained: nothing proves there any more)"
    assert nxt.entry.slots == (0, 2, 3) and nxt.entry.draining == (0, 2) and nxt.entry.reason == d.entry.reason
    spec_after = apply_entries(SPEC, {"rtx4090": nxt.entry})
    deletes = [a for a in plan(spec_after, observed, RecordSet(machines={}), None, at(60)).actions
               if a.kind == "delete"]
    assert [a.slot for a in deletes] == ["rtx4090-1"]


def test_never_scale_down_on_missing_data() -> None:
    reports = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(3)]
    unreadable = {"rtx4090": QueueSnapshot(error="OperationalError: connection refused")}
    d = one(SPEC, entry(3), reports, unreadable, at(57))
    assert (d.after, d.held_by, d.changed) == (3, HELD_MISSING_DATA, False)
    assert d.note == ("held: curio's queue could not be read (OperationalError: connection refused); a pool never "
                      "shrinks on missing data")
    short = [serving(f"i-{i}", f"rtx4090-{i}", [False] * 3, start=45) for i in range(3)]
    d = one(SPEC, entry(3), short, NO_QUEUE, at(57))
    assert d.held_by == HELD_MISSING_DATA and d.note.startswith("held: heartbeats cover 33% of the 30 min window")
    # A machine still benchmarking: the answer to an earlier shortfall has not landed yet.
    on_way = one(SPEC, entry(3), [*reports[:2], benchmarking("n-2", "rtx4090-2", 40)], NO_QUEUE, at(57))
    assert (on_way.after, on_way.held_by) == (3, HELD_ON_THE_WAY)
    # No machine serving: no queue source -> nothing shows idleness; a queue read empty for the whole window does.
    nothing = autoscaled_spec(AUTOSCALED_SPEC.replace("    queue: {url_env: CURIO_DB_URL, task_types: [PoRep]}\n", ""))
    d = one(nothing, entry(3), [], {}, at(57))
    assert (d.after, d.held_by) == (3, HELD_MISSING_DATA) and "no machine serving and no queue source" in d.note
    assert one(SPEC, entry(3), [], NO_QUEUE, at(57)).held_by == HELD_MISSING_DATA  # empty for one pass only
    empty = {"rtx4090": samples(range(20, 57, 5), 3, 0.0)}
    d = one(SPEC, entry(3), [], NO_QUEUE, at(57), history=empty)
    assert d.after == 1 and d.released == ("rtx4090-1", "rtx4090-2")


def test_fleet_wide_silence_changes_no_count_and_says_why() -> None:
    """Every worker silent past lost_after (the controller's own outage, or a partition): no shrink, no release of
    the silent machines' slots (not even draining ones), no growth; a single silent machine while the others
    are heard is lost, and its slot goes first."""
    silent = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR[:6], rate=60.0 - i) for i in range(3)]  # last beat 26
    d = one(SPEC, entry(3, slots=(0, 1, 2, 3), draining=(3,)), [*silent, serving("i-3", "rtx4090-3", IDLE_HOUR[:6])],
            NO_QUEUE, at(57))
    assert (d.after, d.changed, d.held_by, d.released, d.drain) == (3, False, HELD_UNHEARD, (), ())
    assert d.note == ("held at 3: the controller has heard no worker for 31 min (> lost_after 20 min): its own "
                      "outage or a partition, not idleness; every count holds")
    assert d.signals.to_json(at(57))["unheard"].startswith("the controller has heard no worker for 31 min")
    busy = {"rtx4090": QueueSnapshot({"PoRep": 30}, {}, oldest_waiting_at=at(20))}
    assert one(SPEC, entry(3), silent, busy, at(57)).held_by == HELD_UNHEARD  # not a growth either
    # The fleet coming back: silent from 26 to 51, heard again at 51 and 56: held until heard for lost_after.
    back = [serving(f"i-{i}", f"rtx4090-{i}", [False] * 8, beat_minutes=[1, 6, 11, 16, 21, 26, 51 + i, 56])
            for i in range(3)]
    d = one(SPEC, entry(3), back, NO_QUEUE, at(57))
    assert d.held_by == HELD_UNHEARD and "heard the fleet again at 2026-12-02T18:51:00Z after 25 min of silence" in \
        d.note
    # Later, heard for a while: the down window still reaches into the silence, so still no shrink.
    d = one(SPEC, entry(3), back, NO_QUEUE, at(73))
    assert d.held_by in (HELD_MISSING_DATA, HELD_UNHEARD) and d.after == 3
    # A fleet that was empty (its last worker gone at minute 10) getting a new one at 50 is not coming back.
    gone = replace(serving("i-9", "rtx4090-9", IDLE_HOUR[:2]), destroyed_at=at(10))
    fresh = benchmarking("n-0", "rtx4090-0", 50)
    assert one(SPEC, entry(1), [gone, fresh], NO_QUEUE, at(57)).held_by != HELD_UNHEARD
    # One machine silent while the others are heard: lost, the one released first.
    one_lost = [serving("i-0", "rtx4090-0", IDLE_HOUR[:6]), *(serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR)
                                                            for i in (1, 2))]
    d = one(SPEC, entry(3), one_lost, NO_QUEUE, at(57))
    assert d.after == 1 and d.released == ("rtx4090-0",) and len(d.drain) == 1


def test_growing_again_cancels_drains_before_renting() -> None:
    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(4)]
    d = one(SPEC, entry(2, slots=(0, 1, 2, 3), draining=(2, 3), direction="down"), reports, NO_QUEUE, at(57))
    assert d.after == 3 and d.entry.slots == (0, 1, 2, 3) and d.entry.draining == (3,)


def test_an_entry_stored_out_of_order_decides_as_the_same_entry_in_order() -> None:
    # capacity.yaml written by hand (or by an older leader) may list slots and drains in any order: the decision,
    # its entry (in order) and whether the file changes are those of the same entry in order.
    busy = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(4)]
    idle = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(3)]
    unreadable = {"rtx4090": QueueSnapshot(error="OperationalError: connection refused")}
    cases = [(entry(2, slots=(3, 0, 2, 1), draining=(3, 2), direction="down"),
              entry(2, slots=(0, 1, 2, 3), draining=(2, 3), direction="down"), busy, NO_QUEUE),
             (entry(3, slots=(2, 0, 1)), entry(3), idle, unreadable),
             (entry(4, slots=(3, 1, 0, 2)), entry(4), [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR, rate=r)
                                                         for i, r in enumerate((50.0, 30.0, 45.0, 60.0))], NO_QUEUE)]
    for shuffled, ordered, reports, queues in cases:
        a, b = one(SPEC, shuffled, reports, queues, at(57)), one(SPEC, ordered, reports, queues, at(57))
        assert (a.entry, a.changed, a.drain, a.released, a.after) == (b.entry, b.changed, b.drain, b.released, b.after)
        assert a.entry.slots == tuple(sorted(a.entry.slots)) and a.entry.draining == tuple(sorted(a.entry.draining))
    held = one(SPEC, cases[1][0], idle, unreadable, at(57))
    assert not held.changed and held.entry.slots == (0, 1, 2)


# --- bounds, pinning, the file -------------------------------------------------------------------------


def test_a_lowered_max_drains_the_worst_usd_per_proof_machine_never_the_highest_slot_mid_proof() -> None:
    lowered = autoscaled_spec(AUTOSCALED_SPEC.replace("min: 1, max: 8", "min: 1, max: 3"))
    # Busy mid-proof; slot 3 is the best machine, slot 1 the worst; slot 4 has no instance any more.
    rates = {0: 48.0, 1: 36.0, 2: 60.0, 3: 72.0}
    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR, rate=r, proofs_per_beat=int(r / 12))
               for i, r in rates.items()]
    pool = apply_entries(lowered, entry(5)).pool("rtx4090")
    assert (pool.count, pool.desired_count) == (5, 3)  # every slot stays until drained
    d = one(lowered, entry(5), reports, NO_QUEUE, at(57))
    assert (d.before, d.after, d.entry.direction) == (5, 3, "down")
    assert d.released == ("rtx4090-4",) and d.drain == ("i-1",) and d.entry.draining == (1,)
    assert d.trailer().startswith("rtx4090 5 -> 3 (bounds 1..3 in fleet.yaml lowered the count: a human's "
                                  "decision; draining rtx4090-1 ($0.0139/proof))")
    assert d.entry.changed_at == at(57) and d.entry.direction == "down"


def test_a_pin_applies_at_once_and_drains_like_any_shrink() -> None:
    pinned = autoscaled_spec(AUTOSCALED_SPEC.replace("min: 1, max: 8", "min: 5, max: 5"))
    assert apply_entries(pinned, entry(2)).pool("rtx4090").count == 5
    d = one(pinned, entry(2), [serving("i-0", "rtx4090-0", IDLE_HOUR)], NO_QUEUE, at(57))
    assert (d.after, d.held_by) == (5, None)
    assert d.trailer() == "rtx4090 2 -> 5 (min == max = 5 (a pin) in fleet.yaml raised the count: a human's decision)"
    steady = one(pinned, {"rtx4090": d.entry}, [serving("i-0", "rtx4090-0", IDLE_HOUR)], NO_QUEUE, at(58))
    assert (steady.changed, steady.note) == (False, "pinned at 5 (min == max in fleet.yaml)")
    low = autoscaled_spec(AUTOSCALED_SPEC.replace("min: 1, max: 8", "min: 1, max: 1"))
    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR, rate=r, proofs_per_beat=int(r / 12))
               for i, r in enumerate((36.0, 60.0))]
    d = one(low, entry(2), reports, NO_QUEUE, at(57))
    assert d.after == 1 and d.drain == ("i-0",) and d.entry.slots == (0, 1)
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
    (("task_types: [PoRep]", "task_types: [PoRep, PSProve]"), "$.pools[0].queue.task_types[1]",
     "got 'PSProve': Snark Market work is never the operator's own demand; take it by its price under queue.market"),
    (("task_types: [PoRep]}", "task_types: [PoRep], market: {min_margin: 0.2}}"), "$.pools[0].queue.market",
     "missing required field(s): usd_per_fil"),
    (("task_types: [PoRep]}", "task_types: [PoRep], market: {task_types: [PoRep], usd_per_fil: 4}}"),
     "$.pools[0].queue.market.task_types[0]", "got 'PoRep', not one of curio's Snark Market task types: PSProve"),
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


def test_within_bounds_cached_gives_what_it_computes_afresh() -> None:
    # within_bounds is cached on the pool's bounds and the entry's counts, slots and draining: an equal entry (another
    # object, or stored out of order) gets exactly what the rule computes for it, and decides the same.
    from reconciler.domain.capacity import _bounded, within_bounds

    pool = SPEC.pool("rtx4090")  # bounds 1..8
    cases = [(3, (0, 1, 2), ()), (5, (4, 0, 2), (2,)), (0, (), ()), (12, (1, 3), (3, 1)), (2, (0, 1, 2, 3), (2, 3)),
             (1, (0, 1, 2), (1, 2))]
    for desired, slots, draining in cases:
        stored = CapacityEntry("rtx4090", desired, slots, draining)
        fresh = _bounded.__wrapped__(*pool.bounds, desired, slots, draining)
        assert within_bounds(pool, stored) == within_bounds(pool, replace(stored, slots=tuple(slots))) == fresh
    reports = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR, rate=r) for i, r in enumerate((50.0, 30.0, 45.0))]
    _bounded.cache_clear()
    cold = one(SPEC, entry(3), reports, NO_QUEUE, at(57))
    warm = one(SPEC, entry(3), reports, NO_QUEUE, at(57))
    assert _bounded.cache_info().hits and (cold.entry, cold.drain, cold.released) == (warm.entry, warm.drain,
                                                                                       warm.released)


def test_slot_counts_handed_in_decide_as_those_counted_from_the_slots() -> None:
    # The replay knows how many slots it made in each state and hands the counts in (PoolSignals.counts): every
    # rule reads them as it reads the counts of the slots themselves.
    from collections import Counter

    from reconciler.domain.capacity import decide_pool, signals_for
    from reconciler.domain.serving import FleetHearing

    pool = apply_entries(SPEC, entry(4)).pool("rtx4090")
    cases = [[serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(4)],  # shrinks
             [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(3)],  # one empty, released first
             [*(serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(3)),
              benchmarking("n-3", "rtx4090-3", 40)],  # on its way: held
             [serving(f"i-{i}", f"rtx4090-{i}", BUSY_HOUR) for i in range(4)],  # grows
             [serving("i-0", "rtx4090-0", IDLE_HOUR, stopped_at=50)]]  # stopped
    for reports in cases:
        now = at(57)
        counted = signals_for(pool, reports, NO_QUEUE["rtx4090"], SPEC.serving, {}, now,
                              hearing=FleetHearing(now, timedelta(minutes=20)))
        handed = replace(counted, counts=dict(Counter(s.state for s in counted.slots)))
        for stored in (entry(4)["rtx4090"], None):
            a = decide_pool(pool, stored, counted, now)
            b = decide_pool(pool, stored, handed, now)
            assert (a.entry, a.changed, a.held_by, a.note, a.released, a.drain, a.sample) == \
                (b.entry, b.changed, b.held_by, b.note, b.released, b.drain, b.sample)
            assert a.signals.to_json(now) == b.signals.to_json(now)


def test_heard_slots_handed_in_decide_as_those_looked_for_in_the_slots() -> None:
    # The replay knows which of its slots carry heard_at and hands them in (PoolSignals.heard): a shrink reads them
    # as it reads the slots themselves (none heard, all heard as reported, one heard too long ago).
    from reconciler.domain.capacity import decide_pool, signals_for
    from reconciler.domain.serving import FleetHearing

    pool = apply_entries(SPEC, entry(4)).pool("rtx4090")
    now = at(57)
    reports = [serving(f"i-{i}", f"rtx4090-{i}", IDLE_HOUR) for i in range(4)]  # shrinks
    counted = signals_for(pool, reports, NO_QUEUE["rtx4090"], SPEC.serving, {}, now,
                          hearing=FleetHearing(now, timedelta(minutes=20)))
    none_heard = tuple(replace(s, heard_at=None) for s in counted.slots)
    late = (*none_heard[:1], replace(none_heard[1], heard_at=now - timedelta(hours=1)), *none_heard[2:])
    notes = set()
    for slots in (counted.slots, none_heard, late):
        looked = replace(counted, slots=slots)
        handed = replace(looked, heard=tuple(s for s in slots if s.heard_at is not None))
        for stored in (entry(4)["rtx4090"], None):
            a = decide_pool(pool, stored, looked, now)
            b = decide_pool(pool, stored, handed, now)
            assert (a.entry, a.changed, a.held_by, a.note, a.released, a.drain, a.sample) == \
                (b.entry, b.changed, b.held_by, b.note, b.released, b.drain, b.sample)
            notes.add(a.note)
    assert any("not heard for longer than a heartbeat allows" in n for n in notes)
    assert any(n == "" for n in notes)  # the others shrink


def test_the_replays_slot_states_come_with_their_counts() -> None:
    # The replay makes a pool's slot states from counts and hands those counts to the decision (PoolSignals.counts):
    # they are what counting the states gives, and the slots are those of the entry, in index order.
    from collections import Counter

    from reconciler.domain.capacity import within_bounds
    from reconciler.domain.replay import _synth_slots

    pool = SPEC.pool("rtx4090")  # bounds 1..8
    entries = [None, CapacityEntry("rtx4090", 5, (0, 1, 2, 3, 4)), CapacityEntry("rtx4090", 3, (4, 0, 7, 2), (7, 0)),
               CapacityEntry("rtx4090", 6, (1, 2, 3), (2,)), CapacityEntry("rtx4090", 1, (0, 1, 2), (0, 1, 2))]
    for stored in entries:
        slots, draining, _ = within_bounds(pool, stored)
        for serving_, on_the_way, draining_serving in [(0, 0, 0), (2, 1, 1), (9, 0, 3), (1, 9, 0), (-1, 2, -1)]:
            states, counts = _synth_slots(pool, stored, serving_, on_the_way, draining_serving)
            assert counts == dict(Counter(s.state for s in states))
            assert tuple(s.index for s in states) == slots
            assert all(s.state in ("serving", "stopped") for s in states if s.index in draining)
    # Slots 0, 2, 4, 7 with 7 draining (desired 3 un-drains 0): active 0 serves, 2 is on its way, 4 is empty; 7
    # serves as history's one draining machine did.
    states, counts = _synth_slots(pool, entries[2], 1, 1, 1)
    assert [s.state for s in states] == ["serving", "on-the-way", "empty", "serving"]
    assert counts == {"serving": 2, "on-the-way": 1, "empty": 1}
