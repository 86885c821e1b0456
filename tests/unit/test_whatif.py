"""The replay (domain/replay.py) and its comparison (domain/whatif.py), pure: histories are made by the real
`judging.decide` pass after pass on reports the judge reads (tests/scenarios.py), never written by hand; the
replay must give the guards exactly what the full records would, say which recorded decision it could not
reproduce (first), and count what it cannot replay."""

from __future__ import annotations

import pickle
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from reconciler.domain.breaker import kill_budgets, kill_budgets_of_marks
from reconciler.domain.capacity import CapacityEntry, apply_entries
from reconciler.domain.judging import decide, guard_and_record
from reconciler.domain.observations import BenchmarkResult, InstanceReport, ProofResult, format_time
from reconciler.domain.records import MachineRecord, RecordSet, record_time
from reconciler.domain.replay import (
    NOT_RENTED,
    UNKNOWN,
    Attempt,
    History,
    ReplayRecords,
    SpecVersion,
    _Guards,
    attempts,
    candidate,
    replay,
    unguarded,
)
from reconciler.domain.verdict import HELD_BY_CIRCUIT_BREAKER, HELD_BY_KILL_BUDGET
from reconciler.domain.whatif import fate, recorded_run, replays, summarize, what_if
from reconciler.flows.whatif import replays_on_two_cores
from reconciler.render.whatif import Header, render_whatif_markdown, render_whatif_text
from tests.capacity_support import autoscaled_spec
from tests.scenarios import (
    IMAGE_CUDA_TAIL,
    SPEC,
    T0,
    completed_report,
    error_report,
    ev,
    make_report,
)

POOL = "rtx4090"


def rated(iid: str, machine: str, seconds: list[float], *, minute: float = 0.0) -> InstanceReport:
    """A completed benchmark whose proofs took `seconds` each (the result carries them, as workers send them),
    registered `minute` minutes after T0."""
    total = sum(seconds)
    rate = 3600.0 * len(seconds) / total
    start = T0 + timedelta(minutes=minute + 25)
    result = BenchmarkResult("completed", start + timedelta(seconds=total), len(seconds), len(seconds), 0,
                             started_at=start, exit_code=0, proofs_per_hour=round(rate, 3),
                             seconds_per_proof=round(total / len(seconds), 3), concurrency=1,
                             proofs=tuple(ProofResult(i + 1, "COMPLETED", s) for i, s in enumerate(seconds)))
    events = [ev("params", "started", minute + 1), ev("params", "done", minute + 22),
              ev("benchmark", "started", minute + 25, details={"requested": len(seconds), "concurrency": 1})]
    return make_report(iid, machine, pool=POOL, gpu_name="RTX 4090", events=events, result=result,
                       registered_min=minute)


def history_of(passes: list[tuple[datetime, list[InstanceReport]]], *, spec=SPEC,
               since: datetime | None = None) -> History:
    """Run `decide` pass by pass (each pass sees every report so far, as the store keeps them) and keep the records
    it writes: the history the replay reads."""
    records = RecordSet()
    judged: set[str] = set()
    seen: list[InstanceReport] = []
    for now, reports in passes:
        seen += reports
        d = decide(spec, seen, records, judged, None, now)
        judged |= {v.instance_id for v in d.verdicts}
        records = RecordSet(machines={**records.machines, **d.machine_records},
                            images={**records.images, **d.image_records})
    start = since or T0 - timedelta(hours=1)
    return History(since=start, until=passes[-1][0] + timedelta(minutes=1), machines=dict(records.machines),
                   images=dict(records.images), specs=(SpecVersion(start, spec),))


def with_min(rate: float, pool: str = POOL):
    return replace(SPEC, pools=tuple(replace(p, min_rate_proofs_per_hour=rate) if p.name == pool else p
                                     for p in SPEC.pools))


LATER = T0 + timedelta(hours=2)


