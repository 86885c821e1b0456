"""Judge one instance: what the worker reported + its pool spec + now -> a verdict with blame and evidence.

The pure heart of the reconcile pass (`judging.decide` calls `judge` per unjudged report, then lets
`breaker.py` hold machine-blamed verdicts). No I/O, no clock: `now` is an argument. What each verdict kind
and blame class means lives in the registry (`verdicts.py`); which log line explains a failure in
`signatures.py`.

Judged from proof results, not exit codes (cuzk-bench exits 0 with FAILED proofs):
- ok / below-min-rate: every proof COMPLETED and a rate (which counts completed proofs only) vs the pool's
  min rate. Below it is the machine's fault. A benchmark with 0 completed proofs is never "slow".
- benchmark-error: the benchmark or its daemon exited non-zero, printed no throughput, or any proof was
  not COMPLETED. Blame by the highest-priority signature over the WHOLE evidence: the result's tail, the
  failing phase's tail, the instance's log ring (which carries the daemon's lines) and the daemon log.
  Proofs failing cuzk's self-check: some of them (others verify) -> a flaky GPU, machine; all of them ->
  our inputs (c1.json vs --sector-num/--miner-id), image. No signature -> "unknown" (never marks bad).
- params-failed: the params fetch failed, or had not finished by the deadline. Network blame is a strike:
  the first network-blamed params failure is recorded without marking the machine bad (mirrors and CDNs
  have bad minutes); the second on the same machine (PARAMS_FAILURES_BEFORE_BAD) does. A mirror 404 is
  `params` blame and a full disk `configuration`: never a strike.
- timeout: no result by the deadline = benchmark start (registration if it never started) +
  pool.benchmark.timeout_minutes, or the worker itself reported outcome timeout. Partial proofs count.
- stale-image: the instance ran another digest than the desired one (never the machine's fault).

Every verdict carries a root-cause line (issue 14): phase, exit code, proofs done/asked and the most
specific error line of the whole tail (never a progress, timing or tunnel line unless the tunnel is the
failing phase). It starts the verdict's `reason`, which status, the commit subject and `fleet why` show first.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from reconciler.domain.observations import BenchmarkResult, InstanceReport, PhaseEvent, ProofResult, format_time
from reconciler.domain.quick_init import quick_init
from reconciler.domain.records import BenchmarkEntry
from reconciler.domain.redact import redact_line, redact_lines
from reconciler.domain.retests import HELD_FOR_RETEST as HELD_FOR_RETEST  # re-exported: a held_by like the others
from reconciler.domain.signatures import SignatureMatch, classify, clean_line, error_line, read_tail
from reconciler.domain.spec import PoolSpec
from reconciler.domain.verdicts import blame_class

#: Log lines kept as evidence in a record (the store keeps more; git history should stay readable).
EVIDENCE_LOG_LINES = 30
#: Daemon log lines kept as evidence (filtered: no timing noise, no colour).
EVIDENCE_DAEMON_LINES = 15
#: Network-blamed params failures on one machine (since its last passing benchmark) that mark it bad.
PARAMS_FAILURES_BEFORE_BAD = 2
#: Longest error line shown in a root cause (chains are shortened to head ... last cause).
ROOT_CAUSE_CHARS = 240

HELD_BY_CIRCUIT_BREAKER = "circuit-breaker"
HELD_BY_KILL_BUDGET = "kill-budget"

SIGNATURE_INTERMITTENT_SELF_CHECK = "proof-self-check-intermittent"
#: Part of every signature `unrecognized_signature` makes.
UNRECOGNIZED = "-unrecognized-"
#: How a failure that no specific signature explains starts its cause: the best line follows (issue 29 item 2).
NOT_RECOGNISED = "not recognised"

#: Failed phases that end the benchmark attempt by themselves. A failed tunnel (Lotus API, not needed by
#: the standalone benchmark) or report/serve step does not: the result or the deadline decides.
_VERDICT_PHASES = {"params": "params-failed", "daemon": "benchmark-error", "warmup": "benchmark-error",
                   "benchmark": "benchmark-error"}

#: `  [3/10] FAILED — 41.3s (prove=0 ms, queue=12 ms)` (cuzk-bench main.rs:561-569 / 597-605).
_PROOF_LINE = re.compile(r"^\s*\[(\d+)/(\d+)\]\s+(COMPLETED|FAILED|CANCELLED|TIMEOUT|UNKNOWN)\b(?:\s+\S+\s+([\d.]+)s)?")


@quick_init
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
    #: The spec setting a configuration/params verdict asks to change (pool name filled in).
    setting: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_failure(self) -> bool:
        return self.verdict != "ok"

    def root_cause(self) -> str:
        """One line for status, commit messages and `fleet why`: the reason, then who must act."""
        return root_cause_text(self.reason, self.blame, self.held_by, self.setting)

    def held(self, by: str) -> Verdict:
        """This verdict, not marking the machine bad because a breaker holds it.

        The circuit breaker re-blames the image (the same failure on many machines is the image's), but keeps
        a configuration blame (the setting it names is still what to change); the kill budget keeps the blame
        (the machine may well be bad, we just may not kill more now)."""
        blame = "image" if by == HELD_BY_CIRCUIT_BREAKER and self.blame != "configuration" else self.blame
        # What the judge said before the guard: a replay under other guards (`fleet plan --what-if`) starts there.
        unguarded = self.evidence.get("unguarded") or {"blame": self.blame, "marks_bad": self.marks_bad}
        return replace(self, marks_bad=False, held_by=by, blame=blame,
                       evidence={**self.evidence, "unguarded": unguarded})

    def to_entry(self, stage: str | None = None) -> BenchmarkEntry:
        """The record entry of this verdict; `stage`: the entry's stage (None: not said, as older records)."""
        return BenchmarkEntry(
            instance_id=self.instance_id, at=format_time(self.at), verdict=self.verdict, blame=self.blame,
            marks_bad=self.marks_bad, reason=self.reason, contract_id=self.contract_id, pool=self.pool,
            image_digest=self.image_digest, signature=self.signature, proofs_per_hour=self.proofs_per_hour,
            seconds_per_proof=self.seconds_per_proof, min_rate_proofs_per_hour=self.min_rate_proofs_per_hour,
            held_by=self.held_by, evidence=self.evidence, stage=stage)


def root_cause_text(reason: str, blame: str, held_by: str | None = None, setting: str | None = None) -> str:
    """`<reason> (blame: <blame>[; change <setting>][, held by <guard>])`: shared by verdicts and records."""
    change = f"; change {setting}" if setting else ""
    held = ", retest pending" if held_by == HELD_FOR_RETEST else f", held by {held_by}" if held_by else ""
    return f"{reason} (blame: {blame}{change}{held})"


def deadline(report: InstanceReport, pool: PoolSpec) -> datetime:
    started = report.first("benchmark", "started")
    return (started.at if started else report.registered_at) + timedelta(minutes=pool.benchmark.timeout_minutes)


def proof_results(result: BenchmarkResult) -> tuple[ProofResult, ...]:
    """Per-proof labels: the result's own (protocol additions) or parsed from cuzk-bench's output lines."""
    if result.proofs:
        return result.proofs
    out: dict[int, ProofResult] = {}
    for raw in result.log_tail:
        m = _PROOF_LINE.match(clean_line(raw)[1])
        if m:
            out[int(m.group(1))] = ProofResult(int(m.group(1)), m.group(3),
                                               float(m.group(4)) if m.group(4) else None)
    return tuple(out[i] for i in sorted(out))


def daemon_lines(report: InstanceReport) -> tuple[str, ...]:
    """The daemon's log: shipped with the result (protocol additions), else its lines in the log ring."""
    if report.result is not None and report.result.daemon_log:
        return report.result.daemon_log
    return tuple(line for line in report.log_tail if clean_line(line)[0] == "cuzk-daemon")


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
        return replace(base, verdict="stale-image", blame="image", marks_bad=False, signature=None, setting=None,
                       reason=f"stale-image {_short_digest(digest)} (desired {_short_digest(desired_image_digest)}):"
                              f" {base.reason}")
    return base


@quick_init
@dataclass(frozen=True)
class _Attempt:
    """What the judge knows about one attempt, gathered once."""

    phase: str
    exit_code: int | None
    completed: int
    requested: int
    tail: tuple[str, ...]        # the tail of the failing step (result or failed event), kept as evidence
    evidence: tuple[str, ...]    # every line that may explain it: tail + ring (from the phase on) + daemon log
    include_tunnel: bool = False


def _judge_outcome(report: InstanceReport, pool: PoolSpec, now: datetime,
                   prior_params_failures: int) -> Verdict | None:
    result = report.result
    failure = next((e for e in report.events if e.status == "failed" and e.phase in _VERDICT_PHASES), None)
    requested = result.requested if result is not None else pool.benchmark.proofs
    if result is not None:
        proofs = proof_results(result)
        tail = result.log_tail or (failure.log_tail if failure else ()) or report.log_tail
        exit_code = result.exit_code if result.exit_code is not None else (failure.exit_code if failure else None)
        completed = result.completed
        if proofs and not result.completed:
            completed = sum(1 for p in proofs if p.label == "COMPLETED")
        failed_proofs = [p for p in proofs if p.label != "COMPLETED"]
        failed = max(result.failed, len(failed_proofs))
        # The warm-up proof runs a batch too and leaves a result: its failure is still the warm-up's.
        phase = "warmup" if failure is not None and failure.phase == "warmup" else "benchmark"
        attempt = _attempt(report, phase, exit_code, completed, requested or len(proofs), tail, failure)
        if result.outcome == "completed":
            rate = result.proofs_per_hour
            if rate is None and result.seconds_per_proof:
                rate = 3600.0 / result.seconds_per_proof
            if failed > 0:
                return _proofs_failed(report, pool, now, attempt, failed, proofs, rate, result.seconds_per_proof)
            if rate is not None and completed > 0:
                return _rated(report, pool, now, attempt, rate, result.seconds_per_proof)
            why = "no throughput line" if rate is None or completed else f"0 of {attempt.requested} proofs completed"
            return _errored(report, pool, now, "benchmark-error", attempt, known_cause=why)
        if result.outcome == "timeout":
            started = result.started_at or _started_at(report)
            return _timed_out(report, pool, now, attempt, started, result.at, result.proofs_per_hour)
        return _errored(report, pool, now, "benchmark-error", attempt,
                        message=failure.message if failure and failure.message else None)
    if failure is not None:
        progress = _last_progress(report)
        attempt = _attempt(report, failure.phase, failure.exit_code, progress[0], progress[1] or requested,
                           failure.log_tail or report.log_tail, failure)
        return _errored(report, pool, now, _VERDICT_PHASES[failure.phase], attempt, message=failure.message,
                        prior_params_failures=prior_params_failures)
    due = deadline(report, pool)
    if now < due or (report.destroyed_at is not None and report.destroyed_at < due):
        # Still running; or destroyed before its deadline (by us or the market): not evidence of anything.
        return None
    if report.first("params", "done") is None:
        waited = (due - report.registered_at).total_seconds() / 60
        attempt = _attempt(report, "params", None, 0, requested, report.log_tail, None)
        return _errored(report, pool, now, "params-failed", attempt, prior_params_failures=prior_params_failures,
                        known_cause=f"params not fetched {waited:.0f} min after registration")
    progress = _last_progress(report)
    attempt = _attempt(report, "benchmark", None, progress[0], progress[1] or requested, report.log_tail, None)
    return _timed_out(report, pool, now, attempt, _started_at(report), due, None, result_lost=True)


def _attempt(report: InstanceReport, phase: str, exit_code: int | None, completed: int, requested: int,
             tail: Sequence[str], failure: PhaseEvent | None) -> _Attempt:
    ring = _ring_since_phase(report, phase)
    extra = tuple(failure.log_tail) if failure is not None and tuple(failure.log_tail) != tuple(tail) else ()
    daemon = report.result.daemon_log if report.result is not None else ()
    # The daemon's reason for each failed proof (protocol additions): cuzk-bench never prints it.
    reasons = tuple(p.reason for p in report.result.proofs if p.reason) if report.result is not None else ()
    # The register body's GPU probe first: nvidia-smi failing at boot explains whatever failed later.
    evidence = (*report.gpu_probe, *ring, *extra, *tail, *daemon, *reasons)
    return _Attempt(phase, exit_code, completed, requested, tuple(tail), evidence,
                    include_tunnel=phase == "tunnel")


#: The worker's line when it starts the daemon (worker-image/entrypoint.sh: `fleet: starting $DAEMON_BIN --config
#: ...`, the binary's full path, `cuzk-daemon` or curio's `cuzk`): the benchmark's part of the ring.
_DAEMON_START = re.compile(r"\bfleet: starting (?:\S*/)?cuzk(?:-daemon)?\b")
#: Lines of the params fetch (aria2c, curl, the worker's params lines) before the daemon started.
_FETCH_LINE = re.compile(r"\b(?:aria2c|curl|errorCode=|Download|params: |manifest|checksum|resolve)|^\s*-> \[",
                         re.IGNORECASE)


#: The worker's notes while it waits for the daemon to answer (entrypoint.sh): recovered once it answered.
_DAEMON_WAIT = re.compile(r"\bfleet: waiting for cuzk-daemon to answer\b")


def _ring_since_phase(report: InstanceReport, phase: str) -> tuple[str, ...]:
    """The instance's log ring (the whole stored ring for an instance judged this pass) as evidence for `phase`:
    for the daemon/benchmark phases, what the params fetch logged before the daemon started is dropped (a DNS
    retry that recovered must not explain a later benchmark failure), and after the daemon phase so are the
    worker's notes while it waited for the daemon to answer (it did answer), while everything else of the
    set-up stays (nvidia-smi at start, kernel lines). By content, not by timestamp: the worker's clock may be
    skewed."""
    lines = report.log_tail
    if phase == "params":
        return lines
    start = next((i for i in range(len(lines) - 1, -1, -1) if _DAEMON_START.search(lines[i])), None)
    if phase in ("warmup", "benchmark"):
        lines = tuple(line for line in lines if not _DAEMON_WAIT.search(line))
        if start is not None:
            start = next((i for i in range(len(lines) - 1, -1, -1) if _DAEMON_START.search(lines[i])), None)
    if start is None:
        return lines
    return (*(line for line in lines[:start] if not _FETCH_LINE.search(line)), *lines[start:])


def _rated(report: InstanceReport, pool: PoolSpec, now: datetime, attempt: _Attempt, rate: float,
           spp: float | None) -> Verdict:
    min_rate = pool.min_rate_proofs_per_hour
    spp = spp if spp is not None else (3600.0 / rate if rate > 0 else None)
    per = f" ({spp:.1f} s/proof)" if spp is not None else ""
    if rate >= min_rate:
        verdict, blame, bad = "ok", "none", False
        line = f"{rate:.1f}/h >= {min_rate:g}/h{per}"
    else:
        verdict, blame, bad = "below-min-rate", "machine", True
        line = f"{rate:.1f}/h < {min_rate:g}/h{per}"
    return _verdict(report, pool, now, verdict=verdict, blame=blame, marks_bad=bad,
                    reason=f"{verdict}: {_where(attempt)}: {line}", attempt=attempt, match=None, rate=rate,
                    spp=spp)


@dataclass(frozen=True)
class _Cause:
    """Why an attempt failed, as far as the evidence says: `match` is the decisive (SPECIFIC) signature, if any;
    without one the blame is `unknown` and `line` is the best line there is (a GENERIC signature's, else the last
    error-like line), shown after NOT_RECOGNISED."""

    match: SignatureMatch | None
    blame: str
    line: str
    generic: SignatureMatch | None = None
    #: The line an unexplained failure's signature is keyed on: as logged (no decoded meaning appended).
    key_line: str = ""

    @property
    def shown(self) -> str:
        return self.line if self.match is not None else f"{NOT_RECOGNISED}: {self.line}"


def _cause(attempt: _Attempt, *fallbacks: str | None, known_cause: str | None = None,
           default: str | None = None) -> _Cause | None:
    """The decisive line of the whole evidence; else the best line there is (a generic line, the last error-like
    line, then `fallbacks`, `known_cause`, `default`), blame unknown: a generic line never decides blame. None when
    nothing at all explains it."""
    match = classify(attempt.evidence, include_tunnel=attempt.include_tunnel)
    if match is not None and match.decisive:
        return _Cause(match, match.blame, match.text())
    raw = match.line if match is not None else error_line(attempt.evidence, include_tunnel=attempt.include_tunnel)
    raw = raw or next((f for f in fallbacks if f), None) or known_cause or default
    if raw is None:
        return None
    line = match.text() if match is not None else raw
    if known_cause and raw != known_cause:
        line, raw = f"{known_cause}; last error: {line}", f"{known_cause}; last error: {raw}"
    return _Cause(None, "unknown", line, match, raw)


def _proofs_failed(report: InstanceReport, pool: PoolSpec, now: datetime, attempt: _Attempt, failed: int,
                   proofs: Sequence[ProofResult], rate: float | None, spp: float | None) -> Verdict:
    """Some proofs were not COMPLETED although cuzk-bench exited normally: judged by why they failed."""
    labels = sorted({p.label for p in proofs if p.label != "COMPLETED"}) or ["FAILED"]
    what = f"{failed} {'/'.join(labels)}"
    why = _cause(attempt, default=f"{what}; no reason in the daemon log")
    assert why is not None  # a default was given
    match, blame, cause = why.match, why.blame, why.shown
    signature = match.key if match else \
        unrecognized_signature("benchmark-error", attempt.phase, attempt.exit_code, why.key_line)
    if match is not None and match.name == "proof-self-check" and attempt.completed > 0:
        # Some proofs verify and some do not on the same inputs: the GPU computes wrong results at times.
        blame, signature = "machine", SIGNATURE_INTERMITTENT_SELF_CHECK
    return _failed_verdict(report, pool, now, "benchmark-error", attempt, blame, match, signature,
                           f"{_clip(redact_line(cause))} [{what}]", rate=rate if attempt.completed else None,
                           spp=spp if attempt.completed else None, unexplained=why)


def _errored(report: InstanceReport, pool: PoolSpec, now: datetime, verdict: str, attempt: _Attempt, *,
             message: str | None = None, prior_params_failures: int = 0, known_cause: str | None = None) -> Verdict:
    """`known_cause`: what we established ourselves; `message`: the worker's own summary (used when the log
    says nothing). Without a specific line the failure is `unknown` in every phase, params included: no
    network strike is counted on a guess (issue 29 item 2)."""
    why = _cause(attempt, message, known_cause=known_cause, default="no log lines")
    assert why is not None  # a default was given
    signature = why.match.key if why.match else \
        unrecognized_signature(verdict, attempt.phase, attempt.exit_code, why.key_line)
    return _failed_verdict(report, pool, now, verdict, attempt, why.blame, why.match, signature,
                           _clip(redact_line(why.shown)), prior_params_failures=prior_params_failures,
                           unexplained=why)


def _failed_verdict(report: InstanceReport, pool: PoolSpec, now: datetime, verdict: str, attempt: _Attempt,
                    blame: str, match: SignatureMatch | None, signature: str | None, cause: str, *,
                    prior_params_failures: int = 0, rate: float | None = None, spp: float | None = None,
                    extra: Mapping[str, Any] | None = None, head: str | None = None,
                    unexplained: _Cause | None = None) -> Verdict:
    marks = blame_class(blame).marks_machine
    suffix = ""
    if marks == "strike":
        if verdict == "params-failed":
            strike = prior_params_failures + 1
            marks_bad = strike >= PARAMS_FAILURES_BEFORE_BAD
            suffix = f" [network strike {strike} of {PARAMS_FAILURES_BEFORE_BAD}]"
        else:
            marks_bad = False  # a network line during the benchmark (which needs no network) is not a strike
    else:
        marks_bad = marks == "yes"
    # Image faults can carry advice too (ship a CA bundle, a portable CPU baseline): the signature's setting.
    setting = _setting(match, pool) if blame in ("configuration", "params", "image") else None
    reason = f"{head or verdict}: {_where(attempt)}: {cause}{suffix}"
    if match is None and signature and UNRECOGNIZED in signature:
        line = _clip(redact_line(unexplained.line)) if unexplained is not None else cause
        generic = unexplained.generic if unexplained is not None else None
        extra = {**(extra or {}), "signature": {
            "name": signature, "blame": blame, "line": line, "normalised": normalise_error_line(line),
            "means": f"{NOT_RECOGNISED}: no specific signature explains it"
                     + (f" (the best line is a generic one: {generic.name}, {generic.signature.description})"
                        if generic is not None else "")
                     + "; keyed by phase, exit code and the normalised error line",
            **({"generic": generic.name} if generic is not None else {})}}
    return _verdict(report, pool, now, verdict=verdict, blame=blame, marks_bad=marks_bad, reason=reason,
                    attempt=attempt, match=match, signature=signature, rate=rate, spp=spp, setting=setting,
                    extra=extra)


def _timed_out(report: InstanceReport, pool: PoolSpec, now: datetime, attempt: _Attempt,
               started: datetime | None, ended: datetime, rate: float | None, *, result_lost: bool = False) -> Verdict:
    min_rate = pool.min_rate_proofs_per_hour
    completed, requested = attempt.completed, attempt.requested
    all_done = requested > 0 and completed >= requested
    if rate is None and started is not None and ended > started and not all_done:
        rate = completed * 3600.0 / (ended - started).total_seconds()
    why = _cause(attempt)
    match = why.match if why is not None else None
    unexplained: _Cause | None = None
    if match is not None:
        blame = match.blame
        cause = match.text()
    elif all_done and result_lost:
        blame, cause = "unknown", "every proof reported done, but the result never reached the controller"
    elif completed > 0 and rate is not None and rate < min_rate:
        # A slow machine's partial rate is a measurement of that machine (no error line says otherwise).
        blame, cause = "machine", f"{rate:.1f}/h partial < {min_rate:g}/h"
    else:
        unexplained = why or _Cause(None, "unknown", "no result and no error in the log")
        blame, cause = "unknown", unexplained.shown
    partial = (f" ({rate:.1f}/h partial, min {min_rate:g}/h)"
               if rate is not None and not all_done and "partial" not in cause else "")
    head = f"timeout after {pool.benchmark.timeout_minutes:g} min"
    # A slow machine's partial rate is a measurement of that machine, not an unexplained failure.
    signature = match.key if match else "timeout" if blame == "machine" else \
        unrecognized_signature("timeout", attempt.phase, attempt.exit_code,
                               unexplained.key_line or unexplained.line if unexplained is not None else cause)
    return _failed_verdict(report, pool, now, "timeout", attempt, blame, match,
                           signature, _clip(redact_line(cause)) + partial, rate=rate,
                           extra={"completed": completed, "requested": requested}, head=head,
                           unexplained=unexplained)


_SOURCE_URL = re.compile(r"\b((?:https?|ftp)://[^/\s'\"]+)", re.IGNORECASE)
_CURIO_FETCH = re.compile(r"\bcurio fetch-params\b")


def params_source(lines: Sequence[str]) -> str | None:
    """Where a params fetch fetched from, for the mirror correlation: the scheme and host of the first URL the
    fetch logged (`https://params.example.com`), or `curio fetch-params` (curio's own sources); None when the
    evidence names none (then no mirror is blamed)."""
    for line in lines:
        if (m := _SOURCE_URL.search(line)) is not None:
            scheme, _, host = m.group(1).partition("://")
            return f"{scheme}://{host.rpartition('@')[2]}".lower()  # never a user:password@ in the evidence
        if _CURIO_FETCH.search(line):
            return "curio fetch-params"
    return None


#: What an unexplained failure's signature is made of (`unrecognized_signature`): the variable parts of its
#: error line stripped, so the same failure on another machine, at another time, gets the same signature.
_NORMALISE = (
    (re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d)?(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b"), "<time>"),
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE), "<url>"),
    (re.compile(r"(?<![\w.~])(?:\.{0,2}/)(?:[^\s/:'\"(),\]]+/?)+"), "<path>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE), "<id>"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[[0-9a-f:]*:[0-9a-f:]*\](?::\d+)?", re.IGNORECASE),
     "<addr>"),
    (re.compile(r"\b(?:0x)?(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{6,}\b", re.IGNORECASE), "<id>"),
    (re.compile(r"\d+(?:\.\d+)?"), "N"),
    (re.compile(r"\s+"), " "),
)


