"""What a warm pass looks at: the instances with new reports, and those whose time-based deadlines fell due.

Place in the flow: the leader's pass (flows/judge.py) keeps a `JudgeMemory` and a `DirectiveMemory` from one pass
to the next. `decide_due` is `judging.decide` run over the due instances only, `directives_due` is
`serving.directives` recomputed for the affected instances only; both give exactly what the full functions give
over every instance (tests/unit/test_due.py runs both on random histories and compares), at the cost of the few
that changed instead of the whole fleet. Pure: `now` and every input are arguments; each returns the memory for the
next pass, which the shell keeps only once the pass's work is published (a pass that fails leaves the old one, and
the same instances are due again).

Why an instance that is not due gives the same outcome as last time (`judging.decide`, `verdict.judge`,
`serving.judge_serving`, `serving.judge_early`):
- its report is unchanged (a new registration, event, result, log batch or destroyed mark makes it changed);
- whether it is judged, judged while serving, or passed admission is unchanged (the sets are compared);
- the spec and the desired image digest are unchanged (a change of either makes every instance due);
- its deadline has not come: an unjudged attempt is judged at its benchmark deadline (`verdict.deadline`); a
  serving worker can only be found lost once `lost_after_minutes` passed since its last heartbeat;
- it produced nothing last time, or only `pending`: an instance that produced a verdict, a note or a quarantine
  is due again next pass (recorded, it becomes judged; unrecordable, it repeats as the full pass repeats it), and
  so is a serving worker silent past its deadline but held because nobody else was heard (that can change with
  any other worker's signal).
Degraded verdicts, early verdicts, failures and results depend on the report alone. The breaker and kill budget
see the same candidates in the same order (the due ones, sorted as `decide` sorts), so they decide the same.

Directives (`serving.directive_for`) depend on the instance's report, the record entries naming it, its machine's
record and that record's standing at `now`; they are recomputed for changed reports, for the instances named by
changed records (old and new) or on their machines, and for machines whose standing changes with time (a bad
entry expiring into probation, a probation ending).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from operator import attrgetter

from reconciler.domain.judging import JudgedSets, PassDecision, decide, judged_sets
from reconciler.domain.observations import InstanceReport
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordSet, record_time
from reconciler.domain.serving import Directive, FleetSignals, directive_for
from reconciler.domain.snark_market import MarketMiss
from reconciler.domain.spec import FleetSpec, ServingSettings
from reconciler.domain.verdict import deadline

_ORDER = attrgetter("registered_at", "instance_id")


# --- decide ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeMemory:
    """What one `decide_due` leaves for the next: the basis it judged under, the judged sets it saw, the instances
    still pending, the deadline index (instance -> when its outcome can change with time alone) and the instances
    to look at again whatever happens (they produced something)."""

    basis: tuple[FleetSpec, str | None]
    sets: JudgedSets
    pending: frozenset[str] = frozenset()
    deadlines: Mapping[str, datetime] = field(default_factory=dict)
    again: frozenset[str] = frozenset()

    def due(self, spec: FleetSpec, desired_image_digest: str | None, sets: JudgedSets, changed: Iterable[str],
            known: Collection[str], now: datetime) -> set[str] | None:
        """The instances to judge this pass; None: every one (nothing to go by: another spec or digest)."""
        if self.basis != (spec, desired_image_digest):
            return None
        due = set(changed) | self.again | {i for i, at in self.deadlines.items() if at <= now}
        due |= (sets.judged ^ self.sets.judged) | (sets.serving ^ self.sets.serving) | (sets.passed ^ self.sets.passed)
        return {i for i in due if i in known}


def decide_due(spec: FleetSpec, reports: Mapping[str, InstanceReport], due: Collection[str] | None,
               records: RecordSet, judged_instance_ids: Iterable[str], desired_image_digest: str | None, now: datetime,
               *, judged_serving_ids: Iterable[str] = (), memory: JudgeMemory | None = None,
               fleet: FleetSignals | None = None, sets: JudgedSets | None = None,
               market_misses: Mapping[str, Sequence[MarketMiss]] | None = None,
               prices: Mapping[str, float] | None = None) -> tuple[PassDecision, JudgeMemory]:
    """`decide` over every report in `reports`, worked out from the `due` ones (`JudgeMemory.due`; None: every one)
    and what `memory` says of the others; and the memory for the next pass. `fleet`: every worker's last signal,
    kept by the caller (else from `reports`); `sets`: `judged_sets` of these inputs, when the caller has them.
    `market_misses`: the Snark Market runs that missed their deadline, per instance (curio's evidence, not the
    store's: the instances they name are due whatever their reports say). `prices`: instance -> $/h, kept in the
    record entries (`decide`)."""
    sets = sets or judged_sets(records, judged_instance_ids, judged_serving_ids)
    if memory is None:
        due = None  # nothing says what the others would give
    if due is not None and market_misses:
        due = {*due, *(i for i in market_misses if i in reports)}
    chosen = sorted(reports.values() if due is None else (reports[i] for i in due), key=_ORDER)
    decision = decide(spec, chosen, records, sets.judged, desired_image_digest, now,
                      fleet=fleet or FleetSignals(tuple(reports.values())), sets=sets, market_misses=market_misses,
                      prices=prices)
    looked = {r.instance_id for r in chosen}
    pending = set(decision.pending)
    deadlines: dict[str, datetime] = {}
    if memory is not None and due is not None:  # the rest stands as the last pass left it
        pending |= {i for i in memory.pending - looked if i in reports}
        deadlines = {i: at for i, at in memory.deadlines.items() if i not in looked}
        if len(pending) > len(decision.pending):
            decision = replace(decision, pending=tuple(r.instance_id for r in sorted((reports[i] for i in pending),
                                                                                    key=_ORDER)))
    produced = {v.instance_id for v in decision.verdicts} | {i for i, _ in decision.quarantined}
    again: set[str] = set()
    for report in chosen:
        iid = report.instance_id
        at = None if iid in produced else _next_look(spec, report, sets)
        if iid in produced or at is _EVERY_PASS:
            again.add(iid)
        elif isinstance(at, datetime):
            if at > now:
                deadlines[iid] = at
            elif iid not in pending:  # a serving worker silent past its deadline, held: nobody else was heard
                again.add(iid)
    return decision, JudgeMemory((spec, desired_image_digest), sets, frozenset(pending), deadlines, frozenset(again))


#: `_next_look`: the outcome can change at any pass (a note each pass; a lost verdict held by the fleet's silence).
_EVERY_PASS = object()


def _next_look(spec: FleetSpec, report: InstanceReport, sets: JudgedSets) -> datetime | object | None:
    """When `decide`'s outcome for this report, unchanged and without a verdict this pass, can change with time
    alone: a time, `_EVERY_PASS`, or None (only a new report, another judged set or another spec changes it)."""
    pool = spec.find_pool(report.pool)
    iid = report.instance_id
    if iid not in sets.judged:
        if report.quarantine is not None or pool is None:
            return _EVERY_PASS  # a note every pass
        return deadline(report, pool)  # pending until then (past it: pending for good, until the report changes)
    if iid not in sets.passed or iid in sets.serving or report.quarantine is not None or pool is None:
        return None  # never judged again
    return lost_check_at(report, spec.serving)


def lost_check_at(report: InstanceReport, settings: ServingSettings) -> datetime | None:
    """The earliest time `judge_serving` can find this serving worker lost, its report unchanged: its last heartbeat
    (or its serve start) + `lost_after_minutes`; None when it cannot (not serving, stopped, destroyed).

    The last heartbeat is the last to arrive (events are in arrival order): `serving_health`'s newest heartbeat
    is that one or a later one, so this is never later than the time the verdict can come."""
    started = report.first("serve", "started")
    if started is None or report.destroyed_at is not None or report.first("serve", "done") is not None \
            or report.first("serve", "failed") is not None:
        return None
    last = next((e.at for e in reversed(report.events)
                 if e.phase == "serve" and isinstance(e.details.get("heartbeat"), Mapping)), started.at)
    return last + timedelta(minutes=settings.lost_after_minutes)


# --- directives -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DirectiveMemory:
    """What one `directives_due` leaves for the next: the directive of every live instance, the records it read
    (by machine id, compared by identity: an unchanged file is the same object from the loop's record cache), which
    machines' records name each instance, and when each machine's standing changes with time."""

    heartbeat_minutes: float
    told: Mapping[str, Directive]
    records: Mapping[str, MachineRecord]
    named_in: Mapping[str, tuple[str, ...]]
    standing_changes: Mapping[str, datetime]


def directives_due(reports: Mapping[str, InstanceReport], changed: Iterable[str], records: RecordSet,
                   settings: ServingSettings, now: datetime, memory: DirectiveMemory | None = None
                   ) -> tuple[Mapping[str, Directive], Collection[str], DirectiveMemory]:
    """`serving.directives(reports.values(), records, settings, now)`, recomputed for the instances whose directive
    can have changed since the pass that left `memory` (see the module docstring): (every live worker's directive,
    the instances worked out again, the memory for the next pass)."""
    machines = records.machines
    if memory is None or memory.heartbeat_minutes != settings.heartbeat_minutes:
        named_in = _named_in(machines.values())
        affected: set[str] | None = None
        changes = {m: at for m, rec in machines.items() if (at := _standing_change(rec, now)) is not None}
    else:
        named_in = dict(memory.named_in)
        affected = set(changed)
        changes = dict(memory.standing_changes)
        touched = {m for m, rec in machines.items() if memory.records.get(m) is not rec}
        touched |= memory.records.keys() - machines.keys()
        touched |= {m for m, at in memory.standing_changes.items() if at <= now}
        by_machine = _by_machine(reports.values()) if touched else {}
        for m in touched:
            old, new = memory.records.get(m), machines.get(m)
            for rec in (old, new):
                if rec is not None:
                    affected |= _judged_instances(rec)
            affected |= by_machine.get(m, set())
            if old is not new:
                _renamed(named_in, m, old, new)
            changes.pop(m, None)
            if new is not None and (at := _standing_change(new, now)) is not None:
                changes[m] = at
    told = dict(memory.told) if affected is not None and memory is not None else {}
    recomputed = reports.keys() if affected is None else affected
    for iid in recomputed:
        report = reports.get(iid)
        if report is None or report.destroyed_at is not None:
            told.pop(iid, None)
            continue
        mine, machine = _entries_of(iid, named_in.get(iid, ()), machines)
        if machine is None and report.machine_id is not None:
            machine = machines.get(report.machine_id)
        told[iid] = directive_for(report, mine, machine, settings, now)
    snapshot = machines if isinstance(machines, dict) else dict(machines)
    return told, recomputed, DirectiveMemory(settings.heartbeat_minutes, told, snapshot, named_in, changes)


def _judged_instances(record: MachineRecord) -> frozenset[str]:
    return record.derived("due.instances", MachineRecord.judged_instances)


def _named_in(records: Iterable[MachineRecord]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for rec in records:
        for iid in _judged_instances(rec):
            out[iid] = (*out.get(iid, ()), rec.machine_id)
    return out


def _renamed(named_in: dict[str, tuple[str, ...]], machine_id: str, old: MachineRecord | None,
             new: MachineRecord | None) -> None:
    before = _judged_instances(old) if old is not None else frozenset()
    after = _judged_instances(new) if new is not None else frozenset()
    for iid in before - after:
        kept = tuple(m for m in named_in.get(iid, ()) if m != machine_id)
        if kept:
            named_in[iid] = kept
        else:
            named_in.pop(iid, None)
    for iid in after - before:
        named_in[iid] = (*named_in.get(iid, ()), machine_id)


def _entries_of(iid: str, machine_ids: tuple[str, ...], machines: Mapping[str, MachineRecord]
                ) -> tuple[list[BenchmarkEntry], MachineRecord | None]:
    """The entries naming `iid` across the records, in the records' order, and the last record naming it (as
    `serving.directives` collects them)."""
    if not machine_ids:
        return [], None
    order = machine_ids if len(machine_ids) == 1 else [m for m in machines if m in machine_ids]
    mine: list[BenchmarkEntry] = []
    last = None
    for m in order:
        rec = machines.get(m)
        if rec is None:
            continue
        mine += [b for b in rec.benchmarks if b.instance_id == iid]
        last = rec
    return mine, last


def _by_machine(reports: Iterable[InstanceReport]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in reports:
        if r.machine_id is not None:
            out.setdefault(r.machine_id, set()).add(r.instance_id)
    return out


def _standing_change(record: MachineRecord, now: datetime) -> datetime | None:
    """The next time after `now` at which this record's standing (`standing_of`) can change by itself: its newest
    bad entry expiring, or its probation ending."""
    last = record.last_bad_entry()
    if last is None:
        return None
    times = [t for t in (last.expiry(), record_time(last.probation_until)) if t is not None and t > now]
    return min(times, default=None)


