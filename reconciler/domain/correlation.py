"""The fleet decides the unknowns: a failure no specific line explains is decided by correlation across the fleet,
or by one retest of the same machine (issue 29 item 4). Pure.

Place in the flow: `judging.decide` runs this on the pass's verdicts after `verdict.judge` and before the guards
(`breaker.apply_guards`, which decides the image correlation as before); the planner asks `retest_machines` which
machines a pool should rent again; `fleet why` and status show the correlation and retest evidence it writes.

For an `unknown` admission failure (benchmark-error, params-failed, timeout; not held yet), over the recorded
verdicts of the circuit breaker's window and the pass's earlier ones, in this order:
- machine, two images: the same machine failed with the same signature under another image digest -> the
  machine (its failure follows it across our builds). For a params failure the machine's network.
- machine, twice: the same machine failed with the same signature before, and another machine passed with this
  image -> the machine (the image works elsewhere); the machine's network for a params failure.
- the mirror: a params failure, and unknown params failures from the same params source on K distinct machines
  (circuit_breaker.distinct_machines) while no machine got past its params phase since they began -> the mirror:
  `params` blame, `params.base_url` to change (never a strike). "By status": when other machines did fetch since,
  it is not the mirror; each machine's own history (twice -> its network) or a retest decides.
- the image: the same signature on K distinct machines with one image -> the circuit breaker holds it (as before;
  breaker.py writes the correlation into the verdict's evidence).
- otherwise a retest: the verdict is held for a retest (`held_by: retest`, never marks bad) within the pool's
  retest budget (spec.retest: per pool and window); the planner rents the same machine again while it is offered.
  The retest's verdict names the unknown it retested and its outcome (`evidence.retest`): passed (the failure did
  not recur), failed again the same way (the machine rule decides if others pass the image; else it stays unknown
  and the breaker counts it), or failed differently (judged on its own). One retest per machine and window.

Every decided verdict keeps its reason and says which correlation decided it (`evidence.correlation` and the
reason's `decided by the fleet: ...`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from reconciler.domain.observations import format_time
from reconciler.domain.quick_init import quick_init
from reconciler.domain.records import RecordSet
from reconciler.domain.retests import HELD_FOR_RETEST, Fact, record_facts
from reconciler.domain.spec import FleetSpec
from reconciler.domain.verdict import HELD_BY_CIRCUIT_BREAKER, Verdict

#: The admission failures the fleet correlates (serving verdicts have their own rules).
CORRELATED = frozenset({"benchmark-error", "params-failed", "timeout"})

RULE_MACHINE_TWO_IMAGES = "machine: two images"
RULE_MACHINE_TWICE = "machine: twice while others pass"
RULE_MIRROR = "mirror"
RULE_IMAGE = "image"
RULE_RETEST = "retest"
RULE_NONE = "none"

SETTING_MIRROR = "params.base_url (the params source failed on several machines at once)"


@quick_init
@dataclass(frozen=True)
class Correlated:
    verdicts: tuple[Verdict, ...]
    notes: tuple[str, ...] = ()


def fact_of(v: Verdict) -> Fact | None:
    if v.machine_id is None:
        return None
    source = v.evidence.get("params_source")
    return Fact(v.machine_id, v.instance_id, v.pool, v.image_digest, v.verdict, v.blame, v.signature, v.held_by,
                v.at, source if isinstance(source, str) else None)


def recorded_facts(records: RecordSet, since: datetime) -> list[Fact]:
    """Every recorded admission verdict at or after `since` (each record's facts found once per record object)."""
    return [f for rec in records.machines.values() for f in rec.derived("retests.facts", record_facts)
            if f.at >= since]


def correlate(spec: FleetSpec, records: RecordSet, verdicts: Sequence[Verdict], now: datetime) -> Correlated:
    """The pass's verdicts with every `unknown` admission failure decided by the fleet where a correlation says
    who, else held for a retest (module docstring); a verdict on a machine with a retest pending says its outcome.

    The fleet's recorded facts are read only when a verdict needs the fleet (an undecided failure): a retest's
    outcome needs its own machine's record only, and most passes have neither (every record's entries is most
    of a cold pass's time at 10,000 machines)."""
    window = timedelta(hours=spec.circuit_breaker.window_hours)
    retest_window = timedelta(hours=spec.retest.window_hours)
    since = now - max(window, retest_window)
    fleet: list[Fact] | None = None  # every recorded fact since `since`, then this pass's: read on first need
    judged: list[Fact] = []  # this pass's, in order
    notes: list[str] = []
    out: list[Verdict] = []
    for v in verdicts:
        if _may_be_a_retest(v):
            mine = [f for f in fleet if f.machine_id == v.machine_id] if fleet is not None else [
                *(f for rec in records.records_of([str(v.machine_id)])
                  for f in rec.derived("retests.facts", record_facts) if f.at >= since),
                *(f for f in judged if f.machine_id == v.machine_id)]
            v = _with_retest_outcome(v, mine, now - retest_window)
        if _undecided(v):
            if fleet is None:
                fleet = [*recorded_facts(records, since), *judged]
            v, note = _decide(spec, v, fleet, now)
            if note:
                notes.append(note)
        out.append(v)
        if (fact := fact_of(v)) is not None:
            judged.append(fact)
            if fleet is not None:
                fleet.append(fact)
    return Correlated(tuple(out), tuple(notes))


def _undecided(v: Verdict) -> bool:
    return (v.blame == "unknown" and v.verdict in CORRELATED and v.held_by is None and v.machine_id is not None
            and v.is_failure)


def _decide(spec: FleetSpec, v: Verdict, history: Sequence[Fact], now: datetime) -> tuple[Verdict, str | None]:
    since = now - timedelta(hours=spec.circuit_breaker.window_hours)
    recent = [f for f in history if f.at >= since]
    # The same failure on this machine before; one the circuit breaker already put on an image is the image's.
    same = [f for f in recent if f.machine_id == v.machine_id and f.signature == v.signature
            and f.instance_id != v.instance_id and f.verdict != "ok" and f.held_by != HELD_BY_CIRCUIT_BREAKER]
    other_images = sorted({f.image_digest for f in same if f.image_digest and f.image_digest != v.image_digest})
    params = v.verdict == "params-failed"
    owner = "network" if params else "machine"
    if other_images and v.image_digest:
        detail = (f"the same failure ({v.signature}) on machine {v.machine_id} under image {_short(v.image_digest)} "
                  f"and image {', '.join(_short(d) for d in other_images)}: it follows the machine, not our build")
        return _decided(v, RULE_MACHINE_TWO_IMAGES, owner, detail, instances=[f.instance_id for f in same],
                        images=[v.image_digest, *other_images]), None
    passed = sorted({f.machine_id for f in recent if f.verdict == "ok" and f.image_digest == v.image_digest
                     and f.machine_id != v.machine_id})
    if same and passed:
        detail = (f"the same failure ({v.signature}) twice on machine {v.machine_id} (instances "
                  f"{', '.join([*(f.instance_id for f in same), v.instance_id])}) while machine(s) "
                  f"{', '.join(passed[:5])} passed image {_short(v.image_digest)}")
        return _decided(v, RULE_MACHINE_TWICE, owner, detail, instances=[f.instance_id for f in same],
                        machines=passed), None
    if params:
        decided = _mirror(spec, v, recent)
        if decided is not None:
            return decided, f"params source {v.evidence.get('params_source')} decided by the fleet: {decided.reason}"
    return _retest_or_hold(spec, v, history, now)


def _mirror(spec: FleetSpec, v: Verdict, recent: Sequence[Fact]) -> Verdict | None:
    source = v.evidence.get("params_source")
    if not isinstance(source, str):
        return None
    failing = [f for f in recent if f.verdict == "params-failed" and f.blame == "unknown" and f.source == source]
    machines = sorted({f.machine_id for f in failing} | {str(v.machine_id)})
    if len(machines) < spec.circuit_breaker.distinct_machines:
        return None
    began = min([f.at for f in failing] + [v.at])
    fetched = sorted({f.machine_id for f in recent if f.verdict != "params-failed" and f.at >= began
                      and f.machine_id not in machines})
    if fetched:
        return None  # others fetched since: not the mirror (each machine's history or a retest decides)
    detail = (f"params source {source} failed on {len(machines)} machines ({', '.join(machines)}) within "
              f"{spec.circuit_breaker.window_hours:g}h and no machine got past its params phase since: the mirror")
    return _decided(v, RULE_MIRROR, "params", detail, machines=machines, setting=SETTING_MIRROR)


def _retest_or_hold(spec: FleetSpec, v: Verdict, history: Sequence[Fact], now: datetime) -> tuple[Verdict, str | None]:
    since = now - timedelta(hours=spec.retest.window_hours)
    until = v.at + timedelta(hours=spec.retest.window_hours)
    mine = [f for f in history if f.machine_id == v.machine_id and f.at >= since]
    if any(f.held_by == HELD_FOR_RETEST for f in mine):
        why = ("this machine was retested for an unknown failure within "
               f"{spec.retest.window_hours:g}h already: no second retest; the circuit breaker counts it")
        return _with_correlation(v, {"rule": RULE_NONE, "decided": None, "detail": why}), None
    if not spec.retest.enabled:
        return _with_correlation(v, {"rule": RULE_NONE, "decided": None,
                                     "detail": "retests are off (retest.enabled: false)"}), None
    used = sorted({f.machine_id for f in history if f.pool == v.pool and f.held_by == HELD_FOR_RETEST
                   and f.at >= since})
    if len(used) >= spec.retest.max_per_pool:
        why = (f"retest budget of pool {v.pool} used ({len(used)}/{spec.retest.max_per_pool} within "
               f"{spec.retest.window_hours:g}h: machines {', '.join(used)}): held as unknown; the breaker counts it")
        return _with_correlation(v, {"rule": RULE_NONE, "decided": None, "detail": why}), \
            f"machine {v.machine_id}: {why}"
    detail = (f"no correlation decides it yet: machine {v.machine_id} is benchmarked once more (a new instance on it "
              f"while it is offered) until {format_time(until)}; the retest decides")
    held = replace(v, held_by=HELD_FOR_RETEST, marks_bad=False)
    return _with_correlation(held, {"rule": RULE_RETEST, "decided": None, "detail": detail, "pending": True,
                                    "until": format_time(until)}), \
        f"machine {v.machine_id}: retest requested for {v.signature} (pool {v.pool})"


def _decided(v: Verdict, rule: str, blame: str, detail: str, *, instances: Iterable[str] = (),
             machines: Iterable[str] = (), images: Iterable[str] = (), setting: str | None = None) -> Verdict:
    marks_bad = blame in ("machine", "network")
    evidence: dict[str, Any] = {"rule": rule, "decided": blame, "detail": detail}
    if instances:
        evidence["instances"] = list(instances)
    if machines:
        evidence["machines"] = list(machines)
    if images:
        evidence["images"] = list(images)
    decided = replace(v, blame=blame, marks_bad=marks_bad, reason=f"{v.reason}; decided by the fleet: {detail}",
                      setting=setting or v.setting)
    if setting:
        decided = replace(decided, evidence={**decided.evidence, "setting": setting})
    return _with_correlation(decided, evidence)


def _with_correlation(v: Verdict, correlation: Mapping[str, Any]) -> Verdict:
    return replace(v, evidence={**v.evidence, "correlation": dict(correlation)})


def _may_be_a_retest(v: Verdict) -> bool:
    # A stale image retests nothing; serving verdicts come after admission.
    return v.machine_id is not None and v.verdict in (*CORRELATED, "ok", "below-min-rate")


def _with_retest_outcome(v: Verdict, history: Sequence[Fact], since: datetime) -> Verdict:
    """A verdict on a machine whose newest recorded attempt is held for a retest is that retest: its outcome
    (`history`: its machine's facts, oldest first, or the fleet's)."""
    if not _may_be_a_retest(v):
        return v
    mine = [f for f in history if f.machine_id == v.machine_id and f.instance_id != v.instance_id]
    if not mine or mine[-1].held_by != HELD_FOR_RETEST or mine[-1].at < since:
        return v
    of = mine[-1]
    if not v.is_failure:
        outcome = "passed: the unknown failure did not recur (not the machine's fault)"
    elif v.verdict == "below-min-rate":
        outcome = "completed, below the minimum rate: judged on its own"
    elif v.signature == of.signature:
        outcome = "failed again the same way"
    else:
        outcome = f"failed differently ({v.signature}): judged on its own"
    retest = {"of": of.instance_id, "signature": of.signature, "requested_at": format_time(of.at),
              "outcome": outcome}
    return replace(v, reason=f"{v.reason} [retest of {of.instance_id}: {outcome}]",
                   evidence={**v.evidence, "retest": retest})


def _short(digest: str | None) -> str:
    return "(none)" if not digest else digest[:19]
