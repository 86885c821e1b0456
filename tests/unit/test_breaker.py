"""Circuit breaker and kill budget over judged history + this pass's verdicts (pure)."""

from __future__ import annotations

from datetime import timedelta

from reconciler.domain.breaker import apply_guards, kill_budgets
from reconciler.domain.records import ImageSuspectRecord, RecordSet
from tests.scenarios import (
    CUDA_ERROR_TAIL,
    DAEMON_REFUSED_TAIL,
    DIGEST,
    LATER,
    OTHER_DIGEST,
    SPEC,
    completed_report,
    error_report,
    records_of,
    verdict_of,
)


def test_same_software_failure_on_a_second_machine_trips_and_records_the_image() -> None:
    first = verdict_of(error_report("pro-0-a", "40213", DAEMON_REFUSED_TAIL))
    second = verdict_of(error_report("pro-1-a", "51877", DAEMON_REFUSED_TAIL, host_id="9001"))
    out = apply_guards(SPEC, records_of([first]), [second], LATER)
    (held,) = out.verdicts
    assert held.held_by == "circuit-breaker" and held.blame == "image" and not held.marks_bad
    record = out.image_records[DIGEST]
    assert record.active and record.signature == "daemon-connection-refused"
    assert record.machines == ("40213", "51877") and record.instances == ("pro-0-a", "pro-1-a")
    assert record.pools == ("rtx-pro-4000",) and record.tripped_at == "2026-12-02T21:00:00Z"
    assert "pools rtx-pro-4000 paused" in record.reason
    assert any("circuit breaker tripped" in n for n in out.notes)


def test_breaker_saves_good_machines_from_an_image_that_provokes_cuda_errors() -> None:
    a, b, c = (verdict_of(error_report(f"p-{m}", m, CUDA_ERROR_TAIL, pool="rtx4090", gpu_name="RTX 4090"))
               for m in ("111", "222", "333"))
    assert a.marks_bad and a.blame == "machine"
    out = apply_guards(SPEC, RecordSet(), [a, b, c], LATER)
    assert [v.marks_bad for v in out.verdicts] == [True, False, False]
    assert [v.held_by for v in out.verdicts] == [None, "circuit-breaker", "circuit-breaker"]
    assert out.image_records[DIGEST].machines == ("111", "222", "333")
    assert out.image_records[DIGEST].signature == "cuda-error"


def test_active_suspect_holds_later_failures_and_grows() -> None:
    suspect = ImageSuspectRecord(DIGEST, "cuda-error", "suspect", ("111", "222"), "2026-12-01T00:00:00Z",
                                 pools=("rtx4090",), instances=("p-111", "p-222"), reason="tripped earlier")
    late = verdict_of(error_report("p-444", "444", CUDA_ERROR_TAIL, pool="rtx4090"), LATER + timedelta(days=5))
    out = apply_guards(SPEC, RecordSet(images={DIGEST: suspect}), [late], LATER + timedelta(days=5))
    assert out.verdicts[0].held_by == "circuit-breaker" and not out.verdicts[0].marks_bad
    assert out.image_records[DIGEST].machines == ("111", "222", "444")


def test_different_signature_or_digest_or_an_old_failure_does_not_trip() -> None:
    first = verdict_of(error_report("p-111", "111", DAEMON_REFUSED_TAIL))
    other_sig = verdict_of(error_report("p-222", "222", CUDA_ERROR_TAIL))
    other_digest = verdict_of(error_report("p-333", "333", DAEMON_REFUSED_TAIL, digest=OTHER_DIGEST))
    out = apply_guards(SPEC, records_of([first]), [other_sig, other_digest], LATER)
    assert out.image_records == {} and all(v.held_by is None for v in out.verdicts)
    much_later = LATER + timedelta(hours=25)
    late = verdict_of(error_report("p-444", "444", DAEMON_REFUSED_TAIL), much_later)
    assert apply_guards(SPEC, records_of([first]), [late], much_later).image_records == {}


def test_below_min_rate_never_trips_the_breaker() -> None:
    slow = [verdict_of(completed_report(f"p-{m}", m, 20.0)) for m in ("111", "222", "333")]
    out = apply_guards(SPEC, RecordSet(), slow, LATER)
    assert out.image_records == {}


def test_cleared_suspect_forgives_listed_failures_and_needs_k_new_machines() -> None:
    old = [verdict_of(error_report(f"p-{m}", m, DAEMON_REFUSED_TAIL)) for m in ("111", "222")]
    cleared = ImageSuspectRecord(DIGEST, "daemon-connection-refused", "cleared", ("111", "222"),
                                 "2026-12-02T20:00:00Z", pools=("rtx-pro-4000",), instances=("p-111", "p-222"))
    records = records_of(old, [cleared])
    one_new = verdict_of(error_report("p-333", "333", DAEMON_REFUSED_TAIL))
    assert apply_guards(SPEC, records, [one_new], LATER).image_records == {}
    two_new = [one_new, verdict_of(error_report("p-444", "444", DAEMON_REFUSED_TAIL))]
    out = apply_guards(SPEC, records, two_new, LATER)
    assert out.image_records[DIGEST].active and out.image_records[DIGEST].machines == ("333", "444")


def test_deleted_suspect_record_is_recreated_only_by_a_new_failure() -> None:
    old = [verdict_of(error_report(f"p-{m}", m, DAEMON_REFUSED_TAIL)) for m in ("111", "222")]
    records = records_of(old)  # the record was deleted by a human
    assert apply_guards(SPEC, records, [], LATER).image_records == {}
    out = apply_guards(SPEC, records, [verdict_of(error_report("p-333", "333", DAEMON_REFUSED_TAIL))], LATER)
    assert out.image_records[DIGEST].machines == ("111", "222", "333")


def test_kill_budget_holds_machine_verdicts_beyond_the_pools_share() -> None:
    # rtx4090: count 10, max_fraction 0.2 -> 2 machines per 24h.
    earlier = verdict_of(completed_report("p-111", "111", 20.0, pool="rtx4090"), LATER - timedelta(hours=2))
    records = records_of([earlier])
    assert kill_budgets(SPEC, records, LATER)["rtx4090"].used == ("111",)
    new = [verdict_of(completed_report(f"p-{m}", m, 20.0, pool="rtx4090")) for m in ("222", "333")]
    out = apply_guards(SPEC, records, new, LATER)
    assert [v.marks_bad for v in out.verdicts] == [True, False]
    held = out.verdicts[1]
    assert held.held_by == "kill-budget" and held.blame == "machine" and held.verdict == "below-min-rate"
    assert out.kill_budgets["rtx4090"].exhausted and out.kill_budgets["rtx4090"].used == ("111", "222")
    assert any("kill budget of pool rtx4090 exhausted (2/2" in n for n in out.notes)


def test_kill_budget_window_slides_and_already_bad_machines_cost_nothing() -> None:
    old = verdict_of(completed_report("p-111", "111", 20.0, pool="rtx-pro-4000"), LATER - timedelta(hours=30))
    records = records_of([old])
    assert kill_budgets(SPEC, records, LATER)["rtx-pro-4000"].used == ()
    again = verdict_of(completed_report("p-111b", "111", 19.0))  # 111 is already bad: no budget spent
    fresh = verdict_of(completed_report("p-222", "222", 20.0))  # pool allows 1 per window
    out = apply_guards(SPEC, records, [again, fresh], LATER)
    assert [v.marks_bad for v in out.verdicts] == [True, True]
