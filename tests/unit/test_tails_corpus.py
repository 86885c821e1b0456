"""The classifier suite: every real tail in tests/fixtures/tails/ judged end to end (issue 13 items 1-4,
issue 14 items 1 and 5).

Each fixture is one worker report built from real strings (its `sources` cite curio at e0294b0f, sppark,
NVIDIA's Xid catalogue, aria2c/curl exit codes, glibc, bash, the kernel) and the expected verdict, blame,
signature, root-cause line and, for configuration/params faults, the setting to change. The report is
turned into the same `InstanceReport` the controller store produces and judged by `verdict.judge`; the
breaker's view (`breaker.verdict_failure`) is checked too: only image-class evidence counts against an image.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.domain.breaker import verdict_failure
from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent
from reconciler.domain.verdict import judge
from reconciler.domain.verdicts import BLAMES, VERDICTS
from tests.scenarios import DIGEST, SPEC, T0

TAILS = Path(__file__).resolve().parents[1] / "fixtures" / "tails"
CASES = sorted(TAILS.glob("*.yaml"))
POOL = next(p for p in SPEC.pools if p.name == "rtx4090")


def _lines(text: str | None) -> tuple[str, ...]:
    return tuple(text.split("\n")) if text else ()


def report_of(case: dict[str, Any]) -> tuple[InstanceReport, Any, int]:
    """The InstanceReport a worker sending this tail produces, the judging time, and prior params strikes."""
    rep = case["report"]
    tail, ring = _lines(rep.get("tail")), _lines(rep.get("ring"))
    phase = rep.get("phase")
    events = [PhaseEvent("register", "done", T0 + timedelta(seconds=30)),
              PhaseEvent("params", "started", T0 + timedelta(minutes=1))]
    if phase != "params":
        events += [PhaseEvent("params", "done", T0 + timedelta(minutes=20)),
                   PhaseEvent("daemon", "started", T0 + timedelta(minutes=21))]
        if phase != "daemon":
            events += [PhaseEvent("daemon", "done", T0 + timedelta(minutes=22)),
                       PhaseEvent("benchmark", "started", T0 + timedelta(minutes=25))]
    if "progress" in rep:
        events.append(PhaseEvent("benchmark", "progress", T0 + timedelta(minutes=40), details=rep["progress"]))
    if phase:
        events.append(PhaseEvent(phase, "failed", T0 + timedelta(minutes=45), exit_code=rep.get("exit_code"),
                                 message=rep.get("message"), log_tail=tail if "result" not in rep else ring or tail))
    result = None
    if "result" in rep:
        r = rep["result"]
        at = T0 + timedelta(minutes=45)
        started = at - timedelta(minutes=r["started_min_before"]) if "started_min_before" in r else None
        result = BenchmarkResult(outcome=r["outcome"], at=at, requested=r["requested"], completed=r["completed"],
                                 failed=r["failed"], started_at=started,
                                 exit_code=r.get("exit_code", rep.get("exit_code")),
                                 proofs_per_hour=r.get("proofs_per_hour"), seconds_per_proof=r.get("seconds_per_proof"),
                                 concurrency=r.get("concurrency"), image_digest=DIGEST, log_tail=tail)
    report = InstanceReport(instance_id=f"rtx4090-0-{case['case'][:20]}", registered_at=T0, pool="rtx4090",
                            slot="rtx4090-0", machine_id="40213", host_id="7781", gpu_name="RTX 4090",
                            image_digest=DIGEST, events=tuple(events), result=result,
                            log_tail=ring or (tail if result is None else ()))
    now = T0 + timedelta(hours=4) if rep.get("deadline_passed") else T0 + timedelta(minutes=50)
    return report, now, int(rep.get("prior_params_failures", 0))


def test_the_corpus_is_large_enough_and_every_case_cites_its_sources() -> None:
    assert len(CASES) >= 40
    names = set()
    for path in CASES:
        case = yaml.safe_load(path.read_text())
        assert case["case"] == path.stem and case["case"] not in names
        names.add(case["case"])
        assert case["sources"] and all(isinstance(s, str) and len(s) > 10 for s in case["sources"]), path.name
        assert case["expect"]["blame"] in BLAMES and case["expect"]["verdict"] in VERDICTS, path.name


def test_the_corpus_covers_every_blame_class_and_failure_family() -> None:
    cases = [yaml.safe_load(p.read_text()) for p in CASES]
    blames = {c["expect"]["blame"] for c in cases}
    assert blames >= {"machine", "image", "network", "params", "configuration", "marketplace", "unknown", "none"}
    signatures = {c["expect"]["signature"] for c in cases}
    for needed in ("cuda-out-of-memory", "cuda-no-device", "cuda-no-kernel-image", "cuda-unsupported-ptx",
                   "cuda-illegal-address", "gpu-xid-application", "gpu-fell-off-bus", "gpu-ecc", "gpu-gsp-timeout",
                   "host-out-of-memory", "process-killed", "srs-memory-budget", "disk-full", "params-not-found",
                   "dns-failure", "proof-self-check-intermittent", "proof-self-check", "daemon-connection-refused"):
        assert needed in signatures, needed


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_tail(path: Path) -> None:
    case = yaml.safe_load(path.read_text())
    expect = case["expect"]
    report, now, prior = report_of(case)
    v = judge(report, POOL, now, desired_image_digest=DIGEST, prior_params_failures=prior)
    assert v is not None
    got = (v.verdict, v.blame, v.signature, v.marks_bad)
    assert got == (expect["verdict"], expect["blame"], expect["signature"], expect["marks_bad"]), v.reason
    # The root-cause line: verdict, phase, exit code, proofs done/asked, then the most specific line.
    assert v.reason.startswith(f"{v.verdict}: ") or v.reason.startswith("timeout after "), v.reason
    assert f"exit {'?' if v.exit_code is None else v.exit_code}, " in v.reason
    assert f"{v.evidence.get('proofs', {}).get('completed', 0)}/" in v.reason or "proofs" in v.reason
    assert expect["root_cause"] in v.reason, v.reason
    if "root_cause_has" in expect:
        assert expect["root_cause_has"] in v.reason, v.reason
    if "root_cause_not" in expect:
        assert expect["root_cause_not"] not in v.reason, v.reason
    for noise in ("CUZK_TIMING", "[#26a862", "\x1b["):
        assert noise not in v.reason, v.reason
    if expect.get("setting"):
        assert v.setting is not None and expect["setting"] in v.setting, v.setting
        assert f"change {v.setting}" in v.root_cause()
    if expect.get("not_slow"):
        assert v.verdict != "below-min-rate" and "slow" not in v.reason
    counts = verdict_failure(v) is not None
    assert counts == expect["counts_against_image"], (v.blame, v.signature)


def test_the_corpus_covers_every_class_of_the_issue_23_tables() -> None:
    """A whole real tail for each class the tables gained (CUDA codes by class, Xids by class, pinned host
    memory, loader and missing binaries, TLS by cause, mirror HTTP statuses, deaths by signal)."""
    signatures = {yaml.safe_load(p.read_text())["expect"]["signature"] for p in CASES}
    for needed in ("cuda-gpu-fault", "cuda-software-error", "gpu-xid-hardware", "gpu-xid-ambiguous",
                   "gpu-xid-application", "pinned-host-memory", "loader-version-missing", "binary-not-installed",
                   "shared-library-missing", "tls-clock-behind", "tls-unknown-authority", "tls-certificate-expired",
                   "tls-hostname-mismatch", "params-mirror-denied", "params-mirror-unavailable", "params-not-found",
                   "cpu-instruction-set-missing", "bus-error", "host-memory-hardware-error", "process-aborted",
                   "host-out-of-memory", "process-sigkill", "nvidia-driver-mismatch", "nvidia-driver-unreachable",
                   "nvidia-no-device"):
        assert needed in signatures, needed


def test_the_corpus_covers_every_class_of_the_issue_29_tables() -> None:
    """A whole tail from a real public string for each table class issue 29 built whole (aria2c's and curl's codes,
    errnos in Rust's, Python's and aria2c's forms, signals, the worker's own exit codes) and for a generic-only
    failure (unknown, not recognised)."""
    cases = {p.stem: yaml.safe_load(p.read_text()) for p in CASES}
    signatures = {c["expect"]["signature"] for c in cases.values()}
    for needed in ("disk-full", "params-dir-error", "download-failed-network", "network-unreachable",
                   "container-limit", "os-error-ambiguous:EAGAIN", "fatal-signal", "params-source-missing",
                   "host-os-error", "params-not-found", "process-sigkill", "command-not-found"):
        assert needed in signatures, needed
    generic = [c for c in cases.values() if "not recognised" in c["expect"].get("root_cause_has", "")]
    assert generic and all(c["expect"]["blame"] == "unknown" for c in generic)
