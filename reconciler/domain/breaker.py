"""Circuit breaker and kill budget: the guards between a verdict and a machine marked bad.

Pure, used by `loop.decide` after `verdict.judge` and by `fleet status` to show both guards' state.

Circuit breaker: when the same image digest fails with the same signature on K distinct machines within the
window (spec.circuit_breaker), the image - not the machines - is the suspect. From then on every failure with
that digest + signature is held (`held_by: circuit-breaker`, not bad; blame image, a configuration blame kept
with its setting), and an image-suspect record names the pools, machines and instances; the planner pauses a
pool while an active suspect for the desired digest names it (`planner.pool_pause`).

What counts (issue 23 item 1; `counts`): every failure that is not positively attributed to the machine, the
network, the params mirror or the marketplace - image, configuration and unknown blame. An unexplained failure
is keyed by a signature made of its verdict, phase, exit code and normalised last error line
(`verdict.unrecognized_signature`), so the seed incident (exit 1 after 0 proofs, nothing but aria2c progress
in the tail, on three machines) trips it. A machine blame read only from a CUDA error code (`sppark::Error
#-999`, `cudaErrorLaunchFailure`, with no kernel Xid or nvidia-smi line beside it) is a symptom our own build
can cause too: it counts, so when it recurs on distinct machines with one image the breaker decides instead
(issue 23 item 4). Hardware seen first hand (Xid, ECC from the kernel, nvidia-smi), network, params and
marketplace failures never count, and neither does below-min-rate (a measurement of one machine), nor an
unexplained params failure (the fetch is the mirror's or the machine's network: the mirror correlation and the
retest of domain/correlation.py decide it; issue 29).
Humans clear a suspect with `status: cleared`: the failures the record already lists are then
forgiven, and only K NEW machines trip it again. A deleted record is forgotten: the next failure with that
digest + signature re-counts the whole window (like a pardoned machine, only a NEW failure re-adds it).

Kill budget: per pool, at most `spec.kill_budget.allowed(pool.count)` machines newly marked bad within the
window (only verdicts that mark a machine bad spend it: machine blame, a network second strike; configuration,
params, image and marketplace blame never do); further machine-blamed verdicts are recorded with `held_by:
kill-budget` (blame kept, not bad) so a human can look before more capacity is thrown away. A machine already
bad costs nothing."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from reconciler.domain.correlation import RULE_IMAGE
from reconciler.domain.observations import format_time, parse_time
from reconciler.domain.quick_init import quick_init
from reconciler.domain.records import (
    BenchmarkEntry,
    ImageSuspectRecord,
    MachineRecord,
    RecordError,
    RecordSet,
    check_image_digest,
)
from reconciler.domain.spec import FleetSpec
from reconciler.domain.verdict import HELD_BY_CIRCUIT_BREAKER, HELD_BY_KILL_BUDGET, Verdict
from reconciler.domain.verdicts import CORRELATED_VERDICTS as CORRELATED_VERDICTS  # re-exported
from reconciler.domain.verdicts import counts_against_image

#: Verdicts that say "this attempt broke" (CORRELATED_VERDICTS, from the registry); below-min-rate and
#: stale-image never correlate; which blames count: `counts`.
_SIG_SEPARATOR = ", "

#: A CUDA runtime error as our daemon reports it: sppark's negated code (sppark util/exception.cuh), the enum
#: name or its `failed: "<text>"` form; or as other CUDA callers print it: the driver API's `CUDA_ERROR_*`
#: name, PyTorch's `CUDA error: <text>` (signatures.py decodes all of these: cuda_errors.py). Alone it says the
#: GPU call failed, not why (a dying GPU and a bad kernel in our build print the same code); the machine is seen
#: first hand only through the kernel (`NVRM: Xid`), ECC counters or nvidia-smi.
_CUDA_CODE = re.compile(r"sppark::Error #-?\d+|\bcudaError[A-Z]\w*|@\S+:\d+ failed: \"|\bCUDA_ERROR_[A-Z_]+"
                        r"|CUDA error: ")
_FIRST_HAND = re.compile(r"\bXid\b|\bNVRM\b|nvidia-smi|\bNVML\b|fallen off the bus", re.IGNORECASE)


def symptom_only(signature_line: str | None) -> bool:
    """Whether a machine blame rests only on a CUDA error code (no kernel or driver line of its own)."""
    return bool(signature_line and _CUDA_CODE.search(signature_line) and not _FIRST_HAND.search(signature_line))


def counts(verdict: str, blame: str, signature_line: str | None = None) -> bool:
    """Whether a failure counts towards the breaker: not positively attributed to the machine, the network,
    the params mirror or the marketplace (`verdicts.counts_against_image`) - but an unexplained params failure,
    which the mirror correlation and the retest decide (correlation.py) -, or a machine blame inferred from a
    line that shows nothing but a CUDA error code (`symptom_only`: `sppark::Error #-999`, `#-214` matched by the
    ECC signature that kernel Xid 48 lines also match)."""
    if verdict == "params-failed" and blame == "unknown":
        return False  # an unexplained fetch failure is the mirror's or one machine's: correlation.py decides it
    if counts_against_image(verdict, blame):
        return True
    return blame == "machine" and verdict in CORRELATED_VERDICTS and symptom_only(signature_line)


def _signature_line(evidence: Mapping[str, object]) -> str | None:
    sig = evidence.get("signature")
    line = sig.get("line") if isinstance(sig, Mapping) else None
    return line if isinstance(line, str) else None


@dataclass(frozen=True)
class Failure:
    """One failed attempt, reduced to what the breaker correlates on."""

    machine_id: str
    instance_id: str
    pool: str | None
    image_digest: str
    signature: str
    at: datetime


@quick_init
@dataclass(frozen=True)
class KillBudget:
    pool: str
    allowed: int
    used: tuple[str, ...]  # machines newly marked bad within the window

    @property
    def exhausted(self) -> bool:
        return len(self.used) >= self.allowed


@dataclass(frozen=True)
class GuardOutcome:
    """Verdicts after both guards, plus the image-suspect records to write (new or grown)."""

    verdicts: tuple[Verdict, ...]
    image_records: Mapping[str, ImageSuspectRecord] = field(default_factory=dict)
    kill_budgets: Mapping[str, KillBudget] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def signatures_of(record: ImageSuspectRecord) -> frozenset[str]:
    """An image record may carry several signatures (each tripped on its own), joined by ', '."""
    return frozenset(s.strip() for s in record.signature.split(_SIG_SEPARATOR) if s.strip())


def _entry_failure(machine_id: str, entry: BenchmarkEntry) -> Failure | None:
    if not entry.signature or not entry.image_digest:
        return None
    # The signature line only decides a machine blame of a failure (`counts`): the evidence is read for those only.
    line = _signature_line(entry.evidence) if entry.blame == "machine" and entry.verdict in CORRELATED_VERDICTS \
        else None
    if not counts(entry.verdict, entry.blame, line):
        return None
    try:
        at = parse_time(entry.at)
    except ValueError:
        return None
    return Failure(machine_id, entry.instance_id, entry.pool, entry.image_digest, entry.signature, at)


def verdict_failure(v: Verdict) -> Failure | None:
    if not counts(v.verdict, v.blame, _signature_line(v.evidence)) or not v.signature \
            or not v.image_digest or not v.machine_id:
        return None
    return Failure(v.machine_id, v.instance_id, v.pool, v.image_digest, v.signature, v.at)


def recorded_failures(records: RecordSet, since: datetime | None = None) -> list[Failure]:
    """Recorded verdicts that count against their image; with `since`, only those at or after it."""
    out = []
    for rec in records.machines.values():  # each record's candidates (times parsed) found once per record object
        for candidate in rec.derived("breaker.candidates", _record_candidates):
            if since is None or candidate.at >= since:
                failure = candidate.failure()
                if failure is not None:
                    out.append(failure)
    return out


class _Candidate:
    """A recorded entry that may count against its image. Whether it does is decided on first use, and reads the
    entry's evidence (an indexed record reads it from its file) only when the signature line decides: a machine
    blame of a failure (`counts`). A cold pass thereby reads the evidence of the entries within the window only."""

    __slots__ = ("_failure", "at", "entry", "machine_id")

    def __init__(self, machine_id: str, entry: BenchmarkEntry, at: datetime) -> None:
        self.machine_id, self.entry, self.at = machine_id, entry, at
        self._failure: tuple[Failure | None] | None = None

    def failure(self) -> Failure | None:
        if self._failure is None:
            self._failure = (_entry_failure(self.machine_id, self.entry),)
        return self._failure[0]


def _record_candidates(record: MachineRecord) -> tuple[_Candidate, ...]:
    out = []
    for entry in record.benchmarks:
        if not entry.signature or not entry.image_digest or not (
                counts_against_image(entry.verdict, entry.blame)
                or (entry.blame == "machine" and entry.verdict in CORRELATED_VERDICTS)):
            continue  # cannot count, whatever its evidence says (`counts`)
        try:
            at = parse_time(entry.at)
        except ValueError:
            continue
        out.append(_Candidate(record.machine_id, entry, at))
    return tuple(out)


def kill_budgets(spec: FleetSpec, records: RecordSet, now: datetime) -> dict[str, KillBudget]:
    """Per pool: machines newly marked bad within the kill-budget window (from the records)."""
    return kill_budgets_of_marks(spec, records.bad_marks(), now)  # from indexed columns when records are indexed


def kill_budgets_of_marks(spec: FleetSpec, marks: Iterable[tuple[str, str | None, str]],
                          now: datetime) -> dict[str, KillBudget]:
    """`kill_budgets` from the bad marks themselves, (machine id, pool, at) as `RecordSet.bad_marks` gives them, in
    any order: every mark within the window must be among them, older ones may be (a replay keeps its marks sorted
    by time and hands over those within reach instead of a RecordSet of every machine they name)."""
    since = now - timedelta(hours=spec.kill_budget.window_hours)
    used: dict[str, set[str]] = {p.name: set() for p in spec.pools}
    # An ISO time whose date sorts before `older` is older than the window whatever its offset (at most a day):
    # skipped without parsing (a fleet's history holds tens of thousands of such marks).
    older = (since - timedelta(days=2)).strftime("%Y-%m-%d")
    for machine_id, pool, at in marks:
        if pool in used and at[:10] >= older and _parsed_at(at) >= since:
            used[pool].add(machine_id)
    return {p.name: KillBudget(p.name, spec.kill_budget.allowed(p.count), tuple(sorted(used[p.name])))
            for p in spec.pools}


def apply_guards(spec: FleetSpec, records: RecordSet, verdicts: Sequence[Verdict], now: datetime, *,
                 budgets: Mapping[str, KillBudget] | None = None) -> GuardOutcome:
    """Run each new verdict, in order, through the circuit breaker, then the kill budget.

    `budgets`: `kill_budgets(spec, records, now)` when the caller keeps it (a replay keeps it from pass to pass and
    hands over only the records the breaker reads); None: read from `records`."""
    window = timedelta(hours=spec.circuit_breaker.window_hours)
    # The window's recorded failures are read when a verdict first counts against its image (most passes have none:
    # a replay's view then never builds the records of the window).
    history: list[Failure] | None = None
    images: dict[str, ImageSuspectRecord] = dict(records.images)
    changed: dict[str, ImageSuspectRecord] = {}
    if budgets is None:
        budgets = kill_budgets(spec, records, now)
    used: dict[str, set[str]] = {}  # the machines of each pool's budget, once a verdict may spend it
    # On probation: rentable, so a new failure is a new kill.
    already_bad = records.excluded_of((v.machine_id for v in verdicts if v.marks_bad and v.machine_id), now)
    notes: list[str] = []
    out: list[Verdict] = []
    for v in verdicts:
        failure = verdict_failure(v)
        if failure is not None:
            if history is None:
                history = recorded_failures(records, since=now - window)
            history.append(failure)
            record = images.get(failure.image_digest)
            if record is not None and record.active and failure.signature in signatures_of(record):
                record = _grow(record, [failure])
                images[failure.image_digest] = changed[failure.image_digest] = record
                v = _held_for_image(v, record)
            else:
                tripped = _trip(spec, record, history, failure, now)
                if tripped is not None:
                    images[failure.image_digest] = changed[failure.image_digest] = tripped
                    notes.append(f"circuit breaker tripped: {tripped.reason}")
                    v = _held_for_image(v, tripped)
        machine, pool = v.machine_id, v.pool
        if v.marks_bad and machine and pool is not None and pool in budgets and machine not in already_bad:
            pool_used = used.get(pool)
            if pool_used is None:
                pool_used = used[pool] = set(budgets[pool].used)
            allowed = budgets[pool].allowed
            if machine not in pool_used and len(pool_used) >= allowed:
                notes.append(f"kill budget of pool {pool} exhausted ({len(pool_used)}/{allowed} machines "
                             f"marked bad within {spec.kill_budget.window_hours:g}h): machine {machine} "
                             "not marked bad")
                v = v.held(HELD_BY_KILL_BUDGET)
            else:
                pool_used.add(machine)
        out.append(v)
    # `used` only grows: a pool whose set kept its size kept its budget (a replay runs this for tens of thousands
    # of passes, most of which spend no budget).
    final_budgets = dict(budgets)
    for pool, pool_used in used.items():
        if len(pool_used) != len(budgets[pool].used):
            final_budgets[pool] = replace(budgets[pool], used=tuple(sorted(pool_used)))
    return GuardOutcome(tuple(out), changed, final_budgets, tuple(notes))


def _held_for_image(v: Verdict, record: ImageSuspectRecord) -> Verdict:
    """`v` held by the circuit breaker, its evidence saying which correlation decided it (the image's)."""
    held = v.held(HELD_BY_CIRCUIT_BREAKER)
    correlation = {"rule": RULE_IMAGE, "decided": held.blame, "machines": list(record.machines),
                   "detail": f"the same failure ({v.signature}) on machines {', '.join(record.machines)} with image "
                             f"{record.image_digest[:19]}: the image (circuit breaker)"}
    return replace(held, evidence={**held.evidence, "correlation": correlation})


def _trip(spec: FleetSpec, record: ImageSuspectRecord | None, history: Iterable[Failure], failure: Failure,
          now: datetime) -> ImageSuspectRecord | None:
    forgiven = frozenset(record.instances) if record is not None and not record.active else frozenset()
    same = [f for f in history
            if (f.image_digest, f.signature) == (failure.image_digest, failure.signature)
            and f.instance_id not in forgiven]
    machines = sorted({f.machine_id for f in same})
    if len(machines) < spec.circuit_breaker.distinct_machines:
        return None
    try:
        check_image_digest(failure.image_digest)
    except RecordError:
        return None  # a digest we cannot name a record after; the verdicts stand as judged
    pools = sorted({f.pool for f in same if f.pool})
    reason = (f"{failure.signature} on {len(machines)} distinct machines ({', '.join(machines)}) within "
              f"{spec.circuit_breaker.window_hours:g}h with image {failure.image_digest[:19]}: pools "
              f"{', '.join(pools) or '-'} paused; machines are not marked bad for this failure")
    if record is not None and record.active:
        # Another signature already tripped on this digest: one record per digest carries both.
        grown = _grow(record, same)
        return replace(grown, signature=_SIG_SEPARATOR.join(sorted(signatures_of(record) | {failure.signature})),
                       reason=f"{record.reason}; {reason}")
    return ImageSuspectRecord(image_digest=failure.image_digest, signature=failure.signature, status="suspect",
                              machines=tuple(machines), tripped_at=format_time(now), pools=tuple(pools),
                              instances=tuple(sorted({f.instance_id for f in same})), reason=reason)


def _grow(record: ImageSuspectRecord, failures: Iterable[Failure]) -> ImageSuspectRecord:
    failures = list(failures)
    return replace(record,
                   machines=_merged(record.machines, (f.machine_id for f in failures)),
                   instances=_merged(record.instances, (f.instance_id for f in failures)),
                   pools=_merged(record.pools, (f.pool for f in failures if f.pool)))


def _merged(existing: Iterable[str], new: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(existing) | set(new)))


def _at(entry: BenchmarkEntry) -> datetime:
    return _parsed_at(entry.at)


@lru_cache(maxsize=16_384)  # the kill budget reads the same marks' times pass after pass (a replay: thousands)
def _parsed_at(at: str) -> datetime:
    try:
        return parse_time(at)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)  # unreadable time: outside every window