def test_the_unchanged_spec_reproduces_history_and_a_raised_minimum_flips_the_machines_between() -> None:
    # 10 proofs: 80 s each = 45/h, 86 s = 41.9/h, 60 s = 60/h against a 40/h minimum.
    h = history_of([(LATER, [rated("a", "m-a", [80.0] * 10), rated("b", "m-b", [86.0] * 10),
                             rated("c", "m-c", [60.0] * 10)])])
    same = what_if(h, SPEC, SPEC)
    assert same.self_check.ok and same.self_check.verdicts == same.self_check.verdicts_matched == 3
    assert same.flips == ()
    raised = what_if(h, SPEC, with_min(50))
    flipped = {f.machine_id: f for f in raised.flips}
    assert set(flipped) == {"m-a", "m-b"}
    assert flipped["m-a"].base == "ok" and flipped["m-a"].rate == pytest.approx(45.0)
    assert flipped["m-a"].pr in ("below-min-rate", "early-below-min-rate")
    pool = next(p for p in raised.pools if p.pool == POOL)
    assert pool.lost[0] == 2 and pool.lost[1] == pytest.approx(45.0 + 3600 * 10 / 860, abs=0.01)


def test_a_benchmark_whose_best_case_falls_below_the_new_minimum_is_ended_early_at_that_proof() -> None:
    # Warm-up 200 s, then 75 s proofs (48/h): above 40/h, hopeless against 60/h once enough proofs are measured.
    report = rated("a", "m-a", [200.0] + [75.0] * 9)
    h = history_of([(LATER, [report])])
    (a,) = attempts(h)
    c = candidate(a, with_min(60), SPEC)
    assert c.verdict is not None and c.verdict.verdict == "early-below-min-rate"
    measured = SPEC.early_verdict.min_measured_proofs
    assert c.at == T0 + timedelta(minutes=25, seconds=200 + 75 * measured)  # the warm-up, then that many proofs
    assert candidate(a, SPEC, SPEC).verdict.verdict == "ok"  # type: ignore[union-attr]


def test_an_early_verdict_is_judged_again_on_its_proofs_and_unknown_where_the_run_was_cut() -> None:
    # A benchmark cut by an early verdict (min 60/h) once enough proofs after the warm-up were measured; its proofs
    # are kept in the evidence.
    seconds = [200.0] + [75.0] * SPEC.early_verdict.min_measured_proofs
    running = make_report("a", "m-a", pool=POOL, gpu_name="RTX 4090", events=[
        ev("params", "done", 22), ev("benchmark", "started", 25, details={"requested": 10, "concurrency": 1}),
        *(ev("benchmark", "progress", 29 + i, details={"proof": {"index": i + 1, "label": "COMPLETED",
                                                                  "seconds": s}}) for i, s in enumerate(seconds))])
    h = history_of([(T0 + timedelta(minutes=30 + len(seconds)), [running])], spec=with_min(60))
    (a,) = attempts(h)
    assert a.entry.verdict == "early-below-min-rate"
    assert candidate(a, with_min(60), with_min(60)).verdict.verdict == "early-below-min-rate"  # type: ignore
    lower = candidate(a, SPEC, with_min(60))  # 40/h: it would have run on, and how it ended was never measured
    assert lower.verdict is None and lower.outcome == UNKNOWN


