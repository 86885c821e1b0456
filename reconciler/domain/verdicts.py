"""Verdict kinds and blame classes: the one place that says what each kind of verdict means.

Adding a kind (e.g. `degraded`, `lost` once machines serve) means one entry here: whether it measures a
rate (and so feeds offer ranking and the status charts), whether the circuit breaker may correlate it
across machines, whether it can ever mark a machine bad, and its label for renderers. The record schema's
enum (fleet-spec/schema/machine-record.schema.json) must list the same names; a test holds them equal.
`verdict.judge` decides WHICH kind applies; this table says what that kind then implies.

Blame classes (issue 13) live here too: who must act, whether a verdict with that blame marks the machine
bad, and whether it is evidence against the image. The circuit breaker counts every failure that is not
positively attributed to the machine, the network, the params mirror or the marketplace (issue 23 item 1):
image, configuration and unknown blame; the same unexplained failure on K distinct machines with one image is
exactly the correlation the breaker exists for (the seed incident: exit 1 after 0 proofs, blame unknown).
- machine: the rented machine (GPU hardware or driver, host runtime, too slow). Marks the machine bad.
- image: our software (worker scripts, the cuzk build, benchmark inputs). Never marks a machine bad; counts
  against the image digest.
- network: the machine's network while fetching params. A strike: the Nth such failure marks it bad
  (verdict.PARAMS_FAILURES_BEFORE_BAD).
- params: the params source or its set-up (mirror 404, missing SRS or c1.json): fix `params.*`.
- configuration: the pool is sized or set up wrong for the workload (VRAM, host RAM, disk): the verdict names
  the setting to change; neither the machine nor the image is at fault. Counts for the breaker: the same fault
  on K machines pauses the pool until the setting (or image) is fixed, instead of renting more that fail.
- marketplace: the marketplace or host stopped or withheld the instance (stop signals).
- unknown: no signature explains the failure; never marks a machine bad; counts for the breaker (keyed by a
  signature made of phase, exit code and the normalised last error line: `verdict.unrecognized_signature`).
- none: a passing verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")


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
    VerdictKind("market-deadline", "while serving, the machine missed the Snark Market's deadline (PSProve tasks "
                "failing, or ending or running past the deadline, on it)", False, True, True,
                "missed market deadlines"),
)}

VERDICTS: tuple[str, ...] = tuple(VERDICT_KINDS)
RATE_VERDICTS = frozenset(k.name for k in VERDICT_KINDS.values() if k.measures_rate)
CORRELATED_VERDICTS = frozenset(k.name for k in VERDICT_KINDS.values() if k.correlates)



@dataclass(frozen=True)
class BlameClass:
    name: str
    #: "yes": a verdict with this blame marks the machine bad; "strike": only the Nth params failure; "no": never.
    marks_machine: str
    counts_against_image: bool  # evidence the circuit breaker counts against the image digest
    owner: str  # who must act (status, commit messages)
    meaning: str


BLAME_CLASSES: dict[str, BlameClass] = {b.name: b for b in (
    BlameClass("none", "no", False, "nobody", "the benchmark passed"),
    BlameClass("machine", "yes", False, "the machine (excluded from offers)",
               "GPU hardware or driver, host runtime, or too slow"),
    BlameClass("image", "no", True, "us: the worker image", "our software: scripts, the cuzk build, benchmark inputs"),
    BlameClass("network", "strike", False, "the machine's network (strikes)",
               "the machine's network failed while fetching params"),
    BlameClass("params", "no", False, "us: the params set-up",
               "the params source or set-up: mirror, manifest, missing SRS or c1.json"),
    BlameClass("configuration", "no", True, "us: the pool's settings",
               "the pool is sized or set up wrong for the workload (VRAM, host RAM, disk)"),
    BlameClass("marketplace", "no", False, "the marketplace",
               "the marketplace or host stopped or withheld the instance"),
    BlameClass("unknown", "no", True, "nobody yet (unexplained)",
               "no signature explains the failure; read the evidence"),
)}

#: Who a verdict blames. `none` for passing verdicts; `unknown` when the evidence names nobody (never bad).
BLAMES: tuple[str, ...] = tuple(BLAME_CLASSES)


def _registered(table: Mapping[str, _T], what: str, name: str) -> _T:
    """The entry registered under `name`; an unregistered name is a programming error (the KeyError names it)."""
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"{what} {name!r} is not registered in domain/verdicts.py (known: {', '.join(table)})") \
            from None


def blame_class(name: str) -> BlameClass:
    """The registered blame class (KeyError for an unregistered name)."""
    return _registered(BLAME_CLASSES, "blame", name)


def verdict_kind(name: str) -> VerdictKind:
    return _registered(VERDICT_KINDS, "verdict", name)


def counts_against_image(verdict: str, blame: str) -> bool:
    """Whether a verdict with this blame is evidence against its image digest (the circuit breaker)."""
    kind = VERDICT_KINDS.get(verdict)
    cls = BLAME_CLASSES.get(blame)
    return bool(kind and kind.correlates and cls and cls.counts_against_image)
