"""Circuit breaker and kill budget over judged history + this pass's verdicts (pure).

Every failure not positively attributed to the machine, the network, the params mirror or the marketplace
counts against an image (issue 23 item 1): one test per blame class shows which trip the breaker when the same
failure recurs on distinct machines with one image, and which never do."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from reconciler.domain.breaker import apply_guards, kill_budgets, kill_budgets_of_marks
from reconciler.domain.records import ImageSuspectRecord, RecordSet
from reconciler.domain.verdict import Verdict
from tests.scenarios import (
    CUDA_ERROR_TAIL,
    DAEMON_REFUSED_TAIL,
    DIGEST,
    IMAGE_CUDA_TAIL,
    LATER,
    OTHER_DIGEST,
    SPEC,
    completed_report,
    error_report,
    params_failed_report,
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
    # Our kernels fault (cudaErrorIllegalAddress) on every machine: image-class, so the breaker trips.
    a, b, c = (verdict_of(error_report(f"p-{m}", m, IMAGE_CUDA_TAIL, pool="rtx4090", gpu_name="RTX 4090"))
               for m in ("111", "222", "333"))
    assert a.blame == "image" and not a.marks_bad
    out = apply_guards(SPEC, RecordSet(), [a, b, c], LATER)
    assert [v.marks_bad for v in out.verdicts] == [False, False, False]
    assert [v.held_by for v in out.verdicts] == [None, "circuit-breaker", "circuit-breaker"]
    assert out.image_records[DIGEST].machines == ("111", "222", "333")
    assert out.image_records[DIGEST].signature == "cuda-illegal-address"


def test_active_suspect_holds_later_failures_and_grows() -> None:
    suspect = ImageSuspectRecord(DIGEST, "cuda-illegal-address", "suspect", ("111", "222"), "2026-12-01T00:00:00Z",
                                 pools=("rtx4090",), instances=("p-111", "p-222"), reason="tripped earlier")
    late = verdict_of(error_report("p-444", "444", IMAGE_CUDA_TAIL, pool="rtx4090"), LATER + timedelta(days=5))
    out = apply_guards(SPEC, RecordSet(images={DIGEST: suspect}), [late], LATER + timedelta(days=5))
    assert out.verdicts[0].held_by == "circuit-breaker" and not out.verdicts[0].marks_bad
    assert out.image_records[DIGEST].machines == ("111", "222", "444")


#: One failure per blame class, as real tails: (tail, blame, phase).
FAILURES = {
    "machine-xid-79": (["[ 9132.551027] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has "
                        "fallen off the bus.", "Error: Prove RPC failed"], "machine", "benchmark"),
    "machine-ecc": (["NVRM: Xid (PCI:0000:01:00): 48, pid=812, name=cuzk-daemon, An uncorrectable double bit error "
                     "(DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."],
                    "machine", "benchmark"),
    "machine-gpu-lost": (["fleet: nvidia-smi failed: Unable to determine the device handle for GPU0000:01:00.0: GPU "
                          "is lost.  Reboot the system to recover this GPU"], "machine", "benchmark"),
    "machine-cuda-device": (list(CUDA_ERROR_TAIL), "machine", "benchmark"),
    # A GPU fallen off the bus in a container without the kernel log: only the CUDA code (sppark exception.cuh).
    "machine-cuda-999-no-dmesg": (["cuzk-daemon: thread 'tokio-runtime-worker' panicked at "
                                   "/build/curio/extern/supraseal-c2/src/lib.rs:316:9:",
                                   "cuzk-daemon: sppark::Error #-999", "Error: Prove RPC failed"], "machine",
                                  "benchmark"),
    # ECC read from the CUDA code alone (the ECC signature also matches kernel Xid 48 lines, seen first hand).
    "machine-cuda-214-code-only": (["cuzk-daemon: sppark::Error #-214"], "machine", "benchmark"),
    # The same inference from other CUDA callers' formats (issue 23 item 4: the driver API name, PyTorch's text).
    "machine-cuda-driver-name": (['Error: DriverError(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")'],
                                 "machine", "benchmark"),
    "machine-cuda-text": (["RuntimeError: CUDA error: unknown error"], "machine", "benchmark"),
    "network-dns": (["Exception: [AbstractCommand.cc:351] errorCode=19 Name resolution for params.example.com "
                     "failed:Temporary failure in name resolution"], "network", "params"),
    "params-mirror-404": (["Exception: [AbstractCommand.cc:351] errorCode=3 URI=https://m/v28.params",
                           "  -> [HttpSkipResponseCommand.cc:215] errorCode=3 Resource not found"], "params", "params"),
    "configuration-oom": (['/opt/fleet/entrypoint.sh: line 225:   812 Killed                  cuzk-daemon --config x',
                           *DAEMON_REFUSED_TAIL[-2:]], "configuration", "benchmark"),
    "configuration-vram": (["cuzk-daemon: sppark::Error #-2"], "configuration", "benchmark"),
    "marketplace-stop": (["fleet: received SIGTERM during phase benchmark"], "marketplace", "benchmark"),
    "unknown": (["Error: empty response"], "unknown", "benchmark"),
}
#: Positively attributed: the machine seen first hand (kernel Xid, nvidia-smi), the network, the params mirror,
#: the marketplace. The same failure on three machines never trips the breaker.
POSITIVE = ("machine-xid-79", "machine-ecc", "machine-gpu-lost", "network-dns", "params-mirror-404",
            "marketplace-stop")
NOT_THE_IMAGE = {case: FAILURES[case] for case in POSITIVE}


def _three(case: str, machines: tuple[str, ...] = ("111", "222", "333")) -> list[Verdict]:
    tail, _, phase = FAILURES[case]
    make = params_failed_report if phase == "params" else error_report
    return [verdict_of(make(f"p-{m}", m, tail, pool="rtx4090")) for m in machines]


@pytest.mark.parametrize("case", sorted(NOT_THE_IMAGE))
def test_failures_positively_attributed_elsewhere_never_trip_the_breaker(case: str) -> None:
    verdicts = _three(case)
    assert {v.blame for v in verdicts} == {FAILURES[case][1]}
    out = apply_guards(SPEC, RecordSet(), verdicts, LATER)
    assert out.image_records == {} and all(v.held_by != "circuit-breaker" for v in out.verdicts)
    # Recorded history of the same failures does not trip it either.
    (later,) = _three(case, ("444",))
    assert apply_guards(SPEC, records_of(verdicts), [later], LATER).image_records == {}


@pytest.mark.parametrize("case", ["configuration-oom", "configuration-vram", "machine-cuda-device",
                                  "machine-cuda-999-no-dmesg", "machine-cuda-214-code-only",
                                  "machine-cuda-driver-name", "machine-cuda-text", "unknown"])
def test_failures_not_positively_attributed_trip_the_breaker_on_distinct_machines(case: str) -> None:
    # Issue 23 items 1 and 4: an unexplained failure, a pool-sizing fault and a machine blame read only from a
    # CUDA error code all recur on distinct machines with one image: the breaker decides, the pool pauses.
    first, second, third = _three(case)
    assert first.blame == FAILURES[case][1] and first.signature == second.signature == third.signature
    out = apply_guards(SPEC, RecordSet(), [first, second, third], LATER)
    record = out.image_records[DIGEST]
    assert record.active and record.signature == first.signature and record.machines == ("111", "222", "333")
    assert [v.held_by for v in out.verdicts] == [None, "circuit-breaker", "circuit-breaker"]
    assert not any(v.marks_bad for v in out.verdicts[1:])
    # Held verdicts blame the image, except a configuration fault, which keeps its setting to change.
    assert {v.blame for v in out.verdicts[1:]} == {"configuration" if first.blame == "configuration" else "image"}
    # The same from recorded history: two recorded machines, the third trips it.
    assert apply_guards(SPEC, records_of([first]), [second], LATER).image_records[DIGEST].machines == ("111", "222")


def test_the_seed_incident_trips_the_breaker_with_an_unrecognised_signature() -> None:
    # Exit 1 after 0 proofs, nothing in the tail but aria2c progress: blame unknown, machines never bad.
    tail = [f"[#26a862 {n}GiB/56GiB({n * 100 // 56}%) CN:16 DL:408MiB ETA:{56 - n}s]" for n in range(30, 56)]
    verdicts = [verdict_of(error_report(f"p-{m}", m, tail, pool="rtx4090", registered_min=i))
                for i, m in enumerate(("111", "222", "333"))]
    assert {v.blame for v in verdicts} == {"unknown"} and not any(v.marks_bad for v in verdicts)
    assert len({v.signature for v in verdicts}) == 1
    assert verdicts[0].signature is not None and "-unrecognized-benchmark-exit-1-" in verdicts[0].signature
    out = apply_guards(SPEC, RecordSet(), verdicts, LATER)
    assert out.image_records[DIGEST].machines == ("111", "222", "333")
    assert not any(v.marks_bad for v in out.verdicts)


def test_unrecognised_signatures_differ_by_phase_exit_code_and_error_line_but_not_by_numbers_or_paths() -> None:
    def sig(tail: list[str], exit_code: int = 1) -> str | None:
        return verdict_of(error_report("p-1", "111", tail, exit_code=exit_code)).signature

    base = sig(["Error: empty response from 127.0.0.1:9820 after 12.5s reading /var/tmp/x/c1.json job 3fa9b2c7e1"])
    assert base == sig(["Error: empty response from 10.0.0.7:9821 after 3s reading /data/c1.json job 77aa01bc9f"])
    assert base != sig(["Error: empty response from 127.0.0.1:9820 after 12.5s reading /var/tmp/x/c1.json"], 2)
    assert base != sig(["Error: stream closed"])


@pytest.mark.parametrize("case", ["configuration-oom", "configuration-vram", "params-mirror-404", "marketplace-stop",
                                  "unknown"])
def test_only_machine_evidence_spends_the_kill_budget(case: str) -> None:
    tail, _, phase = FAILURES[case]
    make = params_failed_report if phase == "params" else error_report
    verdicts = [verdict_of(make(f"p-{m}", m, tail, pool="rtx-pro-4000")) for m in ("111", "222", "333")]
    out = apply_guards(SPEC, RecordSet(), verdicts, LATER)
    assert out.kill_budgets["rtx-pro-4000"].used == () and not any(v.marks_bad for v in out.verdicts)
    machine = [verdict_of(error_report(f"q-{m}", m, NOT_THE_IMAGE["machine-xid-79"][0])) for m in ("111", "222")]
    spent = apply_guards(SPEC, RecordSet(), machine, LATER)
    assert spent.kill_budgets["rtx-pro-4000"].used == ("111",)  # pool of 2 allows 1; the 2nd is held
    assert spent.verdicts[1].held_by == "kill-budget"


def test_different_signature_or_digest_or_an_old_failure_does_not_trip() -> None:
    first = verdict_of(error_report("p-111", "111", DAEMON_REFUSED_TAIL))
    other_sig = verdict_of(error_report("p-222", "222", IMAGE_CUDA_TAIL))
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


def test_kill_budgets_handed_over_decide_as_the_ones_read_from_the_records() -> None:
    # A replay keeps the budgets from pass to pass and hands them over with only the records the breaker reads:
    # the same budgets give the same verdicts; the handed budgets are the ones spent, not the view's.
    earlier = verdict_of(completed_report("p-111", "111", 20.0, pool="rtx4090"), LATER - timedelta(hours=2))
    records = records_of([earlier])
    new = [verdict_of(completed_report(f"p-{m}", m, 20.0, pool="rtx4090")) for m in ("222", "333")]
    read = apply_guards(SPEC, records, new, LATER)
    handed = apply_guards(SPEC, RecordSet(), new, LATER, budgets=kill_budgets(SPEC, records, LATER))
    assert handed.verdicts == read.verdicts and handed.kill_budgets == read.kill_budgets
    assert [v.held_by for v in handed.verdicts] == [None, "kill-budget"]
    # Budgets that say the window holds no mark (none read): both new marks fit the pool's two.
    fresh = apply_guards(SPEC, records, new, LATER, budgets=kill_budgets(SPEC, RecordSet(), LATER))
    assert [v.held_by for v in fresh.verdicts] == [None, None]


def test_kill_budgets_from_the_marks_decide_as_the_ones_read_from_the_records() -> None:
    # A replay keeps its bad marks sorted by time and hands over those within reach of the window, not a RecordSet of
    # every machine they name: the same rule on the same marks, in any order, older ones left out or not.
    marked = [verdict_of(completed_report(f"p-{m}-{hours}", m, 20.0, pool=pool), LATER - timedelta(hours=hours))
              for m, pool, hours in (("666", "rtx4090", 60), ("111", "rtx4090", 30), ("222", "rtx4090", 2),
                                     ("333", "rtx-pro-4000", 23), ("444", "rtx-pro-4000", 1), ("111", "rtx4090", 1))]
    elsewhere = replace(verdict_of(completed_report("p-555", "555", 20.0, pool="rtx4090")), pool="gone")
    records = records_of([*marked, elsewhere])
    read = kill_budgets(SPEC, records, LATER)
    assert read["rtx4090"].used == ("111", "222") and read["rtx-pro-4000"].used == ("333", "444")
    marks = records.bad_marks()
    assert kill_budgets_of_marks(SPEC, marks, LATER) == read
    assert kill_budgets_of_marks(SPEC, reversed(marks), LATER) == read
    within = [(m, pool, at) for m, pool, at in marks if at >= "2026-12-01"]
    assert len(within) < len(marks) and kill_budgets_of_marks(SPEC, within, LATER) == read
    assert kill_budgets_of_marks(SPEC, [], LATER) == kill_budgets(SPEC, RecordSet(), LATER)
