"""The fleet decides the unknowns (issue 29 item 4): correlation across machines, images and the params mirror, or
one retest of the same machine, each verdict saying which correlation decided it. Pure: `judging.decide` over
reports and records, with computed times."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from reconciler.domain.correlation import (
    RULE_IMAGE,
    RULE_MACHINE_TWICE,
    RULE_MACHINE_TWO_IMAGES,
    RULE_MIRROR,
    RULE_NONE,
    RULE_RETEST,
    correlate,
)
from reconciler.domain.judging import PassDecision, decide
from reconciler.domain.observations import InstanceReport
from reconciler.domain.records import MachineRecord, RecordSet
from reconciler.domain.retests import retests_pending
from reconciler.domain.spec import RetestSettings
from reconciler.domain.verdict import HELD_BY_CIRCUIT_BREAKER, HELD_FOR_RETEST, Verdict
from tests.scenarios import (
    DIGEST,
    OTHER_DIGEST,
    SPEC,
    T0,
    completed_report,
    error_report,
    params_failed_report,
)

#: Not a line any signature knows: the benchmark fails `unknown`.
ODD = ["cuzk-bench: the frobnicator declined the request"]
ODDER = ["cuzk-bench: the widget was not in the expected state"]
#: aria2c's own generic words only: a params failure `unknown`, its mirror named by the URL.
GENERIC_FETCH = ["02/12 18:14:00 [ERROR] CUID#7 - Download aborted. URI=https://params.example.com/v28.params",
                 "fleet: ERROR: aria2c failed to download https://params.example.com/v28.params (exit code 1)"]


def _at(hours: float) -> object:
    return T0 + timedelta(hours=hours)


def _pass(reports: list[InstanceReport], records: RecordSet, hours: float, spec: object = SPEC) -> PassDecision:
    judged = {e.instance_id for rec in records.machines.values() for e in rec.benchmarks}
    return decide(spec, reports, records, judged, None, _at(hours))  # type: ignore[arg-type]


def _merged(records: RecordSet, decision: PassDecision) -> RecordSet:
    return RecordSet(machines={**records.machines, **decision.machine_records}, images={
        **records.images, **decision.image_records})


def _only(decision: PassDecision, instance_id: str) -> Verdict:
    return next(v for v in decision.verdicts if v.instance_id == instance_id)


def _shifted(report: InstanceReport, hours: float) -> InstanceReport:
    """The same report `hours` later (registration, events, result): another attempt at another time."""
    d = timedelta(hours=hours)
    events = tuple(replace(e, at=e.at + d) for e in report.events)
    result = None if report.result is None else replace(report.result, at=report.result.at + d,
                                                        started_at=report.result.started_at + d
                                                        if report.result.started_at else None)
    return replace(report, registered_at=report.registered_at + d, events=events, result=result)


def test_an_unknown_failure_with_nothing_to_correlate_is_held_for_one_retest() -> None:
    decision = _pass([error_report("rtx-pro-4000-0-a", "70001", ODD)], RecordSet(), 3)
    v = _only(decision, "rtx-pro-4000-0-a")
    assert (v.blame, v.marks_bad, v.held_by) == ("unknown", False, HELD_FOR_RETEST)
    correlation = v.evidence["correlation"]
    assert correlation["rule"] == RULE_RETEST and correlation["pending"] is True
    assert "benchmarked once more" in correlation["detail"]
    assert "retest pending" in v.root_cause()
    records = _merged(RecordSet(), decision)
    pending = retests_pending(records, SPEC, _at(4))
    assert set(pending) == {"70001"} and pending["70001"].instance_id == "rtx-pro-4000-0-a"
    # Stale: once the retest window passed, nothing is pending any more (the unknown stays unknown).
    assert retests_pending(records, SPEC, _at(3 + SPEC.retest.window_hours + 1)) == {}


def test_a_retest_that_passes_says_so_and_the_machine_stays() -> None:
    first = _pass([error_report("rtx-pro-4000-0-a", "70001", ODD)], RecordSet(), 3)
    records = _merged(RecordSet(), first)
    retest = _shifted(completed_report("rtx-pro-4000-0-b", "70001", 35.0), 2)
    second = _pass([retest], records, 5)
    v = _only(second, "rtx-pro-4000-0-b")
    assert (v.verdict, v.blame, v.marks_bad) == ("ok", "none", False)
    assert v.evidence["retest"]["of"] == "rtx-pro-4000-0-a"
    assert v.evidence["retest"]["outcome"].startswith("passed")
    assert "[retest of rtx-pro-4000-0-a: passed" in v.reason
    assert retests_pending(_merged(records, second), SPEC, _at(6)) == {}


def test_the_same_failure_twice_while_others_pass_the_image_is_the_machine() -> None:
    first = _pass([error_report("rtx-pro-4000-0-a", "70001", ODD),
                   completed_report("rtx-pro-4000-1-g", "70009", 35.0)], RecordSet(), 3)
    records = _merged(RecordSet(), first)
    again = _pass([_shifted(error_report("rtx-pro-4000-0-b", "70001", ODD), 2)], records, 5)
    v = _only(again, "rtx-pro-4000-0-b")
    assert (v.blame, v.marks_bad, v.held_by) == ("machine", True, None)
    assert v.evidence["correlation"]["rule"] == RULE_MACHINE_TWICE
    assert "machine(s) 70009 passed image" in v.reason and "decided by the fleet" in v.reason
    assert v.evidence["retest"]["outcome"] == "failed again the same way"
    assert again.machine_records["70001"].status == "bad"


def test_failing_again_when_no_machine_passes_the_image_stays_unknown_and_is_not_retested_twice() -> None:
    first = _pass([error_report("rtx-pro-4000-0-a", "70001", ODD)], RecordSet(), 3)
    records = _merged(RecordSet(), first)
    again = _pass([_shifted(error_report("rtx-pro-4000-0-b", "70001", ODD), 2)], records, 5)
    v = _only(again, "rtx-pro-4000-0-b")
    assert (v.blame, v.marks_bad, v.held_by) == ("unknown", False, None)
    assert v.evidence["correlation"]["rule"] == RULE_NONE
    assert "no second retest" in v.evidence["correlation"]["detail"]


def test_the_same_failure_under_two_images_is_the_machine() -> None:
    first = _pass([error_report("rtx-pro-4000-0-a", "70001", ODD, digest=OTHER_DIGEST)], RecordSet(), 3)
    records = _merged(RecordSet(), first)
    again = _pass([_shifted(error_report("rtx-pro-4000-0-b", "70001", ODD), 2)], records, 5)
    v = _only(again, "rtx-pro-4000-0-b")
    assert (v.blame, v.marks_bad) == ("machine", True)
    correlation = v.evidence["correlation"]
    assert correlation["rule"] == RULE_MACHINE_TWO_IMAGES and correlation["images"] == [DIGEST, OTHER_DIGEST]
    # Stale: the first failure outside the window decides nothing.
    late = _pass([_shifted(error_report("rtx-pro-4000-0-c", "70001", ODD), SPEC.circuit_breaker.window_hours + 30)],
                 records, 3 + SPEC.circuit_breaker.window_hours + 31)
    assert _only(late, "rtx-pro-4000-0-c").blame == "unknown"


def test_the_same_mirror_failing_on_k_machines_is_the_mirror_never_a_strike() -> None:
    reports = [params_failed_report(f"rtx-pro-4000-{n}-p", machine, GENERIC_FETCH)
               for n, machine in enumerate(("70001", "70002"))]
    decision = _pass(reports, RecordSet(), 3)
    first, second = (_only(decision, r.instance_id) for r in reports)
    assert first.evidence["params_source"] == "https://params.example.com"
    assert (first.blame, first.held_by) == ("unknown", HELD_FOR_RETEST)
    assert (second.blame, second.marks_bad) == ("params", False)
    assert second.evidence["correlation"]["rule"] == RULE_MIRROR
    assert second.evidence["correlation"]["machines"] == ["70001", "70002"]
    assert second.setting is not None and "params.base_url" in second.setting
    assert "no machine got past its params phase since" in second.reason
    assert not decision.image_records  # the mirror, not the image


def test_the_mirror_is_not_blamed_when_other_machines_fetched_from_it_since() -> None:
    first = _pass([params_failed_report("rtx-pro-4000-0-p", "70001", GENERIC_FETCH)], RecordSet(), 3)
    records = _merged(RecordSet(), first)
    fetched = _shifted(completed_report("rtx-pro-4000-1-g", "70009", 35.0), 1)
    later = _pass([fetched, _shifted(params_failed_report("rtx-pro-4000-2-p", "70002", GENERIC_FETCH), 2)],
                  records, 5)
    v = _only(later, "rtx-pro-4000-2-p")
    assert v.blame == "unknown" and v.evidence["correlation"]["rule"] == RULE_RETEST


def test_a_params_failure_without_a_known_source_is_never_blamed_on_a_mirror() -> None:
    nothing = ["fleet: ERROR: something odd happened while fetching"]
    decision = _pass([params_failed_report(f"rtx-pro-4000-{n}-p", m, nothing)
                      for n, m in enumerate(("70001", "70002"))], RecordSet(), 3)
    assert all(v.evidence.get("params_source") is None for v in decision.verdicts)
    assert all(v.evidence["correlation"]["rule"] != RULE_MIRROR for v in decision.verdicts)


def test_the_same_unknown_on_k_machines_with_one_image_is_the_breakers_image_correlation() -> None:
    decision = _pass([error_report("rtx-pro-4000-0-a", "70001", ODD),
                      error_report("rtx-pro-4000-1-a", "70002", ODD)], RecordSet(), 3)
    second = _only(decision, "rtx-pro-4000-1-a")
    assert (second.blame, second.held_by) == ("image", HELD_BY_CIRCUIT_BREAKER)
    assert second.evidence["correlation"]["rule"] == RULE_IMAGE
    assert "70001" in second.evidence["correlation"]["detail"]


def test_the_retest_budget_per_pool_holds_further_unknowns_as_they_are() -> None:
    spec = replace(SPEC, retest=RetestSettings(enabled=True, max_per_pool=1, window_hours=24))
    decision = _pass([error_report("rtx-pro-4000-0-a", "70001", ODD),
                      error_report("rtx-pro-4000-1-a", "70002", ODDER)], RecordSet(), 3, spec)
    first, second = _only(decision, "rtx-pro-4000-0-a"), _only(decision, "rtx-pro-4000-1-a")
    assert first.held_by == HELD_FOR_RETEST
    assert (second.held_by, second.blame) == (None, "unknown")
    assert "retest budget of pool rtx-pro-4000 used (1/1" in second.evidence["correlation"]["detail"]
    assert any("retest budget" in n for n in decision.notes)
    off = replace(SPEC, retest=RetestSettings(enabled=False))
    assert _only(_pass([error_report("rtx-pro-4000-0-a", "70001", ODD)], RecordSet(), 3, off),
                 "rtx-pro-4000-0-a").held_by is None


def test_decided_verdicts_without_a_machine_id_or_specific_blame_are_left_alone() -> None:
    known = error_report("rtx-pro-4000-0-a", "70001", ["sppark::Error #-700"])
    no_machine = error_report("rtx-pro-4000-1-a", None, ODD)  # type: ignore[arg-type]
    decision = _pass([known, no_machine], RecordSet(), 3)
    assert "correlation" not in _only(decision, "rtx-pro-4000-0-a").evidence
    assert "correlation" not in _only(decision, "rtx-pro-4000-1-a").evidence
    # correlate itself is pure: the same input, the same answer.
    verdicts = decision.verdicts
    assert correlate(SPEC, RecordSet(), verdicts, _at(3)).verdicts == correlate(SPEC, RecordSet(), verdicts,
                                                                              _at(3)).verdicts
    assert MachineRecord("x").benchmarks == ()


def test_a_flickering_machine_that_fails_the_same_way_again_after_passing_is_the_machine() -> None:
    # Fails (held for a retest), passes its retest, then fails the same way again while others pass the image:
    # an intermittent fault of that machine.
    first = _pass([error_report("rtx-pro-4000-0-a", "70001", ODD)], RecordSet(), 3)
    records = _merged(RecordSet(), first)
    passed = _pass([_shifted(completed_report("rtx-pro-4000-0-b", "70001", 35.0), 1),
                    _shifted(completed_report("rtx-pro-4000-1-g", "70009", 35.0), 1)], records, 4)
    records = _merged(records, passed)
    again = _pass([_shifted(error_report("rtx-pro-4000-0-c", "70001", ODD), 2)], records, 5)
    v = _only(again, "rtx-pro-4000-0-c")
    assert (v.blame, v.marks_bad) == ("machine", True)
    assert v.evidence["correlation"]["rule"] == RULE_MACHINE_TWICE and "retest" not in v.evidence