def normalise_error_line(line: str) -> str:
    """`line` without what differs between machines and runs: times, URLs, paths, ids, addresses, numbers."""
    text = line
    for pattern, replacement in _NORMALISE:
        text = pattern.sub(replacement, text)
    return text.strip().lower()


def unrecognized_signature(verdict: str, phase: str, exit_code: int | None, line: str) -> str:
    """The signature of a failure no catalogued signature explains: verdict, phase, exit code and a short hash of
    the normalised error line (`<verdict>-unrecognized-<phase>-exit-<code>-<hash8>`). Stable across machines
    and runs, so the circuit breaker can correlate it (issue 23 item 1); the line itself is in the evidence."""
    code = "none" if exit_code is None else str(exit_code)
    key = f"{phase}\n{code}\n{normalise_error_line(line)}"
    return f"{verdict}{UNRECOGNIZED}{phase}-exit-{code}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def _where(attempt: _Attempt) -> str:
    code = "?" if attempt.exit_code is None else str(attempt.exit_code)
    return f"{attempt.phase} exit {code}, {attempt.completed}/{attempt.requested} proofs"


def _setting(match: SignatureMatch | None, pool: PoolSpec) -> str | None:
    if match is None or match.signature.setting is None:
        return None
    return match.signature.setting.replace("pools[]", f"pools[{pool.name}]")


