"""verdict.judge: each verdict class, its blame, its evidence, and the edges (deadline, stale image, policy).

The report builders here (`spec_from_text`, `make_report`, ...) are reused by the decide, loop and seed
incident tests so all of them speak about the same realistic worker reports.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from reconciler.domain.breaker import verdict_failure
from reconciler.domain.observations import BenchmarkResult
from reconciler.domain.verdict import PARAMS_FAILURES_BEFORE_BAD, judge
from tests.scenarios import (
    CUDA_ERROR_TAIL,
    DAEMON_REFUSED_TAIL,
    DIGEST,
    LATER,
    OTHER_DIGEST,
    SPEC,
    T0,
    bench_events,
    completed_report,
    error_report,
    ev,
    make_report,
    params_failed_report,
)

POOL = SPEC.pool("rtx-pro-4000")


def test_completed_above_min_rate_is_ok_and_never_bad() -> None:
    v = judge(completed_report("pro-0-a", "40213", 35.0), POOL, LATER)
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad) == ("ok", "none", False)
    assert v.reason == "ok: benchmark exit 0, 10/10 proofs: 35.0/h >= 29/h (102.9 s/proof)"


def test_below_min_rate_blames_the_machine_with_rate_evidence() -> None:
    v = judge(completed_report("pro-0-b", "40213", 20.0), POOL, LATER)
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad) == ("below-min-rate", "machine", True)
    assert v.reason == "below-min-rate: benchmark exit 0, 10/10 proofs: 20.0/h < 29/h (180.0 s/proof)"
    assert v.evidence["proofs_per_hour"] == 20.0 and v.evidence["seconds_per_proof"] == 180.0
    assert v.evidence["host_id"] == "7781" and v.evidence["machine_id"] == "40213"
    assert v.evidence["phases"]["params-done"] == "2026-12-02T18:22:00Z"
    entry = v.to_entry()
    assert entry.proofs_per_hour == 20.0 and entry.min_rate_proofs_per_hour == 29


def test_benchmark_error_with_software_signature_is_the_images_fault() -> None:
    v = judge(error_report("pro-0-c", "40213", DAEMON_REFUSED_TAIL), POOL, LATER)
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad) == ("benchmark-error", "image", False)
    assert v.signature == "daemon-connection-refused"
    assert v.exit_code == 1 and v.evidence["exit_code"] == 1
    assert v.reason == ("benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused (os error 111) "
                        "connecting to 127.0.0.1:9820")
    assert v.root_cause().endswith("(blame: image)")
    assert v.evidence["log_tail"][-1] == "benchmark.sh: cuzk-bench exited with status 1, 0/10 proofs"
    assert v.evidence["proofs"] == {"requested": 10, "completed": 0, "failed": 0}


def test_benchmark_error_with_gpu_signature_marks_the_machine_bad() -> None:
    v = judge(error_report("pro-0-d", "40213", CUDA_ERROR_TAIL), POOL, LATER)
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad, v.signature) == ("benchmark-error", "machine", True, "cuda-no-device")


def test_unrecognised_failure_is_unknown_and_never_marks_bad() -> None:
    v = judge(error_report("pro-0-e", "40213", ["cuzk-bench: something odd happened"], exit_code=2), POOL, LATER)
    assert v is not None
    assert (v.blame, v.marks_bad) == ("unknown", False)
    assert v.signature is not None and v.signature.startswith("benchmark-error-unrecognized-benchmark-exit-2-")
    assert "something odd happened" in v.reason
    assert v.evidence["signature"]["normalised"] == "cuzk-bench: something odd happened"


def test_completed_without_throughput_line_is_a_benchmark_error() -> None:
    result = BenchmarkResult(outcome="completed", at=T0 + timedelta(minutes=40), requested=10, completed=10,
                             failed=0, exit_code=0, log_tail=("=== Batch Summary ===",))
    v = judge(make_report("pro-0-f", events=bench_events(), result=result), POOL, LATER)
    assert v is not None
    assert v.verdict == "benchmark-error" and "no throughput line" in v.reason and not v.marks_bad


def test_params_failure_gets_one_network_strike_then_marks_bad() -> None:
    tail = ["02/12 18:14:00 [ERROR] CUID#7 - Download aborted. URI=https://proofs.filecoin.io/v28-stacked.params",
            "Exception: [AbstractCommand.cc:351] errorCode=1 URI=https://proofs.filecoin.io/v28-stacked.params",
            "  -> [SocketCore.cc:1019] errorCode=1 Failed to receive data, cause: Connection reset by peer"]
    first = judge(params_failed_report("pro-0-g", "40213", tail), POOL, LATER)
    second = judge(params_failed_report("pro-0-h", "40213", tail), POOL, LATER,
                   prior_params_failures=PARAMS_FAILURES_BEFORE_BAD - 1)
    assert first is not None and second is not None
    assert (first.verdict, first.blame, first.marks_bad) == ("params-failed", "network", False)
    assert (second.blame, second.marks_bad) == ("network", True)
    assert "strike 1 of 2" in first.reason and "strike 2 of 2" in second.reason
    assert first.phase == "params" and first.exit_code == 22


def test_a_params_failure_with_only_generic_lines_is_unknown_held_and_never_a_strike() -> None:
    # aria2c's own words say only that it stopped (`Download aborted`, errorCode=1 "unknown error"): nothing
    # names the network, so no strike is counted on a guess, whatever the machine's history (issue 29 item 2).
    tail = ["02/12 18:14:00 [ERROR] CUID#7 - Download aborted. URI=https://proofs.filecoin.io/v28-stacked.params",
            "Exception: [AbstractCommand.cc:351] errorCode=1 URI=https://proofs.filecoin.io/v28-stacked.params",
            "fleet: ERROR: aria2c failed to download https://proofs.filecoin.io/v28-stacked.params (exit code 1)"]
    v = judge(params_failed_report("pro-0-g", "40213", tail), POOL, LATER,
              prior_params_failures=PARAMS_FAILURES_BEFORE_BAD - 1)
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad, v.held_by) == ("params-failed", "unknown", False, None)
    assert "strike" not in v.reason
    assert v.reason.startswith("params-failed: params exit 22, 0/10 proofs: not recognised: "), v.reason
    assert "Download aborted" in v.reason or "exit code 1" in v.reason
    assert v.signature is not None and v.signature.startswith("params-failed-unrecognized-params-exit-22-")
    assert v.evidence["signature"]["generic"] == "download-failed-generic"
    # Not the image's to answer for: the fleet decides an unexplained fetch failure by its mirror or a retest.
    assert verdict_failure(v) is None


def test_params_failure_with_image_signature_blames_the_image() -> None:
    v = judge(params_failed_report("pro-0-i", "40213", ["sh: 1: aria2c: not found"]), POOL, LATER,
              prior_params_failures=5)
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad) == ("params-failed", "image", False)


def test_running_benchmark_is_not_judged_before_its_deadline() -> None:
    report = make_report("pro-0-j", events=[*bench_events(25), ev("benchmark", "progress", 50,
                                                                    details={"completed": 2, "requested": 10})])
    assert judge(report, POOL, T0 + timedelta(minutes=144)) is None  # deadline = 25 + 120 min


def test_slow_partial_benchmark_times_out_and_blames_the_machine() -> None:
    report = make_report("pro-0-j", events=[*bench_events(25), ev("benchmark", "progress", 50,
                                                                    details={"completed": 2, "requested": 10})])
    v = judge(report, POOL, T0 + timedelta(minutes=146))
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad) == ("timeout", "machine", True)
    assert v.proofs_per_hour == 1.0  # 2 proofs in 120 minutes
    assert v.reason.startswith("timeout after 120 min: benchmark exit ?, 2/10 proofs: 1.0/h partial < 29/h")


def test_zero_proof_hang_without_signature_is_unknown() -> None:
    v = judge(make_report("pro-0-k", events=bench_events(25)), POOL, T0 + timedelta(minutes=146))
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad) == ("timeout", "unknown", False)
    # Unexplained, so keyed for the breaker by phase, exit code (none: no result) and the normalised last line.
    assert v.signature is not None and v.signature.startswith("timeout-unrecognized-benchmark-exit-none-")


def test_worker_reported_timeout_counts_partial_proofs() -> None:
    result = BenchmarkResult(outcome="timeout", at=T0 + timedelta(minutes=145), requested=10, completed=4,
                             failed=0, started_at=T0 + timedelta(minutes=25), exit_code=124)
    v = judge(make_report("pro-0-l", events=bench_events(25), result=result), POOL, T0 + timedelta(minutes=146))
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad, v.proofs_per_hour) == ("timeout", "machine", True, 2.0)


def test_never_started_deadline_counts_from_registration_and_blames_params() -> None:
    report = make_report("pro-0-m", events=[ev("register", "done", 0.5), ev("params", "started", 1)],
                         log_tail=["[#26a862 2.1GiB/44GiB(4%) CN:16 DL:1.2MiB ETA:9h]"])
    assert judge(report, POOL, T0 + timedelta(minutes=119)) is None
    v = judge(report, POOL, T0 + timedelta(minutes=121))
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad) == ("params-failed", "unknown", False)
    assert "not fetched 120 min after registration" in v.reason and "not recognised" in v.reason


def test_failure_on_a_stale_image_is_never_the_machines_fault() -> None:
    v = judge(error_report("pro-0-n", "40213", CUDA_ERROR_TAIL, digest=OTHER_DIGEST), POOL, LATER,
              desired_image_digest=DIGEST)
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad) == ("stale-image", "image", False)
    assert v.reason.startswith("stale-image sha256:b2b2b2b2b2b2 (desired sha256:a1a1a1a1a1a1)")
    passing = judge(completed_report("pro-0-o", "40213", 35.0, digest=OTHER_DIGEST), POOL, LATER,
                    desired_image_digest=DIGEST)
    assert passing is not None and passing.verdict == "ok"
    unknown_digest = judge(error_report("pro-0-p", "40213", CUDA_ERROR_TAIL, digest=None), POOL, LATER,
                           desired_image_digest=DIGEST)
    assert unknown_digest is not None and unknown_digest.verdict == "benchmark-error"


def test_instance_destroyed_before_its_deadline_is_not_evidence() -> None:
    report = make_report("pro-0-q", events=bench_events(25), destroyed_min=40)
    assert judge(report, POOL, T0 + timedelta(hours=10)) is None


def test_tunnel_failure_alone_does_not_end_the_attempt() -> None:
    report = make_report("pro-0-r", events=[ev("register", "done", 0.5),
                                            ev("tunnel", "failed", 1, exit_code=255,
                                               log_tail=("ssh: connect to host x port 22: Connection refused",))])
    assert judge(report, POOL, T0 + timedelta(minutes=30)) is None


def test_secrets_in_the_tail_never_reach_the_evidence() -> None:
    tail = [*DAEMON_REFUSED_TAIL[:-1], "env: FLEET_TOKEN=3f9a1c0d2e4b5a69788766554433221100ffeeddccbbaa99",
            DAEMON_REFUSED_TAIL[-1]]
    v = judge(error_report("pro-0-s", "40213", tail), POOL, LATER)
    assert v is not None
    text = "\n".join(v.evidence["log_tail"])
    assert "3f9a1c0d2e4b5a69" not in text and "[REDACTED]" in text


@pytest.mark.parametrize(("gpu_line", "blame"), [
    ("NVRM: Xid (PCI:0000:01:00): 79, pid=2741, GPU has fallen off the bus.", "machine"),
    ("cuzk-daemon: sppark::Error #-100", "machine"),
    # VRAM too small for the workload: the pool is sized wrong, neither machine nor image (issue 13).
    ('cudaMalloc(&cache.ptr, sz_bytes)@cuda/groth16_cuda.cu:182 failed: "out of memory"', "configuration")])
def test_gpu_lines_beat_the_connection_refused_they_cause(gpu_line: str, blame: str) -> None:
    tail = [*DAEMON_REFUSED_TAIL[:-2], gpu_line, *DAEMON_REFUSED_TAIL[-2:]]
    v = judge(error_report("pro-0-t", "40213", tail), POOL, LATER)
    assert v is not None and v.blame == blame and v.marks_bad == (blame == "machine")
    assert gpu_line.split(": ", 1)[-1][:30] in v.reason


def test_new_result_shape_per_proof_reasons_and_daemon_log_judge_without_a_ring() -> None:
    """Protocol additions: labels and reasons come with the result; the daemon log rides along (no ring)."""
    from reconciler.domain.observations import ProofResult

    reason = "PoRep proof self-check failed: assembled proof did not verify (sector=1, miner=1000)"
    proofs = tuple(ProofResult(i, "FAILED" if i in (4, 9) else "COMPLETED", 90.0, reason if i in (4, 9) else None)
                   for i in range(1, 11))
    result = BenchmarkResult(outcome="completed", at=T0 + timedelta(minutes=40), requested=10, completed=8, failed=2,
                             exit_code=0, proofs_per_hour=36.9, seconds_per_proof=97.5, proofs=proofs,
                             daemon_log=("cuzk-daemon: 2026-12-02T18:30:00.1Z  INFO cuzk_core::engine: ready",))
    v = judge(make_report("pro-0-z", events=bench_events(), result=result), POOL, LATER)
    assert v is not None
    assert (v.verdict, v.blame, v.marks_bad, v.signature) == ("benchmark-error", "machine", True,
                                                              "proof-self-check-intermittent")
    assert v.reason.startswith("benchmark-error: benchmark exit 0, 8/10 proofs: PoRep proof self-check failed")
    assert v.evidence["proofs"]["labels"][3] == "FAILED" and v.proofs_per_hour == 36.9
    assert v.evidence["proofs"]["reasons"] == [f"FAILED: {reason}"]
    # The same labels parsed from cuzk-bench's own lines (an older worker) give the same verdict.
    lines = tuple(f"  [{p.index}/10] {p.label} — 90.0s (prove=0 ms, queue=0 ms)" for p in proofs)
    old = BenchmarkResult(outcome="completed", at=result.at, requested=10, completed=8, failed=2, exit_code=0,
                          proofs_per_hour=36.9, seconds_per_proof=97.5, log_tail=lines)
    ring = ("2026-12-02T18:31:00Z cuzk-daemon: 2026-12-02T18:31:00.1Z ERROR cuzk_core::engine: Phase 7: PoRep proof "
            "self-check FAILED — proof will NOT be returned to caller job_id=1 proof_len=1920 sector=1 miner=1000",)
    w = judge(make_report("pro-0-z", events=bench_events(), result=old, log_tail=ring), POOL, LATER)
    assert w is not None and (w.blame, w.signature) == ("machine", "proof-self-check-intermittent")
    assert w.evidence["daemon_log"] and "self-check FAILED" in w.evidence["daemon_log"][0]


def test_a_failed_warmup_is_a_benchmark_error_of_phase_warmup() -> None:
    tail = ("Error: PreloadSRS RPC failed", "", "Caused by:",
            '    status: Internal, message: "SRS param file not found for Porep32G: /data/zk/params/v28.params", '
            "details: [], metadata: MetadataMap { headers: {} }")
    events = [*bench_events()[:-1], ev("warmup", "started", 24.5), ev("warmup", "failed", 26, exit_code=1,
                                                                      log_tail=tail)]
    v = judge(make_report("pro-0-w", events=events, log_tail=tail), POOL, LATER)
    assert v is not None
    assert (v.verdict, v.blame, v.signature) == ("benchmark-error", "params", "srs-param-file-missing")
    assert v.reason.startswith("benchmark-error: warmup exit 1, 0/10 proofs: Error: PreloadSRS RPC failed")


def test_a_recovered_params_hiccup_never_explains_a_later_benchmark_failure() -> None:
    ring = ("2026-12-02T18:05:00Z curl: (6) Could not resolve host: params.example.com",
            "2026-12-02T18:05:01Z fleet: params: resuming v28.params at 1 of 2 bytes (curl)",
            "2026-12-02T18:01:00Z fleet: nvidia-smi failed: No devices were found",  # skewed clock, kept
            "2026-12-02T18:22:00Z fleet: starting cuzk-daemon --config /var/lib/fleet/cuzk.toml",
            "2026-12-02T18:25:00Z Error: empty response")
    v = judge(make_report("pro-0-h", events=[*bench_events(), ev("benchmark", "failed", 27, exit_code=1,
                                                                 log_tail=ring[-1:])], log_tail=ring), POOL, LATER)
    assert v is not None and (v.blame, v.signature) == ("machine", "nvidia-no-device")
    v2 = judge(make_report("pro-0-i", events=[*bench_events(), ev("benchmark", "failed", 27, exit_code=1,
                                                                  log_tail=ring[-1:])],
                           log_tail=ring[:2] + ring[3:]), POOL, LATER)
    assert v2 is not None and v2.blame == "unknown"
    assert v2.signature is not None and v2.signature.startswith("benchmark-error-unrecognized-benchmark-exit-1-")


#: aria2c's exception chain for a full disk (aria2 src/AbstractDiskWriter.cc: "Failed to write into the file %s,
#: cause: %s" with strerror(ENOSPC); the `  -> [...]` cause lines of RequestGroup/AbstractCommand as aria2c prints
#: them), on the real params file name (filecoin-project/curio build/proof-params/parameters.json).
PARAMS_FILE = ("v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher-"
               "82a357d2f2ca81dc61bb45f4a762807aedee1b0a53fd6c4e77b46a01bfef7820.params")
DISK_FULL_CHAIN = (
    f"12/03 06:10:02 [ERROR] CUID#7 - Download aborted. URI=https://params.example.com/v28/{PARAMS_FILE}",
    f"Exception: [AbstractCommand.cc:351] errorCode=9 URI=https://params.example.com/v28/{PARAMS_FILE}",
    "  -> [RequestGroup.cc:760] errorCode=9 Download aborted.",
    "  -> [AbstractDiskWriter.cc:453] errNum=28 errorCode=9 Failed to write into the file "
    f"/var/tmp/filecoin-proof-parameters/{PARAMS_FILE}.part, cause: No space left on device",
)


def test_a_long_chain_keeps_the_clause_after_cause_and_shortens_paths_urls_and_ids_inside() -> None:
    v = judge(params_failed_report("pro-0-disk", "40213", DISK_FULL_CHAIN), POOL, LATER)
    assert v is not None and v.blame == "configuration"
    assert v.reason.endswith("cause: No space left on device"), v.reason
    cause = v.reason.split(": ", 2)[2]
    assert len(cause) <= 240
    assert "82a357d2…" in cause and "7b46a01b" not in cause  # a hex id: its first 8 digits
    assert "/var/…/" in cause and "/var/tmp/filecoin-proof-parameters/" not in cause  # a path: first dir + file


@pytest.mark.parametrize("marker", ["cause:", "error:", "failed:"])
def test_a_single_long_line_keeps_the_clause_after_its_cause_marker(marker: str) -> None:
    words = " ".join(f"step{n} of the set-up went fine" for n in range(12))
    line = f"fleet: {words}; then {marker} the daemon could not open /dev/nvidia0 (No such device)"
    v = judge(error_report("pro-0-long", "40213", [line]), POOL, LATER)
    assert v is not None
    assert v.reason.endswith(f"{marker} the daemon could not open /dev/nvidia0 (No such device)"), v.reason
    assert "…" in v.reason and len(v.reason.split(": ", 2)[2]) <= 240


def test_the_workers_checkpoint_token_is_never_part_of_a_root_cause() -> None:
    line = ("fleet: phase warmup failed with exit code 1: warm-up failed: cuzk-bench batch (warm-up proof) exited "
            "with code 1 [checkpoint 2244623354]")
    v = judge(error_report("pro-0-ckpt", "40213", [line]), POOL, LATER)
    assert v is not None and v.reason.endswith("exited with code 1"), v.reason


#: nvidia-smi at boot on a host whose driver and library disagree (NVML's message, as nvidia-smi prints it), then
#: 80+ lines of a set-up that went on, then a daemon warning and its exit: the boot line decides.
NVML_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
LONG_SETUP = tuple(f"2026-12-02T18:{5 + n // 10:02d}:{n % 10 * 6:02d}Z fleet: params: {n} of 90 files verified"
                   for n in range(90))


def test_a_failed_gpu_probe_at_registration_explains_a_later_daemon_exit() -> None:
    ring = (f"2026-12-02T18:00:10Z fleet: nvidia-smi failed: {NVML_MISMATCH}", *LONG_SETUP,
            "2026-12-02T18:22:00Z fleet: starting /usr/local/bin/cuzk-daemon --config /var/lib/fleet-worker/cuzk.toml",
            "2026-12-02T18:22:01Z cuzk-daemon: 2026-12-02T18:22:01.000000Z  WARN cuzk_core::engine: nvidia-smi not "
            "available, defaulting to single GPU (ordinal 0)")
    failed = ev("daemon", "failed", 23, exit_code=1, log_tail=ring[-1:],
                message="cuzk-daemon exited (code 1) before answering cuzk-bench status")
    for report in (make_report("pro-0-nvml", log_tail=ring, events=[ev("register", "done", 0.5), failed]),
                   replace(make_report("pro-0-probe", log_tail=ring[1:], events=[ev("register", "done", 0.5), failed]),
                           gpu_probe=(NVML_MISMATCH,))):
        v = judge(report, POOL, LATER)
        assert v is not None and (v.blame, v.signature) == ("machine", "nvidia-driver-mismatch"), v.reason
        assert NVML_MISMATCH in v.reason and "defaulting to single GPU" not in v.reason


def test_a_timeout_shows_an_earlier_xid_before_the_partial_rate() -> None:
    xid = "kernel: NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    ring = (*LONG_SETUP[:5], xid, *(f"cuzk-daemon: 2026-12-02T18:{30 + n // 60:02d}:{n % 60:02d}.000000Z  INFO "
                                    f"cuzk_core::engine: waiting job_id=j{n}" for n in range(120)))
    report = make_report("pro-0-xid", log_tail=ring, events=[*bench_events(25), ev(
        "benchmark", "progress", 50, details={"completed": 2, "requested": 10})])
    v = judge(report, POOL, T0 + timedelta(minutes=146))
    assert v is not None and (v.verdict, v.blame, v.signature) == ("timeout", "machine", "gpu-fell-off-bus")
    assert v.reason.startswith("timeout after 120 min: benchmark exit ?, 2/10 proofs: kernel: NVRM: Xid"), v.reason
    assert v.reason.index("fallen off the bus") < v.reason.index("partial")
