"""Retests pending: which machines are held for one more benchmark (an unknown failure no correlation decided),
read from the records. Light on purpose: the planner asks it for its slots' machines without importing the judge.

`correlation.py` holds a verdict for a retest (`held_by: retest`) and says the retest's outcome; the planner
(`planner.plan`) rents the machine of a pending retest again for the slot whose instance failed, while the market
offers it; status and `fleet why` show the pending retest (the entry's `held_by`) and its outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.domain.observations import parse_time
from reconciler.domain.quick_init import quick_init
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordSet
from reconciler.domain.spec import FleetSpec

#: The `held_by` of an unknown failure no correlation decided: the machine is benchmarked once more.
HELD_FOR_RETEST = "retest"


@quick_init
@dataclass(frozen=True)
class Fact:
    """One judged attempt, reduced to what the correlation reads."""

    machine_id: str
    instance_id: str
    pool: str | None
    image_digest: str | None
    verdict: str
    blame: str
    signature: str | None
    held_by: str | None
    at: datetime
    #: A params failure's source (`evidence.params_source`: the mirror's scheme://host, or curio fetch-params).
    source: str | None = None


@dataclass(frozen=True)
class RetestPending:
    machine_id: str
    pool: str | None
    instance_id: str
    signature: str | None
    at: datetime
    until: datetime


def _fact_of_entry(machine_id: str, e: BenchmarkEntry) -> Fact | None:
    try:
        at = parse_time(e.at)
    except ValueError:
        return None
    source = None
    if e.verdict == "params-failed" and e.blame == "unknown":  # evidence read only where the mirror rule needs it
        value = e.evidence.get("params_source") if isinstance(e.evidence, Mapping) else None
        source = value if isinstance(value, str) else None
    return Fact(machine_id, e.instance_id, e.pool, e.image_digest, e.verdict, e.blame, e.signature, e.held_by, at,
                source)


def record_facts(record: MachineRecord) -> tuple[Fact, ...]:
    """A record's admission attempts, oldest first (remembered on the record object: `MachineRecord.derived`)."""
    return tuple(f for e in record.benchmarks if e.stage != "serving"
                 and (f := _fact_of_entry(record.machine_id, e)) is not None)


def retests_pending(records: RecordSet, spec: FleetSpec, now: datetime,
                    machine_ids: Iterable[str] | None = None) -> dict[str, RetestPending]:
    """Machines whose newest admission attempt is held for a retest that is still due (within retest.window_hours
    of the unknown failure), of `machine_ids` only when given (the planner asks for its slots' machines)."""
    window = timedelta(hours=spec.retest.window_hours)
    recs = records.machines.values() if machine_ids is None else records.records_of(sorted(set(machine_ids)))
    out: dict[str, RetestPending] = {}
    for rec in recs:
        facts = rec.derived("retests.facts", record_facts)
        if facts and facts[-1].held_by == HELD_FOR_RETEST and now < facts[-1].at + window:
            last = facts[-1]
            out[rec.machine_id] = RetestPending(rec.machine_id, last.pool, last.instance_id, last.signature, last.at,
                                                last.at + window)
    return out