def _verdict(report: InstanceReport, pool: PoolSpec, now: datetime, *, verdict: str, blame: str, marks_bad: bool,
             reason: str, attempt: _Attempt, match: SignatureMatch | None, rate: float | None = None,
             spp: float | None = None, signature: str | None = None, setting: str | None = None,
             extra: Mapping[str, Any] | None = None) -> Verdict:
    evidence: dict[str, Any] = {
        "phase": attempt.phase,
        "exit_code": attempt.exit_code,
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
        evidence["proofs"] = {"requested": report.result.requested, "completed": attempt.completed,
                              "failed": report.result.failed}
        labels = proof_results(report.result)
        if labels:  # each proof's seconds in index order: a replay's early verdict reads them (fleet plan --what-if)
            evidence["proofs"]["seconds"] = [p.seconds for p in labels]
        if report.result.concurrency:
            evidence["proofs"]["concurrency"] = report.result.concurrency
        if labels and any(p.label != "COMPLETED" for p in labels):
            evidence["proofs"]["labels"] = [p.label for p in labels]
            # Why each failed proof failed, from the daemon (protocol additions), once per distinct reason.
            reasons = list(dict.fromkeys(f"{p.label}: {p.reason}" for p in labels if p.reason))
            if reasons:
                evidence["proofs"]["reasons"] = redact_lines(reasons[:5])
    if verdict == "params-failed":
        evidence["params_source"] = params_source(attempt.evidence)
    if report.clock_skew_s is not None:  # phases are on the controller's clock; the worker's differed by this
        evidence["worker_clock_skew_s"] = report.clock_skew_s
    if extra:
        evidence.update(extra)
    if match is not None:
        evidence["signature"] = {"name": signature or match.key, "blame": blame,
                                 "line": redact_line(match.text()), "means": match.signature.description}
    if setting:
        evidence["setting"] = setting
    if verdict != "ok":
        daemon = [ln.text for ln in read_tail(daemon_lines(report)) if not ln.noise][-EVIDENCE_DAEMON_LINES:]
        if daemon:
            evidence["daemon_log"] = redact_lines(daemon)
    evidence["log_tail"] = redact_lines([_plain_line(line) for line in list(attempt.tail)[-EVIDENCE_LOG_LINES:]])
    evidence = {k: v for k, v in evidence.items() if v is not None}
    return Verdict(
        instance_id=report.instance_id, verdict=verdict, blame=blame, marks_bad=marks_bad, reason=reason, at=now,
        pool=pool.name, machine_id=report.machine_id, host_id=report.host_id, gpu_name=report.gpu_name,
        contract_id=report.contract_id, image_digest=report.image_digest, signature=signature,
        phase=attempt.phase, exit_code=attempt.exit_code, proofs_per_hour=_round(rate),
        seconds_per_proof=_round(spp), min_rate_proofs_per_hour=pool.min_rate_proofs_per_hour, setting=setting,
        evidence=evidence)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _plain_line(line: str) -> str:
    return _ANSI.sub("", line)


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


#: Where the cause is named: the clause after the last of these is never cut (issue 23 item 2).
_CAUSE_MARK = re.compile(r"\b(?:cause|error|failed)\s*:", re.IGNORECASE)
#: A run of hex digits long enough to be a hash or an id (a params file's sha256, a container id).
_HEX_RUN = re.compile(r"[0-9a-fA-F]{16,}")
_URL_TOKEN = re.compile(r"([a-z][a-z0-9+.-]*://[^/\s]+)(/\S*)$", re.IGNORECASE)
_TRAILING = re.compile(r"[,;:.)\]'\"]+$")


#: The worker's sync token on its own lines (worker-image/lib/fleet.sh fleet_log_checkpoint): says nothing.
_CHECKPOINT = re.compile(r" \[checkpoint \d+\]")


def _clip(text: str, limit: int = ROOT_CAUSE_CHARS) -> str:
    """One line of about `limit` characters that keeps the cause: long paths, URLs and hex ids are shortened
    inside (`/var/…/v28-…params.part`); a joined chain keeps its head and its last (most specific) cause; a
    single line keeps the clause after its last `cause:` / `error:` / `failed:` whole and shortens what is
    before it. Only a clause longer than `limit` by itself is cut."""
    text = " ".join(_shorten_token(t) for t in _CHECKPOINT.sub("", text).split())
    if len(text) <= limit:
        return text
    parts = text.split(" | ")
    if len(parts) >= 2:
        head, keep = parts[0], parts[-1]
        sep = " | … | " if len(parts) > 2 else " | "
        marks = list(_CAUSE_MARK.finditer(keep))
        if len(keep) + len(sep) > limit - 24 and marks and marks[-1].start() > 0:
            keep = "…" + keep[marks[-1].start():]
    else:
        marks = [m for m in _CAUSE_MARK.finditer(text) if m.start() > 0]
        if not marks:
            return text[: limit - 1] + "…"
        head, keep, sep = text[: marks[-1].start()].rstrip(), text[marks[-1].start():], " … "
    keep = keep if len(keep) <= limit else keep[: limit - 1] + "…"
    room = limit - len(sep) - len(keep)
    if room < 16:  # the cause fills the line: it alone is shown, after the head's first words
        room = 16
    if len(head) > room:
        head = head[: room - 1].rstrip() + "…"
    return f"{head}{sep}{keep}"


def _shorten_token(token: str, limit: int = 64) -> str:
    """A long token shortened inside, keeping what names it: a URL's host and file, a path's first directory and
    file, the first 8 digits of a hex id; trailing punctuation stays."""
    if len(token) <= limit:
        return token
    trail = _TRAILING.search(token)
    core, tail = (token[: trail.start()], trail.group()) if trail else (token, "")
    core = _HEX_RUN.sub(lambda m: m.group()[:8] + "…", core)
    url = _URL_TOKEN.search(core)
    if url is not None and "/" in url.group(2)[1:]:
        core = f"{core[:url.start()]}{url.group(1)}/…/{_short_name(url.group(2).rsplit('/', 1)[1])}"
    elif "/" in core.strip("/"):
        segments = core.split("/")
        first = "/".join(segments[:2]) if core.startswith("/") else segments[0]
        core = f"{first}/…/{_short_name(segments[-1])}" if len(segments) > 2 else core
    if len(core) > limit:
        core = f"{core[:28]}…{core[-28:]}"
    return core + tail


def _short_name(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else f"{name[:22]}…{name[-22:]}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _short_digest(digest: str) -> str:
    return digest[:19] if digest.startswith("sha256:") else digest[:12]