def test_the_replays_record_view_gives_correlation_and_guards_what_the_full_records_give() -> None:
    # Failures on one image (the breaker's history), bad marks (the kill budget's), over several passes.
    passes = []
    for i in range(6):
        at = T0 + timedelta(hours=i)
        passes.append((at, [error_report(f"e{i}", f"m-e{i % 3}", IMAGE_CUDA_TAIL, pool=POOL, registered_min=60 * i),
                            completed_report(f"s{i}", f"m-s{i}", 20.0, pool=POOL, registered_min=60 * i)]))
    h = history_of(passes)
    records = RecordSet(machines=h.machines, images=h.images)
    replay_records = ReplayRecords(h.machines, h.images)
    new = [error_report("n1", "m-new", IMAGE_CUDA_TAIL, pool=POOL), completed_report("n2", "m-s0", 21.0, pool=POOL),
           completed_report("n3", "m-n3", 19.0, pool=POOL), completed_report("n4", "m-s1", 55.0, pool=POOL)]
    for hours in (3, 6, 30):
        now = T0 + timedelta(hours=hours)
        verdicts = [v for v in decide(SPEC, new, RecordSet(), set(), None, now).verdicts]
        passing = [v for v in verdicts if not v.is_failure]
        assert passing
        # The kill budgets from the replay's own marks within reach (as `_Guards` keeps them).
        budgets = kill_budgets_of_marks(
            SPEC, replay_records.marks_since(now - timedelta(hours=SPEC.kill_budget.window_hours)), now)
        for chosen in (verdicts, passing):  # a pass that passes reads less
            failing = any(v.is_failure for v in chosen)
            view = replay_records.view(
                now, {v.machine_id for v in chosen if v.machine_id},
                max(SPEC.circuit_breaker.window_hours, SPEC.retest.window_hours) if failing else 0.0)
            got = guard_and_record(SPEC, view, chosen, now, budgets=budgets)
            want = guard_and_record(SPEC, records, chosen, now)
            # The same verdicts, records, image records and kill budgets.
            assert (got[0].verdicts, got[0].image_records, got[0].kill_budgets, got[1], got[2]) == \
                (want[0].verdicts, want[0].image_records, want[0].kill_budgets, want[1], want[2]), hours


def test_a_failing_pass_view_gathers_the_window_only_when_the_guards_read_beyond_its_own_machines() -> None:
    passes = [(T0 + timedelta(hours=i), [error_report(f"e{i}", f"m-e{i}", IMAGE_CUDA_TAIL, pool=POOL,
                                                      registered_min=60 * i)]) for i in range(4)]
    h = history_of(passes)
    replay_records = ReplayRecords(h.machines, h.images)
    now = T0 + timedelta(hours=4)
    since = now - timedelta(hours=2)
    view = replay_records.view(now, {"m-e3", "m-new"}, 2.0)
    machines = view.machines
    # Its own machines (and one without a record) are read without gathering the window ...
    assert machines["m-e3"] is h.machines["m-e3"] and "m-new" not in machines and machines.get("m-new") is None
    # ... so a change of the records after them is caught when the window is read at last.
    replay_records.put(h.machines["m-e0"])
    with pytest.raises(RuntimeError):
        list(machines)
    # Read in time, it holds the records of its own machines and of those judged within the window, by id.
    view = replay_records.view(now, {"m-e3", "m-new"}, 2.0)
    judged = sorted(m for m, rec in h.machines.items() if any(e.at >= "2026-12-02T20:" for e in rec.benchmarks))
    assert dict(view.machines) == replay_records.within(since, {"m-e3"}) == {m: h.machines[m] for m in judged}
    assert list(view.machines) == judged and len(view.machines) == len(judged) >= 2
    assert "m-e0" not in view.machines and "m-e2" in view.machines


def test_the_kill_budgets_the_replay_keeps_are_the_rules_at_every_pass_as_marks_leave_the_window() -> None:
    # Marks in two pools; passes before, exactly when and after each leaves the window, and a new mark between: the
    # budgets kept between passes (read again pool by pool) are those `breaker.kill_budgets` reads from the records.
    h = history_of([(T0, [completed_report("s0", "m-s0", 20.0, pool=POOL)]),
                    (T0 + timedelta(minutes=30), [completed_report("o0", "m-o0", 20.0, pool="rtx-pro-4000")]),
                    (T0 + timedelta(hours=1), [completed_report("s1", "m-s1", 20.0, pool=POOL)])])
    records, guards = ReplayRecords(h.machines, h.images), _Guards()
    window = timedelta(hours=SPEC.kill_budget.window_hours)
    left = sorted(record_time(at) for _, _, at in records.marks_since(T0 - window))
    assert len(left) == 3 and len(records.marks_since(T0 - window, [POOL])) == 2
    times = sorted({t + d for t in left for d in (-window, timedelta(0), window, window + timedelta(minutes=5))})
    for at in times:
        if at == left[0] + window:  # a new mark meanwhile (as the first leaves), on a machine in the budget before
            records.put(records.machines["m-s0"].with_entry(replace(
                records.machines["m-s0"].benchmarks[-1], instance_id="s0b", at=format_time(at)),
                host_id=None, gpu_name=None))
        applied = guards.applied(SPEC, {})
        want = kill_budgets(applied, RecordSet(machines=dict(records.machines)), at)
        assert dict(guards.budgets(SPEC, {}, records, at)) == want, at
    assert want[POOL].used == ("m-s0",) and want["rtx-pro-4000"].used == ()  # the new mark stays; the others left


