"""The reconcile pass: load (spec + records from git, reports from the controller store) -> decide -> apply.

`decide` is pure: spec, reports, records, the instances already judged and `now` in; verdicts, record
changes and the commit message out. `run_pass` is the shell: it reads the reports through the
`ReportSource` port, then hands `GitStore.publish` a build function that loads the spec and records of the
freshly synced tree and decides on THAT tree (so a human's pardon merged a second ago is respected, and a
rejected push is recomputed, not rebased). `run` repeats passes on an interval until stopped.

Idempotency: an instance is judged iff its id is in a `Fleet-Instance` trailer on the origin branch or in
a machine record's benchmarks. A repeated pass finds nothing new and commits nothing; a pass that crashed
after committing but before pushing left nothing on origin, so the next pass (whose sync discards the
unpushed bot commit) judges the same instances again. A human who deletes a record (pardon) is not undone:
the old instance is still in the trailers; only a NEW failing instance adds the machine again.

Errors: an observation failure (the store raising anything) ends the pass with no verdicts. A bad spec is
permanent: the pass stalls with the spec's problems and writes nothing. Git trouble is temporary (fetch or
push failed: retried by the store, then by the next pass) or permanent (a dirty or foreign clone).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from reconciler.breaker import KillBudget, apply_guards
from reconciler.gitstore import CommitRequest, FileChange, GitStoreError, PublishResult, TemporaryGitError
from reconciler.observations import InstanceReport, format_time
from reconciler.records import (
    IMAGES_DIR,
    MACHINES_DIR,
    ImageSuspectRecord,
    MachineRecord,
    RecordCache,
    RecordError,
    RecordSet,
    check_machine_id,
    load_records,
    render_image_record,
    render_machine_record,
)
from reconciler.spec import FleetSpec, PoolSpec, SpecError, load_spec
from reconciler.verdict import Verdict, judge

SPEC_DIR = "fleet-spec"
SPEC_FILE = f"{SPEC_DIR}/fleet.yaml"
INSTANCE_TRAILER = "Fleet-Instance"


class ReportSource(Protocol):
    """What the controller store offers the loop. Any exception it raises is an observation failure."""

    def reports(self) -> Sequence[InstanceReport]: ...


class RecordPublisher(Protocol):
    """What the loop needs from git (implemented by `reconciler.gitstore.GitStore`)."""

    def publish(self, build: Callable[[Path], CommitRequest | None]) -> PublishResult: ...

    def trailer_values(self, key: str) -> set[str]: ...


# --- decide (pure) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassDecision:
    """Everything one pass concluded, as data. `commit_request()` turns it into the commit to publish."""

    verdicts: tuple[Verdict, ...] = ()
    machine_records: Mapping[str, MachineRecord] = field(default_factory=dict)
    image_records: Mapping[str, ImageSuspectRecord] = field(default_factory=dict)
    pending: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    kill_budgets: Mapping[str, KillBudget] = field(default_factory=dict)

    @property
    def recorded(self) -> tuple[Verdict, ...]:
        """Verdicts that land in a machine record (the rest are notes: no usable machine id)."""
        return tuple(v for v in self.verdicts if v.machine_id in self.machine_records)

    def changes(self) -> tuple[FileChange, ...]:
        machines = [FileChange(f"{SPEC_DIR}/{MACHINES_DIR}/{mid}.yaml", render_machine_record(rec))
                    for mid, rec in sorted(self.machine_records.items())]
        images = [FileChange(f"{SPEC_DIR}/{IMAGES_DIR}/{digest.removeprefix('sha256:')}.yaml",
                             render_image_record(rec))
                  for digest, rec in sorted(self.image_records.items())]
        return (*machines, *images)

    def summary(self) -> str:
        recorded = self.recorded
        bad = [v for v in recorded if v.marks_bad]
        held = [v for v in recorded if v.held_by]
        parts = []
        if len(bad) == 1:
            parts.append(f"1 bad: machine {bad[0].machine_id} {bad[0].reason}")
        elif bad:
            parts.append(f"{len(bad)} bad: machines {', '.join(sorted({str(v.machine_id) for v in bad}))}")
        if held:
            parts.append(f"{len(held)} held by {'/'.join(sorted({str(v.held_by) for v in held}))}")
        for digest, rec in sorted(self.image_records.items()):
            parts.append(f"image {digest[:19]} {rec.status}: {rec.signature}")
        noun = "verdict" if len(recorded) == 1 else "verdicts"
        detail = f" ({'; '.join(parts)})" if parts else ""
        return f"fleet: {len(recorded)} {noun}{detail}"

    def body(self) -> str:
        lines = []
        for v in self.recorded:
            host = f"host {v.host_id}, " if v.host_id else ""
            lines.append(f"- machine {v.machine_id} ({host}{v.gpu_name or 'unknown GPU'}, pool {v.pool}) "
                         f"instance {v.instance_id}: {v.root_cause()}")
        for rec in self.image_records.values():
            lines.append(f"- image {rec.image_digest} {rec.status}: {rec.reason}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def trailers(self) -> tuple[tuple[str, str], ...]:
        recorded = self.recorded
        out: list[tuple[str, str]] = []
        out += [("Fleet-Machine", m) for m in _unique(str(v.machine_id) for v in recorded)]
        out += [("Fleet-Verdict", verdict) for verdict in _unique(v.verdict for v in recorded)]
        out += [("Fleet-Image", d) for d in sorted(self.image_records)]
        out += [(INSTANCE_TRAILER, v.instance_id) for v in recorded]
        return tuple(out)

    def commit_request(self) -> CommitRequest | None:
        if not self.machine_records and not self.image_records:
            return None
        return CommitRequest(self.summary(), self.body(), self.trailers(), self.changes())


def decide(spec: FleetSpec, reports: Iterable[InstanceReport], records: RecordSet,
           judged_instance_ids: Iterable[str], desired_image_digest: str | None, now: datetime) -> PassDecision:
    """Judge every unjudged report, run the verdicts through the breaker and kill budget, update records."""
    judged = set(judged_instance_ids)
    for rec in records.machines.values():
        judged |= rec.judged_instances()
    machines: dict[str, MachineRecord] = dict(records.machines)
    notes: list[str] = list(f"unreadable record kept as is: {p}" for p in records.problems)
    pending: list[str] = []
    candidates: list[Verdict] = []
    unrecordable: list[Verdict] = []
    for report in sorted(reports, key=lambda r: (r.registered_at, r.instance_id)):
        if report.instance_id in judged:
            continue
        pool = _pool(spec, report.pool)
        if pool is None:
            notes.append(f"instance {report.instance_id}: pool {report.pool!r} is not in the spec; not judged")
            continue
        machine_id = _machine_id(report.machine_id)
        history = machines.get(machine_id) if machine_id else None
        prior = _params_strikes(history, candidates, machine_id)
        verdict = judge(report, pool, now, desired_image_digest=desired_image_digest, prior_params_failures=prior)
        if verdict is None:
            pending.append(report.instance_id)
            continue
        if machine_id is None:
            notes.append(f"instance {report.instance_id}: {verdict.root_cause()}; not recorded: machine id "
                         f"{report.machine_id!r} is missing or unsafe")
            unrecordable.append(verdict)
        elif machine_id in records.unreadable_machine_ids:
            notes.append(f"instance {report.instance_id}: {verdict.root_cause()}; not recorded: the record of "
                         f"machine {machine_id} is unreadable (fix it; it is never overwritten)")
            unrecordable.append(verdict)
        else:
            candidates.append(verdict)
    guarded = apply_guards(spec, records, candidates, now)
    notes += guarded.notes
    changed: dict[str, MachineRecord] = {}
    for v in guarded.verdicts:
        assert v.machine_id is not None  # candidates all have a checked machine id
        current = changed.get(v.machine_id) or machines.get(v.machine_id) or MachineRecord(v.machine_id)
        changed[v.machine_id] = current.with_entry(v.to_entry(), host_id=v.host_id, gpu_name=v.gpu_name)
    return PassDecision(verdicts=(*guarded.verdicts, *unrecordable), machine_records=changed,
                        image_records=guarded.image_records,
                        pending=tuple(pending), notes=tuple(notes), kill_budgets=guarded.kill_budgets)


def _pool(spec: FleetSpec, name: str | None) -> PoolSpec | None:
    try:
        return spec.pool(name) if name else None
    except KeyError:
        return None


def _machine_id(value: str | None) -> str | None:
    try:
        return check_machine_id(value) if value is not None else None
    except RecordError:
        return None


def _params_strikes(record: MachineRecord | None, this_pass: Sequence[Verdict], machine_id: str | None) -> int:
    """Network-blamed params failures on a machine since its last passing benchmark (records + this pass)."""
    entries = [(e.verdict, e.blame) for e in (record.benchmarks if record else ())]
    entries += [(v.verdict, v.blame) for v in this_pass if v.machine_id == machine_id]
    strikes = 0
    for verdict, blame in entries:
        if verdict == "ok":
            strikes = 0
        elif verdict == "params-failed" and blame == "network":
            strikes += 1
    return strikes


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


# --- the pass (shell) -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassResult:
    """What one pass did. Exactly one of stalled / observation_error / error is set when it did not finish."""

    at: datetime
    verdicts: tuple[Verdict, ...] = ()
    commit: str | None = None
    pushed: bool = False
    attempts: int = 0
    pending: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    stalled: str | None = None  # permanent: bad spec, unusable clone; a human must act
    observation_error: str | None = None  # the controller store failed: nothing judged
    error: str | None = None  # temporary: fetch/push failed; the next pass retries

    @property
    def ok(self) -> bool:
        return self.stalled is None and self.observation_error is None and self.error is None

    def headline(self) -> str:
        if self.stalled:
            return f"stalled: {self.stalled}"
        if self.observation_error:
            return f"observation failed, nothing judged: {self.observation_error}"
        if self.error:
            return f"will retry: {self.error}"
        recorded = [v for v in self.verdicts if v.machine_id]
        if self.commit:
            return f"committed {self.commit[:12]}: {len(recorded)} verdict(s); {len(self.pending)} pending"
        return f"nothing new; {len(self.pending)} pending"

    def to_json(self) -> dict[str, Any]:
        return {
            "at": format_time(self.at), "ok": self.ok, "headline": self.headline(), "commit": self.commit,
            "pushed": self.pushed, "attempts": self.attempts, "pending": list(self.pending),
            "notes": list(self.notes), "stalled": self.stalled, "observation_error": self.observation_error,
            "error": self.error,
            "verdicts": [{"instance_id": v.instance_id, "machine_id": v.machine_id, "pool": v.pool,
                          "verdict": v.verdict, "blame": v.blame, "marks_bad": v.marks_bad,
                          "held_by": v.held_by, "root_cause": v.root_cause()} for v in self.verdicts],
        }


def run_pass(store: RecordPublisher, source: ReportSource, now: datetime, *,
             desired_image_digest: str | None = None, spec_file: str = SPEC_FILE,
             record_cache: RecordCache | None = None) -> PassResult:
    """One pass: read reports, then publish whatever `decide` concludes on the fresh tip of the branch.

    `record_cache`: kept by a long-running loop between its passes, so a pass parses only the record files
    that changed since the last one (10,000 files: minutes to parse, milliseconds to stat)."""
    try:
        reports = tuple(source.reports())
    except Exception as exc:  # any failure to observe must never become a verdict
        return PassResult(at=now, observation_error=f"{type(exc).__name__}: {exc}")

    outcome: dict[str, Any] = {}

    def build(workdir: Path) -> CommitRequest | None:
        outcome.clear()
        try:
            spec = load_spec(workdir / spec_file)
        except SpecError as exc:
            outcome["stalled"] = str(exc)
            return None
        records = load_records(workdir / Path(spec_file).parent, record_cache)
        judged = store.trailer_values(INSTANCE_TRAILER)
        decision = decide(spec, reports, records, judged, desired_image_digest, now)
        outcome["decision"] = decision
        return decision.commit_request()

    try:
        published = store.publish(build)
    except TemporaryGitError as exc:
        return PassResult(at=now, error=str(exc))
    except GitStoreError as exc:
        return PassResult(at=now, stalled=str(exc))
    if "stalled" in outcome:
        return PassResult(at=now, stalled=outcome["stalled"], attempts=published.attempts)
    decision: PassDecision = outcome["decision"]
    return PassResult(at=now, verdicts=decision.verdicts, commit=published.commit, pushed=published.pushed,
                      attempts=published.attempts, pending=decision.pending, notes=decision.notes)


def run(pass_once: Callable[[datetime], PassResult], *, interval_s: float, stop_event: threading.Event,
        clock: Callable[[], datetime], sleep: Callable[[float], object] | None = None,
        on_pass: Callable[[PassResult], None] | None = None, max_passes: int | None = None) -> list[PassResult]:
    """Run passes every `interval_s` until `stop_event` is set (or `max_passes`). A pass that raises
    unexpectedly is reported as an error and the loop goes on: the next pass starts from git again."""
    wait = sleep if sleep is not None else stop_event.wait
    results: list[PassResult] = []
    while not stop_event.is_set():
        now = clock()
        try:
            result = pass_once(now)
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            result = PassResult(at=now, error=f"pass crashed: {detail}")
        results.append(result)
        if on_pass is not None:
            on_pass(result)
        if max_passes is not None and len(results) >= max_passes:
            break
        if stop_event.is_set():
            break
        wait(interval_s)
    return results
