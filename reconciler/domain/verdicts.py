"""Verdict kinds and blame classes: the one place that says what each kind of verdict means.

Adding a kind (e.g. `degraded`, `lost` once machines serve) means one entry here: whether it measures a
rate (and so feeds offer ranking and the status charts), whether the circuit breaker may correlate it
across machines, whether it can ever mark a machine bad, and its label for renderers. The record schema's
enum (fleet-spec/schema/machine-record.schema.json) must list the same names; a test holds them equal.
`verdict.judge` decides WHICH kind applies; this table says what that kind then implies.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VerdictKind:
    name: str
    meaning: str
    measures_rate: bool  # its entries carry a trustworthy proofs/hour (perf history, ranking, charts)
    correlates: bool  # failures of this kind on K machines with one image + signature can trip the breaker
    can_mark_bad: bool  # whether this kind is ever evidence against the machine
    label: str  # short human label (status, page)


VERDICT_KINDS: dict[str, VerdictKind] = {k.name: k for k in (
    VerdictKind("ok", "benchmark completed at or above the pool's minimum rate", True, False, False, "passed"),
    VerdictKind("below-min-rate", "benchmark completed below the pool's minimum rate", True, False, True, "slow"),
    VerdictKind("benchmark-error", "the daemon or cuzk-bench failed (exit code, failed proofs, no summary)",
                False, True, True, "benchmark failed"),
    VerdictKind("params-failed", "the proving parameters could not be fetched or verified", False, True, True,
                "params failed"),
    VerdictKind("timeout", "no result before the pool's benchmark deadline (partial proofs counted)", False, True,
                True, "timed out"),
    VerdictKind("stale-image", "the instance runs an image digest that is not the desired one", False, False, False,
                "stale image"),
    # After admission (domain/serving.py). Their rates are estimates (a partial benchmark, a serving window),
    # not benchmark measurements: they do not feed ranking.
    VerdictKind("early-below-min-rate", "benchmark ended early: even its best case after the warm-up could not "
                "reach the pool's minimum rate", False, False, True, "hopeless (ended early)"),
    VerdictKind("degraded", "while serving, the rolling rate stayed below the pool's minimum (with margin) for "
                "the whole hysteresis period", False, False, True, "degraded"),
    VerdictKind("lost", "while serving, heartbeats stopped past the deadline (or the worker failed)", False, True,
                True, "lost"),
)}

VERDICTS: tuple[str, ...] = tuple(VERDICT_KINDS)
RATE_VERDICTS = frozenset(k.name for k in VERDICT_KINDS.values() if k.measures_rate)
CORRELATED_VERDICTS = frozenset(k.name for k in VERDICT_KINDS.values() if k.correlates)

#: Who a verdict blames. `none` for passing verdicts; `unknown` when the evidence names nobody (never bad).
#: `marketplace`: the host or the market went away (a lost machine); expires soon, like network faults.
BLAMES: tuple[str, ...] = ("none", "machine", "image", "network", "unknown", "marketplace")