def test_the_spec_the_replay_keeps_is_apply_entries_of_its_entries_after_every_change() -> None:
    # The replay applies a pool's entry again only when it changed, and remembers the pool applied per entry read:
    # an entry that differs only in when and why it changed, one back to an earlier count, a draining slot.
    spec = autoscaled_spec()
    guards = _Guards()
    first = CapacityEntry(POOL, 3, (0, 1, 2), changed_at=T0, direction="up", reason="up")
    steps = [first, replace(first, changed_at=T0 + timedelta(hours=1), direction="down", reason="again"),
             CapacityEntry(POOL, 5, (0, 1, 2, 3, 4), changed_at=T0 + timedelta(hours=2), direction="up"),
             CapacityEntry(POOL, 2, (0, 1, 2, 3, 4), (3, 4), changed_at=T0 + timedelta(hours=3), direction="down"),
             replace(first, changed_at=T0 + timedelta(hours=4))]
    assert guards.applied(spec, {}) == apply_entries(spec, {})
    for entry in steps:
        entries = {POOL: entry}
        guards.entry_changed(POOL)
        assert guards.applied(spec, entries) == apply_entries(spec, entries), entry


def test_a_guard_hold_is_undone_from_what_the_judge_said_before_it() -> None:
    h = history_of([(LATER, [completed_report(f"s{i}", f"m{i}", 20.0, pool=POOL) for i in range(4)])])
    held = [a.entry for a in attempts(h) if a.entry.held_by == HELD_BY_KILL_BUDGET]
    assert held and all(unguarded(e) == ("machine", True, False) for e in held)
    # A record written before the judge's word was kept: read back from what the guard does.
    old = replace(held[0], evidence={k: v for k, v in held[0].evidence.items() if k != "unguarded"})
    assert unguarded(old) == ("machine", True, True)
    image = history_of([(LATER + timedelta(minutes=i), [error_report(f"e{i}", f"m{i}", IMAGE_CUDA_TAIL, pool=POOL)])
                        for i in range(3)])
    by_breaker = [a.entry for a in attempts(image) if a.entry.held_by == HELD_BY_CIRCUIT_BREAKER]
    assert by_breaker and unguarded(by_breaker[0])[0] == "image"


def test_a_decision_the_replay_cannot_reproduce_is_reported_first_and_on_top() -> None:
    h = history_of([(LATER, [rated("a", "m-a", [80.0] * 10)]),
                    (LATER + timedelta(minutes=5), [rated("b", "m-b", [86.0] * 10)])])
    # Someone's record says m-b was below the minimum: the judge, given its evidence, says otherwise.
    rec = h.machines["m-b"]
    entry = replace(rec.benchmarks[0], verdict="below-min-rate", blame="machine", marks_bad=True)
    tampered = replace(h, machines={**h.machines, "m-b": replace(rec, benchmarks=(entry,))})
    result = what_if(tampered, SPEC, SPEC)
    check = result.self_check
    assert not check.ok and check.mismatch_count == 1 and check.verdicts_matched == 1
    assert check.first is not None and "instance b (machine m-b" in check.first
    assert "recorded below-min-rate (blame machine, bad); replayed ok (blame none)" in check.first
    text = render_whatif_text(result, Header("fleet.yaml", "main", "0" * 40))
    assert text.splitlines()[3].startswith("SELF-CHECK FAILED: 1 recorded decision(s) not reproduced")
    markdown = render_whatif_markdown(result, Header("fleet.yaml", "main", "0" * 40))
    assert markdown.splitlines()[2] == "> [!WARNING]"


