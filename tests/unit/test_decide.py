"""loop.decide (pure): which reports get judged, how records change, and the commit it asks for."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from reconciler.adapters.git import CommitRequest
from reconciler.adapters.record_files import parse_machine_record
from reconciler.domain.judging import PassDecision, decide
from reconciler.domain.observations import format_time
from reconciler.domain.records import MachineRecord, RecordSet
from reconciler.flows.judge import commit_request
from tests.scenarios import (
    CUDA_ERROR_TAIL,
    DAEMON_REFUSED_TAIL,
    DIGEST,
    LATER,
    OTHER_DIGEST,
    SPEC,
    bench_events,
    completed_report,
    error_report,
    make_report,
    params_failed_report,
    records_of,
    verdict_of,
)

NETWORK_TAIL = ["curl: (6) Could not resolve host: proofs.filecoin.io"]


def _request(decision: PassDecision) -> CommitRequest:
    request = commit_request(decision)
    assert request is not None
    return request


def test_commit_names_each_verdict_in_summary_body_and_trailers() -> None:
    reports = [completed_report("pro-0-a", "123", 20.0), completed_report("pro-1-a", "456", 35.0, host_id="9")]
    decision = decide(SPEC, reports, RecordSet(), set(), None, LATER)
    request = _request(decision)
    # The root cause of the most important verdict first (issue 14), then the counts.
    assert request.summary == ("fleet: machine 123 below-min-rate: benchmark exit 0, 10/10 proofs: 20.0/h < 29/h "
                               "(180.0 s/proof) (blame: machine) [2 verdicts; 1 bad: machine 123]")
    assert "- machine 123 (host 7781, RTX PRO 4000, pool rtx-pro-4000) instance pro-0-a: below-min-rate" in request.body
    assert request.trailers == (("Fleet-Machine", "123"), ("Fleet-Machine", "456"),
                                ("Fleet-Verdict", "below-min-rate"), ("Fleet-Verdict", "ok"),
                                ("Fleet-Instance", "pro-0-a"), ("Fleet-Instance", "pro-1-a"))
    paths = [c.path for c in request.changes]
    assert paths == ["fleet-spec/machines/123.yaml", "fleet-spec/machines/456.yaml"]
    record = parse_machine_record(request.changes[0].content or "", Path("fleet-spec/machines/123.yaml"))
    assert record.status == "bad" and record.host_id == "7781" and record.benchmarks[0].instance_id == "pro-0-a"


def test_judged_instances_are_skipped_whether_in_trailers_or_records() -> None:
    done = verdict_of(completed_report("pro-0-a", "123", 20.0))
    records = records_of([done])
    reports = [completed_report("pro-0-a", "123", 20.0), completed_report("pro-1-a", "456", 35.0)]
    assert commit_request(decide(SPEC, reports, records, {"pro-1-a"}, None, LATER)) is None


def test_pardon_by_deleting_the_record_is_not_undone_until_a_new_failure() -> None:
    reports = [completed_report("pro-0-a", "123", 20.0)]
    # The record of 123 was deleted by a human; its instance is still in the trailers.
    assert commit_request(decide(SPEC, reports, RecordSet(), {"pro-0-a"}, None, LATER)) is None
    again = [*reports, completed_report("pro-0-b", "123", 21.0)]
    decision = decide(SPEC, again, RecordSet(), {"pro-0-a"}, None, LATER)
    assert [v.instance_id for v in decision.recorded] == ["pro-0-b"]
    assert decision.machine_records["123"].status == "bad"


def test_pardoned_machine_keeps_its_status_on_an_image_blamed_failure() -> None:
    pardoned = MachineRecord("123", status="pardoned", note="bad cable replaced, ticket OPS-12")
    decision = decide(SPEC, [error_report("pro-0-c", "123", DAEMON_REFUSED_TAIL)],
                      RecordSet(machines={"123": pardoned}), set(), None, LATER)
    record = decision.machine_records["123"]
    assert record.status == "pardoned" and record.note == "bad cable replaced, ticket OPS-12"
    assert record.benchmarks[-1].blame == "image"


def test_running_and_unknown_pool_and_unsafe_machine_are_not_recorded() -> None:
    running = make_report("pro-0-r", "123", events=bench_events(25))
    stray = completed_report("old-0-a", "124", 20.0, pool="rtx3090")
    unsafe = completed_report("pro-0-u", "../etc", 20.0)
    anonymous = completed_report("pro-0-n", None, 20.0)
    decision = decide(SPEC, [running, stray, unsafe, anonymous], RecordSet(), set(), None,
                      LATER - timedelta(hours=2, minutes=30))
    assert commit_request(decision) is None
    assert decision.pending == ("pro-0-r",)
    assert any("pool 'rtx3090' is not in the spec" in n for n in decision.notes)
    assert any("pro-0-u" in n and "missing or unsafe" in n for n in decision.notes)
    assert any("pro-0-n" in n and "missing or unsafe" in n for n in decision.notes)


def test_unreadable_record_is_never_overwritten() -> None:
    records = RecordSet(problems=("fleet-spec/machines/123.yaml: $.status: 'maybe' is not one of ...",),
                        unreadable_machine_ids=frozenset({"123"}))
    decision = decide(SPEC, [completed_report("pro-0-a", "123", 20.0)], records, set(), None, LATER)
    assert commit_request(decision) is None
    assert any("unreadable" in n and "123" in n for n in decision.notes)


def test_second_network_params_failure_on_a_machine_marks_it_bad_across_passes() -> None:
    first = verdict_of(params_failed_report("pro-0-a", "123", NETWORK_TAIL))
    records = records_of([first])
    assert records.machines["123"].status == "ok"
    decision = decide(SPEC, [params_failed_report("pro-0-b", "123", NETWORK_TAIL)], records, set(), None, LATER)
    assert decision.machine_records["123"].status == "bad"


def test_two_network_params_failures_in_one_pass_mark_bad_but_an_ok_in_between_resets() -> None:
    both = [params_failed_report("pro-0-a", "123", NETWORK_TAIL),
            params_failed_report("pro-0-b", "123", NETWORK_TAIL, registered_min=1)]
    assert [v.marks_bad for v in decide(SPEC, both, RecordSet(), set(), None, LATER).recorded] == [False, True]
    history = records_of([verdict_of(params_failed_report("pro-0-a", "123", NETWORK_TAIL)),
                          verdict_of(completed_report("pro-0-b", "123", 35.0))])
    decision = decide(SPEC, [params_failed_report("pro-0-c", "123", NETWORK_TAIL)], history, set(), None, LATER)
    assert decision.machine_records["123"].status == "ok"


def test_stale_image_failure_records_but_never_marks_bad() -> None:
    report = error_report("pro-0-s", "123", CUDA_ERROR_TAIL, digest=OTHER_DIGEST)
    decision = decide(SPEC, [report], RecordSet(), set(), DIGEST, LATER)
    assert decision.machine_records["123"].status == "ok"
    assert decision.recorded[0].verdict == "stale-image"


def test_a_pass_shows_a_flux_style_condition_whose_since_survives_while_the_reason_stays() -> None:
    from reconciler.domain import errors
    from reconciler.flows.judge import PassResult

    first = PassResult(at=LATER, stalled="1 problem(s) in fleet spec", reason=errors.SPEC_INVALID).to_json()
    assert first["condition"] == {"type": "Stalled", "status": "True", "reason": "SpecInvalid",
                                  "message": "1 problem(s) in fleet spec", "since": format_time(LATER)}
    later = LATER + timedelta(minutes=5)
    again = PassResult(at=later, stalled="1 problem(s) in fleet spec", reason=errors.SPEC_INVALID)
    assert again.to_json(first["condition"])["condition"]["since"] == format_time(LATER)
    ok = PassResult(at=later).to_json(first["condition"])["condition"]
    assert (ok["type"], ok["reason"], ok["since"]) == ("Ready", "Succeeded", format_time(later))
    retry = PassResult(at=later, error="push rejected 3 times", reason=errors.GIT_PUSH_REJECTED).condition()
    assert str(retry) == "Reconciling=True GitPushRejected: push rejected 3 times"


def test_the_whole_ring_is_loaded_only_for_attempts_this_pass_can_judge() -> None:
    from reconciler.domain.judging import awaiting_evidence
    from tests.scenarios import T0, bench_events, error_report, make_report

    failed = error_report("p-failed", "111", ["Error: empty response"])
    judged = error_report("p-judged", "222", ["Error: empty response"])
    running = make_report("p-running", "333", events=bench_events(25))
    overdue = make_report("p-overdue", "444", events=bench_events(25))
    gone = make_report("p-gone", "555", events=bench_events(25), destroyed_min=60)  # before its deadline
    unknown_pool = make_report("p-pool", "666", pool="no-such-pool", events=bench_events(25))
    reports = [failed, judged, running, overdue, gone, unknown_pool]
    soon, late = T0 + timedelta(minutes=60), T0 + timedelta(minutes=200)
    assert awaiting_evidence(SPEC, reports, {"p-judged"}, soon) == ["p-failed"]
    assert awaiting_evidence(SPEC, reports, {"p-judged"}, late) == ["p-failed", "p-running", "p-overdue"]
