"""Judge one instance: what the worker reported + its pool spec + now -> a verdict with blame and evidence.

The pure heart of the reconcile pass (`loop.decide` calls `judge` per unjudged report, then lets
`breaker.py` hold machine-blamed verdicts). No I/O, no clock: `now` is an argument.

Verdicts (the seed's lesson: "0 proofs/hour" may be the machine OR our image):
- ok / below-min-rate: the benchmark completed with a throughput line; rate vs the pool's min rate.
  Below the rate is the machine's fault (evidence: proofs/hour and s/proof).
- benchmark-error: the benchmark or its daemon exited non-zero, or printed no throughput. Blame by the
  log tail's signature (signatures.py); no signature -> "unknown", which never marks a machine bad.
- params-failed: the params fetch failed, or had not finished by the deadline. Blame "network" unless
  the tail shows a machine or image signature. Policy: a machine's network gets one strike - the first
  network-blamed params failure is recorded but does not mark the machine bad (mirrors and CDNs have bad
  minutes); the second one on the same machine (PARAMS_FAILURES_BEFORE_BAD) does.
- timeout: no result by the deadline = benchmark start (registration if it never started) +
  pool.benchmark.timeout_minutes, or the worker itself reported outcome timeout. Partial proofs count:
  blame is the tail's signature if any, else "machine" if it proved some but below the min rate, else
  "unknown" (zero proofs and no signature looks like a hang, which may be ours).
- stale-image: the instance ran another digest than the desired one. Applies to every failing verdict
  (never the machine's fault); a passing benchmark on an older image is still proof the machine is good.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from reconciler.domain.observations import InstanceReport, PhaseEvent, format_time
from reconciler.domain.records import BenchmarkEntry
from reconciler.domain.redact import redact_line, redact_lines
from reconciler.domain.signatures import SignatureMatch, classify
from reconciler.domain.spec import PoolSpec

#: Log lines kept as evidence in a record (the store keeps more; git history should stay readable).
EVIDENCE_LOG_LINES = 30
#: Network-blamed params failures on one machine (since its last passing benchmark) that mark it bad.
PARAMS_FAILURES_BEFORE_BAD = 2

HELD_BY_CIRCUIT_BREAKER = "circuit-breaker"
HELD_BY_KILL_BUDGET = "kill-budget"

#: Failed phases that end the benchmark attempt by themselves. A failed tunnel (Lotus API, not needed by
#: the standalone benchmark) or report/serve step does not: the result or the deadline decides.
_VERDICT_PHASES = {"params": "params-failed", "daemon": "benchmark-error", "benchmark": "benchmark-error"}


@dataclass(frozen=True)
class Verdict:
    """The judgement of one instance, with everything a human needs to check it."""

    instance_id: str
    verdict: str
    blame: str
    marks_bad: bool
    reason: str
    at: datetime
    pool: str | None
    machine_id: str | None
    host_id: str | None = None
    gpu_name: str | None = None
    contract_id: str | None = None
    image_digest: str | None = None
    signature: str | None = None
    phase: str | None = None
    exit_code: int | None = None
    proofs_per_hour: float | None = None
    seconds_per_proof: float | None = None
    min_rate_proofs_per_hour: float | None = None
    held_by: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_failure(self) -> bool:
        return self.verdict != "ok"

    def root_cause(self) -> str:
        """One line for status and commit bodies, e.g. `benchmark-error exit 1: ... (blame: image)`."""
        held = f", held by {self.held_by}" if self.held_by else ""
        return f"{self.reason} (blame: {self.blame}{held})"

    def held(self, by: str) -> Verdict:
        """This verdict, not marking the machine bad because a breaker holds it.

        The circuit breaker re-blames the image (the same failure on many machines is the image's);
        the kill budget keeps the blame (the machine may well be bad, we just may not kill more now)."""
        blame = "image" if by == HELD_BY_CIRCUIT_BREAKER else self.blame
        return replace(self, marks_bad=False, held_by=by, blame=blame)

    def to_entry(self) -> BenchmarkEntry:
        return BenchmarkEntry(
            instance_id=self.instance_id, at=format_time(self.at), verdict=self.verdict, blame=self.blame,
            marks_bad=self.marks_bad, reason=self.reason, contract_id=self.contract_id, pool=self.pool,
            image_digest=self.image_digest, signature=self.signature, proofs_per_hour=self.proofs_per_hour,
            seconds_per_proof=self.seconds_per_proof, min_rate_proofs_per_hour=self.min_rate_proofs_per_hour,
            held_by=self.held_by, evidence=self.evidence)


def deadline(report: InstanceReport, pool: PoolSpec) -> datetime:
    started = report.first("benchmark", "started")
    return (started.at if started else report.registered_at) + timedelta(minutes=pool.benchmark.timeout_minutes)


def judge(report: InstanceReport, pool: PoolSpec, now: datetime, *, desired_image_digest: str | None = None,
          prior_params_failures: int = 0) -> Verdict | None:
    """The verdict for `report`, or None while the attempt is still running (or ended without evidence).

    `prior_params_failures`: network-blamed params failures already on this machine's record since its
    last passing benchmark (the params policy needs the machine's history; the caller has it)."""
    base = _judge_outcome(report, pool, now, prior_params_failures)
    if base is None:
        return None
    digest = report.image_digest or (report.result.image_digest if report.result else None)
    if desired_image_digest and digest and digest != desired_image_digest and base.is_failure:
        return replace(base, verdict="stale-image", blame="image", marks_bad=False, signature=None,
                       reason=f"stale-image {_short_digest(digest)} (desired {_short_digest(desired_image_digest)}):"
                              f" {base.reason}")
    return base


def _judge_outcome(report: InstanceReport, pool: PoolSpec, now: datetime,
                   prior_params_failures: int) -> Verdict | None:
    result = report.result
    failure = next((e for e in report.events if e.status == "failed" and e.phase in _VERDICT_PHASES), None)
    if result is not None:
        tail = result.log_tail or (failure.log_tail if failure else ()) or report.log_tail
        exit_code = result.exit_code if result.exit_code is not None else (failure.exit_code if failure else None)
        if result.outcome == "completed":
            rate = result.proofs_per_hour
            if rate is None and result.seconds_per_proof:
                rate = 3600.0 / result.seconds_per_proof
            if rate is not None and result.completed > 0:
                return _rated(report, pool, now, rate, result.seconds_per_proof, tail, exit_code)
            why = "no throughput line" if rate is None else f"0 of {result.requested} proofs completed"
            return _errored(report, pool, now, "benchmark-error", "benchmark", exit_code, tail, None,
                            known_cause=why)
        if result.outcome == "timeout":
            started = result.started_at or _started_at(report)
            return _timed_out(report, pool, now, result.completed, result.requested, started, result.at,
                              result.proofs_per_hour, tail, exit_code)
        return _errored(report, pool, now, "benchmark-error", "benchmark", exit_code, tail,
                        failure.message if failure and failure.message else None)
    if failure is not None:
        return _errored(report, pool, now, _VERDICT_PHASES[failure.phase], failure.phase, failure.exit_code,
                        failure.log_tail or report.log_tail, failure.message, prior_params_failures)
    due = deadline(report, pool)
    if now < due or (report.destroyed_at is not None and report.destroyed_at < due):
        # Still running; or destroyed before its deadline (by us or the market): not evidence of anything.
        return None
    if report.first("params", "done") is None:
        waited = (due - report.registered_at).total_seconds() / 60
        return _errored(report, pool, now, "params-failed", "params", None, report.log_tail, None,
                        prior_params_failures,
                        known_cause=f"params not fetched {waited:.0f} min after registration")
    progress = _last_progress(report)
    return _timed_out(report, pool, now, progress[0], progress[1] or pool.benchmark.proofs, _started_at(report),
                      due, None, report.log_tail, None)


def _rated(report: InstanceReport, pool: PoolSpec, now: datetime, rate: float, spp: float | None,
           tail: Sequence[str], exit_code: int | None) -> Verdict:
    min_rate = pool.min_rate_proofs_per_hour
    spp = spp if spp is not None else (3600.0 / rate if rate > 0 else None)
    per = f" ({spp:.1f} s/proof)" if spp is not None else ""
    if rate >= min_rate:
        verdict, blame, bad = "ok", "none", False
        reason = f"ok {rate:.1f}/h >= {min_rate:g}/h{per}"
    else:
        verdict, blame, bad = "below-min-rate", "machine", True
        reason = f"below-min-rate {rate:.1f}/h < {min_rate:g}/h{per}"
    return _verdict(report, pool, now, verdict=verdict, blame=blame, marks_bad=bad, reason=reason,
                    phase="benchmark", exit_code=exit_code, tail=tail, match=None, rate=rate, spp=spp)


def _errored(report: InstanceReport, pool: PoolSpec, now: datetime, verdict: str, phase: str,
             exit_code: int | None, tail: Sequence[str], message: str | None,
             prior_params_failures: int = 0, *, known_cause: str | None = None) -> Verdict:
    """`known_cause`: what we established ourselves (beats the log's last line); `message`: the worker's own
    summary (used only when the log says nothing)."""
    match = classify(tail) or (classify(report.log_tail) if tail is not report.log_tail else None)
    if match is not None:
        blame, cause = match.blame, match.line
    else:
        blame = "network" if verdict == "params-failed" else "unknown"
        cause = known_cause or _last_line(tail) or message or "no log lines"
    cause = _clip(redact_line(cause))
    if blame == "network" and verdict == "params-failed":
        strike = prior_params_failures + 1
        marks_bad = strike >= PARAMS_FAILURES_BEFORE_BAD
        cause += f" [network strike {strike} of {PARAMS_FAILURES_BEFORE_BAD}]"
    else:
        # A network signature during the benchmark itself (which needs no network) is not a strike.
        marks_bad = blame == "machine"
    code = f" exit {exit_code}" if exit_code is not None else ""
    signature = match.name if match else f"{verdict}-unrecognized" + (f"-exit-{exit_code}" if exit_code else "")
    return _verdict(report, pool, now, verdict=verdict, blame=blame, marks_bad=marks_bad,
                    reason=f"{verdict}{code}: {cause}", phase=phase, exit_code=exit_code, tail=tail,
                    match=match, signature=signature)


def _timed_out(report: InstanceReport, pool: PoolSpec, now: datetime, completed: int, requested: int,
               started: datetime | None, ended: datetime, rate: float | None, tail: Sequence[str],
               exit_code: int | None) -> Verdict:
    min_rate = pool.min_rate_proofs_per_hour
    if rate is None and started is not None and ended > started:
        rate = completed * 3600.0 / (ended - started).total_seconds()
    match = classify(tail) or classify(report.log_tail)
    if match is not None:
        blame = match.blame
    elif completed > 0 and rate is not None and rate < min_rate:
        blame = "machine"
    else:
        blame = "unknown"
    partial = f" ({rate:.1f}/h partial, min {min_rate:g}/h)" if rate is not None else ""
    cause = f": {_clip(redact_line(match.line))}" if match else ""
    reason = (f"timeout after {pool.benchmark.timeout_minutes:g} min: {completed}/{requested} proofs"
              f"{partial}{cause}")
    return _verdict(report, pool, now, verdict="timeout", blame=blame, marks_bad=blame == "machine",
                    reason=reason, phase="benchmark", exit_code=exit_code, tail=tail, match=match, rate=rate,
                    signature=match.name if match else "timeout", extra={"completed": completed,
                                                                         "requested": requested})


def _verdict(report: InstanceReport, pool: PoolSpec, now: datetime, *, verdict: str, blame: str, marks_bad: bool,
             reason: str, phase: str, exit_code: int | None, tail: Sequence[str], match: SignatureMatch | None,
             rate: float | None = None, spp: float | None = None, signature: str | None = None,
             extra: Mapping[str, Any] | None = None) -> Verdict:
    evidence: dict[str, Any] = {
        "phase": phase,
        "exit_code": exit_code,
        "proofs_per_hour": _round(rate),
        "seconds_per_proof": _round(spp),
        "gpu_name": report.gpu_name,
        "host_id": report.host_id,
        "machine_id": report.machine_id,
        "instance_id": report.instance_id,
        "contract_id": report.contract_id,
        "image_digest": report.image_digest,
        "phases": {name: format_time(at) for name, at in report.phase_times().items()},
    }
    if report.result is not None:
        evidence["proofs"] = {"requested": report.result.requested, "completed": report.result.completed,
                              "failed": report.result.failed}
    if extra:
        evidence.update(extra)
    if match is not None:
        evidence["signature"] = {"name": match.name, "blame": match.blame, "line": redact_line(match.line),
                                 "means": match.signature.description}
    evidence["log_tail"] = redact_lines(list(tail)[-EVIDENCE_LOG_LINES:])
    evidence = {k: v for k, v in evidence.items() if v is not None}
    return Verdict(
        instance_id=report.instance_id, verdict=verdict, blame=blame, marks_bad=marks_bad, reason=reason, at=now,
        pool=pool.name, machine_id=report.machine_id, host_id=report.host_id, gpu_name=report.gpu_name,
        contract_id=report.contract_id, image_digest=report.image_digest, signature=signature,
        phase=phase, exit_code=exit_code, proofs_per_hour=_round(rate), seconds_per_proof=_round(spp),
        min_rate_proofs_per_hour=pool.min_rate_proofs_per_hour, evidence=evidence)


def _started_at(report: InstanceReport) -> datetime | None:
    started = report.first("benchmark", "started")
    return started.at if started else None


def _last_progress(report: InstanceReport) -> tuple[int, int | None]:
    """(completed, requested) from the newest benchmark progress event that carries them."""
    events: list[PhaseEvent] = [e for e in report.events if e.phase == "benchmark" and "completed" in e.details]
    if not events:
        return 0, None
    details = events[-1].details
    completed = details.get("completed")
    requested = details.get("requested")
    return (completed if isinstance(completed, int) else 0,
            requested if isinstance(requested, int) else None)


def _last_line(lines: Sequence[str]) -> str | None:
    return next((line.strip() for line in reversed(lines) if line.strip()), None)


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _short_digest(digest: str) -> str:
    return digest[:19] if digest.startswith("sha256:") else digest[:12]
