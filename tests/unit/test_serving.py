"""After admission, pure: rolling rate, degraded/lost, early verdict, directives, expiry and probation.

Every time is a computed `datetime` (no clock, no sleeps): heartbeats are events at chosen minutes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from reconciler.adapters.record_files import parse_machine_record, render_machine_record
from reconciler.domain.judging import SERVING_TRAILER, decide
from reconciler.domain.observations import InstanceReport, PhaseEvent
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordSet
from reconciler.domain.serving import (
    directives,
    early_check,
    heartbeats,
    judge_early,
    judge_serving,
    rolling_rate,
    serving_health,
)
from reconciler.domain.spec import EarlyVerdictSettings, ServingSettings
from tests.scenarios import SPEC, T0, bench_events, completed_report, ev, make_report

POOL = SPEC.pool("rtx-pro-4000")  # min 29/h, 10 proofs, -j 2, max $0.60/h
SERVING = ServingSettings(heartbeat_minutes=5, window_minutes=60, degraded_after_minutes=30, degraded_margin=0.1,
                          min_proofs=5, lost_after_minutes=20)


def beat(minutes: float, completed: int, *, busy: bool = True, seq: int = 0, **extra: Any) -> PhaseEvent:
    return ev("serve", "progress", minutes, details={"heartbeat": {
        "seq": seq, "interval_s": 300.0, "completed": completed, "failed": 0, "busy": busy, **extra}})


def serving_report(instance_id: str, per_beat: list[int], *, start: float = 70.0, busy: bool = True,
                   extra_events: tuple[PhaseEvent, ...] = (), **kw: Any) -> InstanceReport:
    base = completed_report(instance_id, kw.pop("machine_id", "40213"), 35.0, **kw)
    beats = [beat(start + 5 * i, n, busy=busy, seq=i + 1) for i, n in enumerate(per_beat)]
    events = (*base.events, ev("serve", "started", start - 1), *beats, *extra_events)
    return InstanceReport(**{**base.__dict__, "events": events})


def at(minutes: float) -> Any:
    return T0 + timedelta(minutes=minutes)


# --- rolling rate and degraded --------------------------------------------------------------------------


def test_rolling_rate_counts_busy_intervals_only() -> None:
    report = serving_report("i-1", [3, 3, 3, 3], busy=True)
    beats = heartbeats(report)
    rate = rolling_rate(beats, beats[-1].at, timedelta(minutes=60), 29, 5)
    # The first heartbeat has no busy interval before it: 3 intervals of 300 s, 9 proofs -> 36/h.
    assert (rate.completed, rate.busy_s, rate.judged) == (9, 900.0, True)
    assert rate.proofs_per_hour == 36.0
    idle = heartbeats(serving_report("i-2", [0, 0, 0, 0], busy=False))
    assert rolling_rate(idle, idle[-1].at, timedelta(minutes=60), 29, 5).busy_s == 0.0


def test_one_slow_interval_is_not_judged_min_sample_count() -> None:
    beats = heartbeats(serving_report("i-1", [3, 0]))
    rate = rolling_rate(beats, beats[-1].at, timedelta(minutes=60), 29, 5)
    # 300 s busy: a machine at 29/h does 2.4 proofs there, fewer than min_proofs=5: no judgement.
    assert rate.proofs_per_hour == 0.0 and not rate.judged


def test_degraded_only_after_staying_below_for_the_whole_period() -> None:
    # 2 proofs / 5 min = 24/h < 29 x 0.9 = 26.1/h. Judged once 3 intervals are busy (15 min > 10.3 min).
    slow = [2] * 9  # heartbeats at 70..110 min
    report = serving_report("i-1", slow)
    health = serving_health(report, POOL, SERVING)
    assert health.below_since == at(85)  # the 4th heartbeat: first judged window
    # 25 min below at the last heartbeat (110): not yet degraded.
    assert judge_serving(report, POOL, SERVING, at(111), fleet_last_signal=at(111)) is None
    report = serving_report("i-1", [*slow, 2, 2])  # heartbeats up to 120: 35 min below
    verdict = judge_serving(report, POOL, SERVING, at(121), fleet_last_signal=at(121))
    assert verdict is not None and verdict.verdict == "degraded" and verdict.blame == "machine" and verdict.marks_bad
    assert verdict.reason.startswith("degraded: serving: 24.0/h < 26.1/h (min 29/h - 10%) for 35 min")
    assert verdict.evidence["stage"] == "serving" and verdict.evidence["window"]["completed"] == 20


def test_a_recovery_resets_the_hysteresis() -> None:
    before = serving_report("i-1", [2, 2, 2, 2, 2, 2])
    assert serving_health(before, POOL, SERVING).below_since == at(85)
    report = serving_report("i-1", [2, 2, 2, 2, 2, 2, 4, 4, 2, 2, 2, 2])
    # The two fast intervals lift the 60-min rate to 28.4/h, above 26.1/h: the run below is over.
    health = serving_health(report, POOL, SERVING)
    assert health.below_since is None and health.proofs_per_hour is not None and health.proofs_per_hour > 28
    assert judge_serving(report, POOL, SERVING, at(126), fleet_last_signal=at(126)) is None


def test_a_rate_just_under_the_minimum_is_within_the_margin() -> None:
    report = serving_report("i-1", [2, 3] * 8)  # 30/h... alternating around 28-30/h
    assert judge_serving(report, POOL, SERVING, at(160), fleet_last_signal=at(160)) is None


# --- lost -----------------------------------------------------------------------------------------------


def test_lost_when_heartbeats_stop_and_the_controller_hears_others() -> None:
    report = serving_report("i-1", [3, 3, 3])  # last heartbeat at 80 min
    assert judge_serving(report, POOL, SERVING, at(99), fleet_last_signal=at(99)) is None  # 19 min silent
    verdict = judge_serving(report, POOL, SERVING, at(101), fleet_last_signal=at(101))
    assert verdict is not None and verdict.verdict == "lost"
    assert (verdict.blame, verdict.marks_bad, verdict.signature) == ("marketplace", True, "heartbeats-stopped")
    assert "no heartbeat for 21 min (> 20 min)" in verdict.reason


def test_silence_everywhere_is_never_a_verdict() -> None:
    report = serving_report("i-1", [3, 3, 3])
    # Nobody reported after this instance's last heartbeat + the deadline: maybe our own outage.
    assert judge_serving(report, POOL, SERVING, at(300), fleet_last_signal=at(85)) is None
    assert judge_serving(report, POOL, SERVING, at(300), fleet_last_signal=None) is None


def test_lost_with_a_machine_signature_in_the_last_words_blames_the_machine() -> None:
    tail = ("cuzk-daemon: NVRM: Xid (PCI:0000:01:00): 79, pid=1234, GPU has fallen off the bus.",)
    failed = ev("serve", "failed", 90, exit_code=137, message="cuzk-daemon exited (code 137) while serving",
                log_tail=tail)
    report = serving_report("i-1", [3, 3, 3], extra_events=(failed,))
    verdict = judge_serving(report, POOL, SERVING, at(91), fleet_last_signal=None)
    assert verdict is not None and verdict.verdict == "lost" and verdict.blame == "machine", verdict
    assert "fallen off the bus" in verdict.reason


def test_an_unexplained_serve_failure_is_keyed_by_its_normalised_message() -> None:
    # Issue 23 item 1: the same unexplained failure on distinct machines gets one signature (the breaker counts
    # it); another message, another signature.
    def lost(instance_id: str, machine_id: str, message: str) -> str | None:
        failed = ev("serve", "failed", 90, exit_code=70, message=message, log_tail=(f"fleet: {message}",))
        report = serving_report(instance_id, [3, 3, 3], extra_events=(failed,), machine_id=machine_id)
        verdict = judge_serving(report, POOL, SERVING, at(91), fleet_last_signal=None)
        assert verdict is not None and (verdict.verdict, verdict.blame) == ("lost", "unknown"), verdict
        return verdict.signature

    first = lost("i-1", "111", "serve.sh: proving loop stopped after 12 proofs at 2026-12-02T19:10:00Z")
    assert first is not None and first.startswith("lost-unrecognized-serve-exit-70-")
    assert first == lost("i-2", "222", "serve.sh: proving loop stopped after 3 proofs at 2026-12-02T20:44:10Z")
    assert first != lost("i-3", "333", "serve.sh: the forward to 127.0.0.1:1234 went away")


def test_a_clean_stop_or_a_destroyed_instance_is_not_lost() -> None:
    done = ev("serve", "done", 85, message="stopped by SIGTERM")
    assert judge_serving(serving_report("i-1", [3, 3], extra_events=(done,)), POOL, SERVING, at(200),
                         fleet_last_signal=at(200)) is None
    gone = serving_report("i-2", [3, 3], destroyed_min=90)
    assert judge_serving(gone, POOL, SERVING, at(200), fleet_last_signal=at(200)) is None


# --- early verdict --------------------------------------------------------------------------------------


def proof(i: int, seconds: float, minutes: float, label: str = "COMPLETED") -> PhaseEvent:
    return ev("benchmark", "progress", minutes, details={"proof": {"index": i, "label": label, "seconds": seconds}})


def running_bench(proofs: list[float], *, pool: str = "rtx-pro-4000",
                  warmup_phase_s: float | None = None) -> InstanceReport:
    started = ev("benchmark", "started", 25, details={"requested": 10, "concurrency": 2})
    warm = [] if warmup_phase_s is None else [ev("warmup", "done", 24.5, details={
        "preload_seconds": 51.2, "seconds": warmup_phase_s, "label": "COMPLETED"})]
    events = [*bench_events()[:-1], *warm, started]
    t = 25.0
    for i, s in enumerate(proofs, start=1):
        t += s / 60
        events.append(proof(i, s, t))
    return make_report("i-early", "62001", events=events, pool=pool)


def test_early_verdict_after_warmup_when_even_the_best_case_misses() -> None:
    # -j 2; 400 s per proof -> best case ~18/h < 29/h. The batch's warm-up proof (900 s) is slower: not the bound.
    report = running_bench([900.0, 400.0, 410.0, 405.0])
    check = early_check(report, POOL, EarlyVerdictSettings())
    assert check is not None and check.remaining == 6 and (check.best_seconds, check.bounded_by) == (
        400.0, "measured proof 2")
    assert round(check.best_case_proofs_per_hour, 2) == round(9 * 3600 / ((400 + 410 + 405) / 2 + 6 * 400 / 2), 2)
    verdict = judge_early(report, POOL, EarlyVerdictSettings(), at(60))
    assert verdict is not None and verdict.verdict == "early-below-min-rate" and verdict.marks_bad
    saved = verdict.evidence["saved"]
    assert saved["minutes"] == round(6 * 405 / 2 / 60, 1) and saved["usd_at_most"] == round(
        6 * 405 / 2 / 3600 * 0.6, 2)
    # The reason names how many proofs were measured and which speed bounded the best case.
    assert "after 3 measured proofs of 10" in verdict.reason
    assert "even at the fastest proof it showed (400.0 s/proof, measured proof 2; -j 2)" in verdict.reason
    assert f"saved ~{saved['minutes']} min" in verdict.reason
    assert verdict.evidence["early"]["bounded_by"] == "measured proof 2"


def test_no_early_verdict_on_fewer_measured_proofs_than_the_minimum() -> None:
    settings = EarlyVerdictSettings()
    assert settings.min_measured_proofs == 3  # one slow sample never ends a benchmark (issue 29 item 5)
    assert judge_early(running_bench([900.0]), POOL, settings, at(60)) is None  # warm-up only
    assert judge_early(running_bench([900.0, 400.0, 410.0]), POOL, settings, at(60)) is None  # 2 measured
    # One fast proof (100 s at -j 2 = 72/h) is enough for the best case, even among slow ones.
    assert judge_early(running_bench([900.0, 400.0, 100.0, 400.0]), POOL, settings, at(60)) is None
    assert judge_early(running_bench([900.0, 400.0, 410.0, 405.0]), POOL, EarlyVerdictSettings(enabled=False),
                       at(60)) is None


def test_the_issue_29_scenario_runs_on_and_passes() -> None:
    """-j 2, min 40/h: the warm-up proof took 150 s (48/h at -j 2), the first measured proof 250 s (28.8/h). Judged
    on that one sample it was `best case 28.8/h < 40/h`; let run, the benchmark finishes at 45/h and passes. At every
    step of the run - with the old minimum of one measured proof too - no early verdict: the best case counts the
    fastest proof the machine has already shown."""
    pool = SPEC.pool("rtx4090")
    proofs = [150.0, 250.0, *[150.0] * 8]
    for settings in (EarlyVerdictSettings(), EarlyVerdictSettings(min_measured_proofs=1)):
        for done in range(1, len(proofs)):
            running = running_bench(proofs[:done], pool="rtx4090")
            decision = decide(SPEC, [running], RecordSet(), set(), None, at(25 + sum(proofs[:done]) / 60))
            assert decision.recorded == () and decision.pending == ("i-early",), (settings, done, decision.summary())
            assert judge_early(running, pool, settings, at(60)) is None, (settings, done)
    # What cuzk-bench prints at the end: 10 proofs in 800 s at -j 2 (total / completed = 80 s/proof).
    finished = completed_report("i-early", "62001", 45.0, pool="rtx4090", gpu_name="RTX 4090")
    (verdict,) = decide(SPEC, [finished], RecordSet(), set(), None, at(60)).recorded
    assert (verdict.verdict, verdict.marks_bad) == ("ok", False) and "45.0/h >= 40/h" in verdict.reason


def test_the_worker_warm_up_phase_proof_counts_towards_the_best_case() -> None:
    pool = SPEC.pool("rtx4090")  # min 40/h, -j 2
    settings = EarlyVerdictSettings(warmup_proofs=0)  # the worker warmed up in its own phase
    slow = running_bench([250.0, 250.0, 250.0], pool="rtx4090")
    shown = running_bench([250.0, 250.0, 250.0], pool="rtx4090", warmup_phase_s=140.0)
    verdict = judge_early(slow, pool, settings, at(60))
    assert verdict is not None and "(250.0 s/proof, measured proof 1; -j 2)" in verdict.reason
    # It proved at 140 s already: the best case (7 more at 140 s) reaches 41.6/h >= 40/h, so it runs on.
    check = early_check(shown, pool, settings)
    assert check is not None and (check.best_seconds, check.bounded_by) == (140.0, "the warm-up proof")
    assert round(check.best_case_proofs_per_hour, 1) == 41.6
    assert judge_early(shown, pool, settings, at(60)) is None


def test_a_hopeless_machine_is_still_ended_early_with_what_it_saved() -> None:
    pool = SPEC.pool("rtx4090")  # min 40/h: even its fastest shown proof (400 s at -j 2 = 18/h) cannot reach it
    report = running_bench([400.0, 420.0, 430.0, 410.0], pool="rtx4090")
    verdict = judge_early(report, pool, EarlyVerdictSettings(), at(60))
    assert verdict is not None and verdict.marks_bad and verdict.blame == "machine"
    assert "after 3 measured proofs of 10" in verdict.reason
    assert "(400.0 s/proof, warm-up proof 1 of the batch; -j 2)" in verdict.reason
    saved = verdict.evidence["saved"]
    assert saved["minutes"] == round(6 * 420 / 2 / 60, 1) and saved["usd_at_most"] > 0


def test_decide_gives_the_early_verdict_and_the_commit_says_what_it_saved() -> None:
    decision = decide(SPEC, [running_bench([900.0, 400.0, 410.0, 405.0])], RecordSet(), set(), None, at(60))
    (verdict,) = decision.recorded
    assert verdict.verdict == "early-below-min-rate"
    assert "early verdict saved ~20 min, <= $0.20" in decision.summary()
    entry = decision.machine_records["62001"].benchmarks[-1]
    assert entry.stage == "admission" and entry.expires_at == "2027-01-01T19:00:00Z"  # machine: 720 h


# --- decide: serving verdicts, once, with their own trailer ---------------------------------------------


def test_decide_judges_a_serving_instance_once() -> None:
    report = serving_report("i-1", [2] * 12)
    admitted = decide(SPEC, [report], RecordSet(), set(), None, at(65))
    records = RecordSet(machines=admitted.machine_records)
    assert admitted.recorded[0].verdict == "ok"
    later = decide(SPEC, [report], records, {"i-1"}, None, at(126))
    (verdict,) = later.recorded
    assert verdict.verdict == "degraded"
    assert (SERVING_TRAILER, "i-1") in later.trailers() and ("Fleet-Instance", "i-1") not in later.trailers()
    record = later.machine_records["40213"]
    assert record.status == "bad" and record.benchmarks[-1].stage == "serving"
    again = decide(SPEC, [report], RecordSet(machines=later.machine_records), {"i-1"}, None, at(130))
    assert again.recorded == ()
    # The trailer alone (a human deleted the record: pardon) also keeps it from being judged again.
    assert decide(SPEC, [report], records, {"i-1"}, None, at(130), judged_serving_ids={"i-1"}).recorded == ()


def test_kill_budget_holds_serving_verdicts_too() -> None:
    spec = SPEC
    records = RecordSet(machines={"m-old": MachineRecord("m-old", "bad", benchmarks=(BenchmarkEntry(
        "i-old", "2026-12-02T18:30:00Z", "below-min-rate", "machine", True, "slow", pool="rtx-pro-4000"),)),
        "40213": MachineRecord("40213", "ok", benchmarks=(BenchmarkEntry(
            "i-1", "2026-12-02T19:05:00Z", "ok", "none", False, "ok", pool="rtx-pro-4000"),))})
    report = serving_report("i-1", [2] * 12)
    decision = decide(spec, [report], records, {"i-1"}, None, at(126))
    (verdict,) = decision.recorded
    assert verdict.verdict == "degraded" and verdict.held_by == "kill-budget" and not verdict.marks_bad
    # Held: recorded, but the machine keeps serving (stopping it would leave the slot idle, unreplaced).
    after = RecordSet(machines={**records.machines, **decision.machine_records})
    assert directives([report], after, SERVING, at(126))["i-1"].action == "serve"


# --- directives -----------------------------------------------------------------------------------------


def test_directives_follow_the_records() -> None:
    waiting = make_report("i-wait", "m-1", events=bench_events())
    ok = completed_report("i-ok", "m-2", 35.0)
    slow = completed_report("i-slow", "m-3", 20.0)
    decision = decide(SPEC, [ok, slow], RecordSet(), set(), None, at(65))
    got = directives([waiting, ok, slow], RecordSet(machines=decision.machine_records), SERVING, at(65))
    assert got["i-wait"].action == "wait"
    assert (got["i-ok"].action, got["i-ok"].verdict, got["i-ok"].heartbeat_s) == ("serve", "ok", 300.0)
    assert got["i-slow"].action == "stop" and got["i-slow"].reason.startswith("below-min-rate")


# --- expiry and probation -------------------------------------------------------------------------------


def test_record_expires_into_probation_and_a_second_failure_is_permanent(tmp_path: Any) -> None:
    first = completed_report("i-a", "m-9", 20.0)  # below-min-rate, machine: expires in 720 h by default
    d1 = decide(SPEC, [first], RecordSet(), set(), None, at(65))
    rec = d1.machine_records["m-9"]
    entry = rec.benchmarks[-1]
    assert entry.expires_at == "2027-01-01T19:05:00Z" and entry.probation_until == "2027-01-31T19:05:00Z"
    assert rec.standing(at(66)).state == "bad" and RecordSet(machines={"m-9": rec}).bad_machine_ids(at(66)) == {"m-9"}
    after = at(65) + timedelta(hours=721)
    assert rec.standing(after).state == "probation"
    assert RecordSet(machines={"m-9": rec}).bad_machine_ids(after) == frozenset()
    assert RecordSet(machines={"m-9": rec}).bad_machine_ids() == {"m-9"}  # without a time nothing expires
    again = completed_report("i-b", "m-9", 21.0, registered_min=65 + 721 * 60)
    d2 = decide(SPEC, [again], RecordSet(machines={"m-9": rec}), {"i-a"}, None, after + timedelta(hours=2))
    final = d2.machine_records["m-9"]
    last = final.benchmarks[-1]
    assert last.probation is True and last.expires_at is None and last.reason.endswith("[on probation: permanent]")
    assert final.standing(after + timedelta(days=3650)).state == "permanent"
    assert any("failed again on probation" in n for n in d2.notes)
    # Written and read back through the record schema.
    text = render_machine_record(final)
    path = tmp_path / "m-9.yaml"
    assert parse_machine_record(text, path) == final


def test_old_records_without_expiry_stay_bad_and_banned_never_expires() -> None:
    old = MachineRecord("m-1", "bad", benchmarks=(BenchmarkEntry(
        "i-1", "2025-01-01T00:00:00Z", "below-min-rate", "machine", True, "slow"),))
    assert old.standing(at(10**6)).state == "bad" and old.is_bad_at(at(10**6))
    banned = MachineRecord("m-2", "banned")
    assert banned.standing(at(0)).state == "banned" and banned.is_bad_at(at(0))
    pardoned = MachineRecord("m-3", "pardoned", benchmarks=old.benchmarks)
    assert not pardoned.is_bad_at(None)


def test_network_faults_expire_sooner_than_machine_faults() -> None:
    assert SPEC.record_expiry.hours_for("network", None) == 24.0
    assert SPEC.record_expiry.hours_for("machine", None) == 720.0
    assert SPEC.record_expiry.hours_for("image", None) is None


def test_proof_lines_in_the_shipped_log_count_as_samples() -> None:
    started = ev("benchmark", "started", 25, details={"requested": 10, "concurrency": 1})
    tail = ("2026-12-02T18:40:00Z cuzk-bench CPU STAND-IN (gpu-fleet worker-image/standin): simulated timings",
            "2026-12-02T18:40:01Z   [1/10] ok — 300.0s (prove=270000 ms, queue=0 ms)",
            "2026-12-02T18:45:01Z   [2/10] COMPLETED — 200.4s (prove=180000 ms, queue=0 ms)",
            "2026-12-02T18:48:21Z   [3/10] FAILED — 12.0s (prove=0 ms, queue=0 ms)")
    report = make_report("i-log", "62001", events=[*bench_events()[:-1], started], log_tail=tail)
    one = EarlyVerdictSettings(min_measured_proofs=1)
    check = early_check(report, POOL, one)
    assert check is not None and check.measured == (200.4,) and check.remaining == 7
    verdict = judge_early(report, POOL, one, at(50))
    assert verdict is not None and verdict.verdict == "early-below-min-rate"  # best case 16.4/h < 29/h


def test_a_long_history_is_judged_on_its_recent_heartbeats_only() -> None:
    # 1,000 heartbeats (the store's progress ring): fast for ~80 h, then slow for the last two hours.
    report = serving_report("i-1", [4] * 976 + [2] * 24)
    last = 70 + 5 * 999
    verdict = judge_serving(report, POOL, SERVING, at(last + 1), fleet_last_signal=at(last + 1))
    assert verdict is not None and verdict.verdict == "degraded"
    health = serving_health(report, POOL, SERVING)
    assert health.below_since is not None and at(last) - health.below_since <= timedelta(minutes=35)


# --- after a controller outage, bans (issue 23 item 7) ----------------------------------------------------


def _admitted(*reports: InstanceReport) -> tuple[RecordSet, set[str]]:
    admitted = decide(SPEC, list(reports), RecordSet(), set(), None, at(65))
    assert [v.verdict for v in admitted.recorded] == ["ok"] * len(reports)
    return RecordSet(machines=admitted.machine_records), {r.instance_id for r in reports}


def test_nobody_is_lost_while_the_fleet_comes_back_after_a_controller_outage() -> None:
    # Three workers beat at 70, 75, 80; the controller hears nothing from 80 to 125 (its outage: 45 min >
    # lost_after 20). The workers flush their queued heartbeats seconds apart: the store stamps them with the
    # time they arrived. At 125.1 only i-a is back; i-b comes back at 125.2, i-c never does.
    flushed = (beat(125, 3, seq=4), beat(125, 3, seq=5))
    a = serving_report("i-a", [3, 3, 3], machine_id="m-a", extra_events=flushed)
    b = serving_report("i-b", [3, 3, 3], machine_id="m-b")
    c = serving_report("i-c", [3, 3, 3], machine_id="m-c")
    records, judged = _admitted(a, b, c)
    first = decide(SPEC, [a, b, c], records, judged, None, at(125.1))
    assert first.recorded == (), [v.reason for v in first.recorded]
    b = serving_report("i-b", [3, 3, 3], machine_id="m-b", extra_events=(beat(125.2, 3, seq=4),))
    # i-c stays silent, but the fleet was heard again only 19 minutes ago: still no verdict.
    later = (beat(130, 3, seq=6), beat(135, 3, seq=7), beat(140, 3, seq=8))
    a = serving_report("i-a", [3, 3, 3], machine_id="m-a", extra_events=(*flushed, *later))
    assert decide(SPEC, [a, b, c], records, judged, None, at(144)).recorded == ()
    # Silent for lost_after_minutes after the controller heard the fleet again (125.1): lost.
    a = serving_report("i-a", [3, 3, 3], machine_id="m-a", extra_events=(*flushed, *later, beat(145, 3, seq=9),
                                                                          beat(146, 3, seq=10)))
    b = serving_report("i-b", [3, 3, 3], machine_id="m-b", extra_events=(beat(125.2, 3, seq=4),
                                                                          beat(146, 3, seq=5)))
    decision = decide(SPEC, [a, b, c], records, judged, None, at(146))
    (lost,) = decision.recorded
    assert (lost.instance_id, lost.verdict, lost.blame) == ("i-c", "lost", "marketplace")
    assert "no heartbeat for 66 min" in lost.reason and "heard the fleet again at" in lost.reason, lost.reason


def test_a_worker_silent_before_the_outage_is_judged_from_when_the_fleet_came_back() -> None:
    a = serving_report("i-a", [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3])  # 70..125, no outage for i-a
    c = serving_report("i-c", [3, 3, 3], machine_id="m-c")  # silent since 80
    records, judged = _admitted(a, c)
    # No fleet-wide silence: the usual rule (silent > 20 min while others were heard).
    (lost,) = decide(SPEC, [a, c], records, judged, None, at(101)).recorded
    assert lost.instance_id == "i-c" and "heard the fleet again" not in lost.reason


def test_the_bot_never_lifts_an_operators_ban() -> None:
    # Instance i-1 was rented before an operator banned machine 40213; it then passes its benchmark.
    report = completed_report("i-1", "40213", 35.0)
    banned = RecordSet(machines={"40213": MachineRecord("40213", "banned", note="host sells refurbished GPUs")})
    decision = decide(SPEC, [report], banned, set(), None, at(65))
    (verdict,) = decision.recorded
    assert verdict.verdict == "ok"
    record = decision.machine_records["40213"]
    assert record.status == "banned" and record.note == "host sells refurbished GPUs"
    assert record.benchmarks[-1].verdict == "ok"  # the history still has it
    after = RecordSet(machines=decision.machine_records)
    directive = directives([report], after, SERVING, at(65))["i-1"]
    assert directive.action == "stop" and "banned" in directive.reason, directive
    assert after.bad_machine_ids(at(65)) == {"40213"}
    # A failure does not turn the ban into an expiring "bad" either.
    slow = completed_report("i-2", "40213", 20.0, registered_min=70)
    failed = decide(SPEC, [slow], after, {"i-1"}, None, at(131)).machine_records["40213"]
    assert failed.status == "banned" and failed.standing(at(10**7)).state == "banned"


def test_a_pardon_stands_until_a_new_failure() -> None:
    old = BenchmarkEntry("i-0", "2026-12-01T00:00:00Z", "below-min-rate", "machine", True, "slow")
    pardoned = RecordSet(machines={"40213": MachineRecord("40213", "pardoned", benchmarks=(old,))})
    passed = decide(SPEC, [completed_report("i-1", "40213", 35.0)], pardoned, set(), None, at(65))
    record = passed.machine_records["40213"]
    assert record.status == "pardoned" and record.standing(at(65)).state == "pardoned"
    # The reconciler records it bad again only on a NEW failure (README: "When a benchmark fails", pardoning a machine).
    slow = completed_report("i-2", "40213", 20.0, registered_min=70)
    failed = decide(SPEC, [slow], RecordSet(machines=passed.machine_records), {"i-1"}, None, at(131))
    assert failed.machine_records["40213"].status == "bad"


def test_every_view_reads_probation_from_the_same_standing() -> None:
    from reconciler.domain.status import status_view
    from reconciler.render.text import render_text

    first = completed_report("i-a", "m-9", 20.0)  # below-min-rate: expires after 720 h, then 720 h of probation
    record = decide(SPEC, [first], RecordSet(), set(), None, at(65)).machine_records["m-9"]
    records = RecordSet(machines={"m-9": record})
    for now, state, excluded in ((at(66), "bad", True), (at(65) + timedelta(hours=721), "probation", False)):
        ((bad, standing),) = records.standings(now)
        assert (bad.machine_id, standing.state, standing.excluded) == ("m-9", state, excluded)
        assert standing == record.standing(now)  # what `fleet why` and the directives read
        assert (records.bad_machine_ids(now) == {"m-9"}) is excluded  # what the offer queries exclude
        view = status_view(SPEC, records, [], now)
        (pool,) = [p for p in view.pools if p.name == "rtx-pro-4000"]
        assert pool.bad == (1 if excluded else 0)
        assert [(b.machine_id, b.standing) for b in view.bad_machines] == [("m-9", state)]
        assert f"m-9  {state}: " in render_text(view)
    # Past its probation the record (still `status: bad` in its file) stands ok everywhere, as an ok one does.
    ended = at(65) + timedelta(hours=720 + 720 + 1)
    ((_, standing),) = records.standings(ended)
    assert (standing.state, standing.excluded) == ("ok", False) and records.bad_machine_ids(ended) == frozenset()
    assert MachineRecord("m-9", "ok", benchmarks=record.benchmarks).standing(ended).state == "ok"
    assert status_view(SPEC, records, [], ended).bad_machines == ()


def test_the_fleet_is_heard_again_after_its_newest_silence_and_only_its_recent_signals_are_read() -> None:
    from reconciler.domain.serving import fleet_heard_again

    flushed = (beat(125, 3, seq=4), beat(125.5, 3, seq=5), beat(130, 3, seq=6))
    a = serving_report("i-a", [3] * 3, machine_id="m-a", extra_events=flushed)  # 70..80, then back at 125
    b = serving_report("i-b", [3] * 3, machine_id="m-b")  # silent since 80
    twenty = timedelta(minutes=20)
    assert fleet_heard_again([a, b], twenty, since=at(80)) == at(125)
    assert fleet_heard_again([a, b], twenty, since=at(126)) is None  # no silence ended after 126
    assert fleet_heard_again([a, b], timedelta(minutes=60), since=at(80)) is None  # 45 min is no outage then
    # The same answer whatever older history precedes `since`: only the gap's start is read from it.
    long = serving_report("i-a", [3] * 200, start=-935.0, machine_id="m-a",
                          extra_events=(beat(125, 3, seq=201),))
    assert fleet_heard_again([long, b], twenty, since=at(80)) == at(125)


def test_a_machine_that_passes_again_on_probation_reads_probation_in_every_view() -> None:
    from reconciler.cli.plan import pool_rows
    from reconciler.cli.records import to_json
    from reconciler.domain.status import status_view

    first = completed_report("i-a", "m-9", 20.0)
    record = decide(SPEC, [first], RecordSet(), set(), None, at(65)).machine_records["m-9"]
    later = at(65) + timedelta(hours=721)
    again = completed_report("i-b", "m-9", 35.0, registered_min=65 + 721 * 60)
    passed = decide(SPEC, [again], RecordSet(machines={"m-9": record}), {"i-a"}, None, later).machine_records["m-9"]
    assert passed.status == "ok" and passed.standing(later).state == "probation"  # what `fleet why` reads
    records = RecordSet(machines={"m-9": passed})
    assert records.standings(later) == [] and records.bad_machine_ids(later) == frozenset()
    ((bad, standing),) = records.standings(later, passed_on_probation=True)
    assert (bad.machine_id, standing.state) == ("m-9", "probation")
    assert [(b.machine_id, b.standing) for b in status_view(SPEC, records, [], later).bad_machines] == [
        ("m-9", "probation")]
    doc = to_json(records, later)
    assert doc["bad_machines"] == [] and [m["machine_id"] for m in doc["probation"]] == ["m-9"]
    (row,) = [r for r in pool_rows(SPEC, records, None, None, None, later) if r["pool"] == "rtx-pro-4000"]
    assert (row["bad_machines_known"], row["probation_known"]) == (0, 1)
    # Past the probation it is simply ok, in every view.
    ended = at(65) + timedelta(hours=720 + 720 + 1)
    assert records.standings(ended, passed_on_probation=True) == []