def test_a_machine_the_replay_marked_bad_is_not_rented_again_while_bad() -> None:
    first = rated("a1", "m-a", [80.0] * 10)
    again = rated("a2", "m-a", [80.0] * 10, minute=180)  # rented again after its first benchmark passed
    h = history_of([(LATER, [first]), (LATER + timedelta(hours=3), [again])])
    run = replay(h, lambda _t: with_min(50), "PR")
    assert run.admission("a1").verdict.marks_bad  # type: ignore[union-attr]
    fate = run.admission("a2")
    assert fate is not None and fate.outcome == NOT_RENTED and "m-a was excluded then" in fate.why


def test_limits_are_counted_never_guessed() -> None:
    h = history_of([(LATER, [rated("a", "m-a", [80.0] * 10)])])
    result = what_if(h, SPEC, with_min(50))
    texts = [f"{limit.count:g} {limit.what}" for limit in result.limits]
    assert "1 flipped machines without a recorded price ($/h shown as ?)" in texts
    assert any(t.startswith("0 pool rtx4090: no demand samples in the window") for t in texts)
    assert any("which offer would have filled their slot is not known" in t for t in texts)


def test_attempt_times_come_from_the_record() -> None:
    h = history_of([(LATER, [rated("a", "m-a", [80.0] * 10)])])
    (a,) = attempts(h)
    assert isinstance(a, Attempt) and a.at == LATER and a.registered_at == T0
    assert isinstance(h.machines["m-a"], MachineRecord)


def test_the_replays_on_two_cores_answer_what_one_process_answers() -> None:
    # The recorded run in a forked child, sent back summarized; the PR's run here deciding everything itself (no
    # run to follow).
    h = history_of([(LATER, [rated("a", "m-a", [80.0] * 10), rated("b", "m-b", [86.0] * 10),
                             rated("c", "m-c", [60.0] * 10)])])
    raised = with_min(50)
    calls: list[int] = []

    def meanwhile() -> None:  # the caller's own work, while the child finishes
        calls.append(1)

    found, runs = replays_on_two_cores(h, SPEC, raised, fork=True, meanwhile=meanwhile)  # (threads left running
    # by earlier tests: forked anyway)
    assert found == attempts(h) and calls == [1]
    assert runs is not None and runs == replays(h, SPEC, raised, found)  # the same summaries and self-check
    assert runs.base != runs.pr and runs.self_check.ok
    assert what_if(h, SPEC, raised, found=found, runs=runs) == what_if(h, SPEC, raised)
    assert replays_on_two_cores(h, SPEC, SPEC, fork=True, meanwhile=meanwhile)[1] is None  # one replay is all
    assert replays_on_two_cores(h, SPEC, raised, fork=False, meanwhile=meanwhile)[1] is None  # no child: one
    # process does it all
    assert calls == [1, 1, 1]  # once on every path


def test_a_run_summary_is_what_the_comparison_reads_of_the_run() -> None:
    # Two machines, one of them below the minimum.
    h = history_of([(LATER, [rated("a", "m-a", [80.0] * 10), rated("b", "m-b", [30.0] * 10)])])
    found = attempts(h)
    run = recorded_run(h, found)
    summary = summarize(run, h, SPEC, with_min(50))
    assert set(summary.fates) == {(j.attempt.instance_id, j.attempt.serving) for j in run.fates()}
    for j in run.fates():
        f = summary.fates[(j.attempt.instance_id, j.attempt.serving)]
        assert (f.word, f.judged) == (fate(j), j.verdict is not None)
        assert f.reason == (j.verdict.root_cause() if j.verdict is not None else j.why)
    assert summary.passes == run.passes and summary.trips == tuple(run.trips)
    assert sum(summary.by_pool.values()) == len(list(run.fates()))
    assert set(summary.totals) == {p.name for p in SPEC.pools}
    # A child's summary crosses the process boundary whole.
    assert pickle.loads(pickle.dumps(summary)) == summary  # noqa: S301 - our own bytes
