"""The registry of verdict kinds and blame classes: every rule about what a verdict means, in one place.

Who reads it: `verdict.py` (which kinds exist, what a blame does to a machine), `breaker.py` (which
verdicts correlate and which blames count against an image or spend a pool's kill budget), `records.py`
(the values a record may carry; the record schema's enums are checked against this registry by a test),
`status.py` and the renderers (how a kind is labelled and styled). Adding a verdict kind or a blame class
means adding one entry here (and the schema's enum, which the registry test names when it is missing).

Blame classes (issue 13): who must act.
- machine: the rented machine (GPU hardware or driver, host runtime). Marks the machine bad.
- image: our software (worker scripts, cuzk build, benchmark inputs). Never marks a machine bad; the only
  evidence the circuit breaker counts against an image digest.
- network: the machine's network while fetching params. A strike: the second one marks the machine bad.
- params: the params source or its set-up (mirror 404, missing SRS or c1.json): fix `params.*`.
- configuration: the pool is sized or set up wrong for the workload (VRAM, host RAM, disk): fix the
  named setting; neither the machine nor the image is at fault.
- marketplace: the marketplace or host stopped or withheld the instance (stop signals, never started).
- unknown: no signature explains the failure; never marks a machine bad.
- none: a passing verdict.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlameClass:
    name: str
    #: "yes": the verdict marks the machine bad; "strike": only on the Nth such failure (params network
    #: policy, see verdict.PARAMS_FAILURES_BEFORE_BAD); "no": never.
    marks_machine: str
    #: Counted by the circuit breaker as evidence against the image digest (issue 14 item 5).
    counts_against_image: bool
    #: Who must act, for status and commit messages.
    owner: str
    description: str


@dataclass(frozen=True)
class VerdictKind:
    name: str
    failure: bool
    #: May the circuit breaker correlate this kind across machines (with an image-class blame)?
    correlates: bool
    #: Short label for tables; css class for HTML (ok / warn / bad).
    label: str
    css: str
    description: str


BLAME_CLASSES: dict[str, BlameClass] = {b.name: b for b in (
    BlameClass("none", "no", False, "nobody", "the benchmark passed"),
    BlameClass("machine", "yes", False, "the machine (excluded from offers)",
               "GPU hardware or driver, host runtime, or too slow"),
    BlameClass("image", "no", True, "us: the worker image",
               "our software: scripts, the cuzk build, benchmark inputs"),
    BlameClass("network", "strike", False, "the machine's network (strikes)",
               "the machine's network failed while fetching params"),
    BlameClass("params", "no", False, "us: the params set-up",
               "the params source or set-up: mirror, manifest, missing SRS or c1.json"),
    BlameClass("configuration", "no", False, "us: the pool's settings",
               "the pool is sized or set up wrong for the workload (VRAM, host RAM, disk)"),
    BlameClass("marketplace", "no", False, "the marketplace",
               "the marketplace or host stopped or withheld the instance"),
    BlameClass("unknown", "no", False, "nobody yet (unexplained)",
               "no signature explains the failure; read the evidence"),
)}

VERDICT_KINDS: dict[str, VerdictKind] = {k.name: k for k in (
    VerdictKind("ok", False, False, "ok", "ok", "benchmark completed at or above the pool's minimum rate"),
    VerdictKind("below-min-rate", True, False, "slow", "bad",
                "benchmark completed with proofs, below the pool's minimum rate (a measurement of one machine)"),
    VerdictKind("benchmark-error", True, True, "error", "bad",
                "the benchmark failed: non-zero exit, FAILED proofs, or no throughput line"),
    VerdictKind("params-failed", True, True, "params", "bad", "the params fetch failed or was too slow"),
    VerdictKind("timeout", True, True, "timeout", "warn", "no result before the pool's benchmark deadline"),
    VerdictKind("stale-image", True, False, "stale", "warn",
                "the instance ran another image digest than the desired one (never the machine's fault)"),
)}

VERDICTS: tuple[str, ...] = tuple(VERDICT_KINDS)
BLAMES: tuple[str, ...] = tuple(BLAME_CLASSES)


def blame_class(name: str) -> BlameClass:
    """The registered blame class; an unregistered name is a programming error (KeyError names it)."""
    try:
        return BLAME_CLASSES[name]
    except KeyError:
        raise KeyError(f"blame {name!r} is not registered in domain/kinds.py (known: {', '.join(BLAMES)})") from None


def verdict_kind(name: str) -> VerdictKind:
    try:
        return VERDICT_KINDS[name]
    except KeyError:
        raise KeyError(f"verdict {name!r} is not registered in domain/kinds.py (known: {', '.join(VERDICTS)})") \
            from None


def counts_against_image(verdict: str, blame: str) -> bool:
    """Whether a verdict with this blame is evidence against its image digest (circuit breaker)."""
    kind = VERDICT_KINDS.get(verdict)
    cls = BLAME_CLASSES.get(blame)
    return bool(kind and kind.correlates and cls and cls.counts_against_image)
