"""Judging one pass, pure: spec, reports, records, the instances already judged and `now` in; verdicts,
record changes and the commit message out. Called by `reconciler.flows.judge.run_pass` on a freshly synced
tree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from operator import attrgetter

from reconciler.domain.breaker import GuardOutcome, KillBudget, apply_guards
from reconciler.domain.correlation import correlate
from reconciler.domain.observations import InstanceReport
from reconciler.domain.records import (
    ImageSuspectRecord,
    MachineRecord,
    RecordError,
    RecordSet,
    check_machine_id,
)
from reconciler.domain.serving import (
    EARLY,
    SERVING_VERDICTS,
    FleetSignals,
    judge_early,
    judge_market_deadlines,
    judge_serving,
    with_expiry,
)
from reconciler.domain.snark_market import MarketMiss
from reconciler.domain.spec import FleetSpec
from reconciler.domain.verdict import Verdict, deadline, judge

INSTANCE_TRAILER = "Fleet-Instance"
#: Instances judged while serving (degraded, lost): each is judged once after admission, too.
SERVING_TRAILER = "Fleet-Serving-Instance"


# --- decide (pure) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassDecision:
    """Everything one pass concluded, as data; `flows.judge.commit_request` makes it a commit."""

    verdicts: tuple[Verdict, ...] = ()
    machine_records: Mapping[str, MachineRecord] = field(default_factory=dict)
    image_records: Mapping[str, ImageSuspectRecord] = field(default_factory=dict)
    pending: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    kill_budgets: Mapping[str, KillBudget] = field(default_factory=dict)
    #: (instance id, reason) of reports that cannot be judged; the others were judged regardless.
    quarantined: tuple[tuple[str, str], ...] = ()

    @property
    def recorded(self) -> tuple[Verdict, ...]:
        """Verdicts that land in a machine record (the rest are notes: no usable machine id)."""
        return tuple(v for v in self.verdicts if v.machine_id in self.machine_records)

    def summary(self) -> str:
        """The commit subject: the root cause of the pass's most important verdict FIRST (issue 14), then counts.

        `fleet: machine 40213 benchmark-error: benchmark exit 1, 0/10 proofs: Error: ... (blame: image) [2 verdicts;
        1 held by circuit-breaker; image sha256:a1a1 suspect: daemon-connection-refused]`."""
        recorded = self.recorded
        bad = [v for v in recorded if v.marks_bad]
        held = [v for v in recorded if v.held_by]
        noun = "verdict" if len(recorded) == 1 else "verdicts"
        parts = [f"{len(recorded)} {noun}"]
        if len(bad) > 1:
            parts.append(f"{len(bad)} bad: machines {', '.join(sorted({str(v.machine_id) for v in bad}))}")
        elif bad:
            parts.append(f"1 bad: machine {bad[0].machine_id}")
        if held:
            parts.append(f"{len(held)} held by {'/'.join(sorted({str(v.held_by) for v in held}))}")
        for digest, rec in sorted(self.image_records.items()):
            parts.append(f"image {digest[:19]} {rec.status}: {rec.signature}")
        early = [v for v in recorded if v.verdict == EARLY]
        if early:
            minutes = sum(float(v.evidence.get("saved", {}).get("minutes", 0)) for v in early)
            usd = sum(float(v.evidence.get("saved", {}).get("usd_at_most", 0)) for v in early)
            parts.append(f"early verdict saved ~{minutes:.0f} min, <= ${usd:.2f}")
        first = next(iter(bad), None) or next((v for v in recorded if v.is_failure), None) or \
            next(iter(recorded), None)
        if first is None:
            return f"fleet: {'; '.join(parts)}"
        return f"fleet: machine {first.machine_id} {first.root_cause()} [{'; '.join(parts)}]"

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
        out += [(INSTANCE_TRAILER, v.instance_id) for v in recorded if v.verdict not in SERVING_VERDICTS]
        out += [(SERVING_TRAILER, v.instance_id) for v in recorded if v.verdict in SERVING_VERDICTS]
        return tuple(out)


@dataclass(frozen=True)
class JudgedSets:
    """What the history says was judged: every judged instance (trailers and records), those judged while serving,
    and those whose admission passed (from the records)."""

    judged: frozenset[str]
    serving: frozenset[str]
    passed: frozenset[str]


def judged_sets(records: RecordSet, judged_instance_ids: Iterable[str],
                judged_serving_ids: Iterable[str] = ()) -> JudgedSets:
    judged = set(judged_instance_ids)
    judged_serving = set(judged_serving_ids)
    passed: set[str] = set()
    for rec in records.machines.values():  # 10,000 records, 100,000 entries: summarised once per record object
        rec_judged, rec_serving, rec_passed = rec.derived("judging.instances", _instance_sets)
        judged.update(rec_judged)
        judged_serving.update(rec_serving)
        passed.update(rec_passed)
    return JudgedSets(frozenset(judged), frozenset(judged_serving), frozenset(passed))


def decide(spec: FleetSpec, reports: Iterable[InstanceReport], records: RecordSet,
           judged_instance_ids: Iterable[str], desired_image_digest: str | None, now: datetime, *,
           judged_serving_ids: Iterable[str] = (), fleet: FleetSignals | None = None,
           sets: JudgedSets | None = None,
           market_misses: Mapping[str, Sequence[MarketMiss]] | None = None,
           prices: Mapping[str, float] | None = None) -> PassDecision:
    """Judge every unjudged report, run the verdicts through the breaker and kill budget, update records.

    A benchmark still running may get an early verdict; an instance that passed and serves may get a
    serving verdict (degraded, lost, market-deadline) once (`judged_serving_ids`: from the
    Fleet-Serving-Instance trailers). `market_misses`: per instance, the Snark Market runs that missed their
    deadline on it (curio's tables, for pools with `queue.market`).

    `fleet`: when the controller last heard every worker, for the serving verdicts (None: from `reports`; the warm
    pass judges a few reports against the whole fleet's signals). `sets`: `judged_sets` of these inputs when the
    caller has them already. `prices`: instance -> $/h (the provisioner's slot state, when the leader has it), kept
    in each entry (a replay's price-cap check reads it)."""
    reports = list(reports)
    sets = sets or judged_sets(records, judged_instance_ids, judged_serving_ids)
    judged, judged_serving, passed = sets.judged, sets.serving, sets.passed
    fleet = fleet or FleetSignals(reports)
    lost_after = timedelta(minutes=spec.serving.lost_after_minutes)
    fleet_back: tuple[datetime | None] | None = None  # (`fleet_heard_again`,) once computed
    machines: dict[str, MachineRecord] = dict(records.machines)
    notes: list[str] = list(f"unreadable record kept as is: {p}" for p in records.problems)
    pending: list[str] = []
    candidates: list[Verdict] = []
    by_machine: dict[str | None, list[Verdict]] = {}  # this pass's candidates per machine (params strikes)
    unrecordable: list[Verdict] = []
    quarantined: list[tuple[str, str]] = []
    for report in sorted(reports, key=attrgetter("registered_at", "instance_id")):
        serving = report.instance_id in judged
        if serving and (report.instance_id not in passed or report.instance_id in judged_serving):
            continue
        if report.quarantine is not None:
            if serving:
                continue
            quarantined.append((report.instance_id, report.quarantine))
            notes.append(f"instance {report.instance_id}: quarantined, not judged: {report.quarantine}")
            continue
        pool = spec.find_pool(report.pool)
        if pool is None:
            if not serving:
                notes.append(f"instance {report.instance_id}: pool {report.pool!r} is not in the spec; not judged")
            continue
        machine_id = _machine_id(report.machine_id)
        history = machines.get(machine_id) if machine_id else None
        verdict: Verdict | None
        try:
            if serving:
                others = None
                if report.first("serve", "started") is not None:  # else judge_serving never reads it
                    if fleet_back is None and now - fleet.heard(report.instance_id) > lost_after:
                        # Only when a serving worker has been silent that long: the fleet's signals since the
                        # oldest such silence began (judged ones are never judged again: not counted).
                        fleet_back = (fleet.heard_again(report.instance_id, now, lost_after, judged_serving),)
                    others = fleet.newest_except(report.instance_id)
                verdict = judge_serving(report, pool, spec.serving, now, fleet_last_signal=others,
                                        fleet_back=fleet_back[0] if fleet_back else None)
                if verdict is None and market_misses and report.instance_id in market_misses:
                    verdict = judge_market_deadlines(report, pool, market_misses[report.instance_id], now)
            else:
                prior = _params_strikes(history, by_machine.get(machine_id, ()), machine_id)
                verdict = judge(report, pool, now, desired_image_digest=desired_image_digest,
                                prior_params_failures=prior)
                if verdict is None:
                    verdict = judge_early(report, pool, spec.early_verdict, now)
        except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError) as exc:
            # A report the judge cannot read must not stop the others: quarantined with its reason.
            reason = f"cannot be judged: {type(exc).__name__}: {exc}"
            quarantined.append((report.instance_id, reason))
            notes.append(f"instance {report.instance_id}: quarantined, not judged: {reason}")
            continue
        if verdict is None:
            if not serving:
                pending.append(report.instance_id)
            continue
        if machine_id is None:
            unrecordable.append(verdict)
            if report.machine_id is None:
                notes.append(f"instance {report.instance_id}: {verdict.root_cause()}; not recorded: machine id "
                             "None is missing or unsafe")
            else:
                reason = (f"machine id {report.machine_id!r} is missing or unsafe: not a valid id (full match of "
                          "[A-Za-z0-9][A-Za-z0-9_.-]*, no '..')")
                quarantined.append((report.instance_id, reason))
                notes.append(f"instance {report.instance_id}: {verdict.root_cause()}; not recorded, quarantined: "
                             f"{reason}")
        elif machine_id in records.unreadable_machine_ids:
            notes.append(f"instance {report.instance_id}: {verdict.root_cause()}; not recorded: the record of "
                         f"machine {machine_id} is unreadable (fix it; it is never overwritten)")
            unrecordable.append(verdict)
        else:
            candidates.append(verdict)
            by_machine.setdefault(machine_id, []).append(verdict)
    guarded, changed, recorded_notes = guard_and_record(spec, records, candidates, now, prices=prices)
    notes += recorded_notes
    return PassDecision(verdicts=(*guarded.verdicts, *unrecordable), machine_records=changed,
                        image_records=guarded.image_records,
                        pending=tuple(pending), notes=tuple(notes), kill_budgets=guarded.kill_budgets,
                        quarantined=tuple(quarantined))


def guard_and_record(spec: FleetSpec, records: RecordSet, candidates: Sequence[Verdict], now: datetime, *,
                     prices: Mapping[str, float] | None = None,
                     budgets: Mapping[str, KillBudget] | None = None) -> tuple[GuardOutcome,
                                                                               dict[str, MachineRecord], list[str]]:
    """The judged verdicts (each with a checked machine id) through the fleet's correlation of unknowns, the circuit
    breaker and the kill budget, then into their machines' records (expiry and probation stamped): the guards'
    outcome, the changed records and the notes. `decide` ends with it; `domain.replay` replays recorded verdicts
    through it.

    `prices`: instance -> $/h it was rented at (when the leader knows it): kept in the record entry. `budgets`: the
    kill budgets at `now` when the caller keeps them (`breaker.apply_guards`)."""
    # The unknowns first: the fleet decides them by correlation or a retest (issue 29), then the guards (the
    # breaker's image correlation, the kill budget) see what was decided.
    correlated = correlate(spec, records, candidates, now)
    guarded = apply_guards(spec, records, correlated.verdicts, now, budgets=budgets)
    notes = [*correlated.notes, *guarded.notes]
    changed: dict[str, MachineRecord] = {}
    for v in guarded.verdicts:
        assert v.machine_id is not None  # candidates all have a checked machine id
        current = changed.get(v.machine_id) or records.machines.get(v.machine_id) or MachineRecord(v.machine_id)
        entry, note = with_expiry(v, current, spec.record_expiry, now)
        if note:
            notes.append(note)
        price = prices.get(v.instance_id) if prices else None
        if price is not None:
            entry = replace(entry, price_usd_per_hour=price)
        changed[v.machine_id] = current.with_entry(entry, host_id=v.host_id, gpu_name=v.gpu_name)
    return guarded, changed, notes


def awaiting_evidence(spec: FleetSpec, reports: Iterable[InstanceReport], judged_instance_ids: Iterable[str],
                      now: datetime) -> list[str]:
    """Instances whose benchmark attempt `decide` will judge this pass (a failed phase, a result, or past the
    deadline) and that are not judged yet: the shell loads their whole log ring as evidence (issue 23 item 3),
    not only the tail every report carries."""
    judged = set(judged_instance_ids)
    out = []
    for report in reports:
        if report.instance_id in judged or report.quarantine is not None:
            continue
        pool = spec.find_pool(report.pool)
        if pool is None:
            continue
        if report.failure() is not None or report.result is not None:
            out.append(report.instance_id)
            continue
        due = deadline(report, pool)
        # Destroyed before its deadline without a word: `judge` never judges it (nothing to read it for).
        if now >= due and (report.destroyed_at is None or report.destroyed_at >= due):
            out.append(report.instance_id)
    return out


def _machine_id(value: str | None) -> str | None:
    try:
        return check_machine_id(value) if value is not None else None
    except RecordError:
        return None


def _instance_sets(record: MachineRecord) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(every judged instance: MachineRecord.judged_instances, those judged while serving, those that passed
    admission) of one record."""
    entries = record.benchmarks
    return (frozenset(b.instance_id for b in entries),
            frozenset(b.instance_id for b in entries if b.stage == "serving"),
            frozenset(b.instance_id for b in entries if b.stage != "serving" and b.verdict == "ok"))


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
