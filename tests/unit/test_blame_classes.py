"""Blame classes in the verdict registry (domain/verdicts.py): which blame marks a machine bad, which counts
against an image; signatures use registered blames only (schema enums: tests/unit/test_verdict_kinds.py)."""

from __future__ import annotations

import pytest

from reconciler.domain.breaker import CORRELATED_VERDICTS
from reconciler.domain.signatures import SIGNATURES
from reconciler.domain.verdicts import (
    BLAME_CLASSES,
    BLAMES,
    VERDICT_KINDS,
    VERDICTS,
    blame_class,
    counts_against_image,
    verdict_kind,
)


def test_every_failure_not_positively_attributed_counts_against_an_image_and_only_failures_correlate() -> None:
    # Issue 23 item 1: image, configuration and unexplained failures count; the machine, the network, the params
    # mirror and the marketplace are positive attributions that never do (a CUDA-code-only machine blame: breaker).
    assert [b for b in BLAMES if BLAME_CLASSES[b].counts_against_image] == ["image", "configuration", "unknown"]
    # lost (serving): the same image failing or falling silent on K machines is evidence against the image too;
    # market-deadline: the same image failing the Snark Market's proofs on K machines, likewise
    assert {"benchmark-error", "params-failed", "timeout", "lost", "market-deadline"} == CORRELATED_VERDICTS
    for blame in ("image", "configuration", "unknown"):
        assert counts_against_image("benchmark-error", blame), blame
    assert not counts_against_image("below-min-rate", "machine") and not counts_against_image("stale-image", "image")
    for blame in ("machine", "network", "params", "marketplace", "none"):
        assert not counts_against_image("benchmark-error", blame), blame


def test_which_blames_mark_a_machine_bad() -> None:
    assert {b: BLAME_CLASSES[b].marks_machine for b in BLAMES} == {
        "none": "no", "machine": "yes", "image": "no", "network": "strike", "params": "no",
        "configuration": "no", "marketplace": "no", "unknown": "no"}


def test_every_signature_blame_is_registered_and_unknown_names_are_errors() -> None:
    assert {s.blame for s in SIGNATURES} <= set(BLAMES) - {"none"}
    with pytest.raises(KeyError, match="blame 'gpu' is not registered"):
        blame_class("gpu")
    with pytest.raises(KeyError, match="verdict 'slow' is not registered"):
        verdict_kind("slow")
    assert all(not VERDICT_KINDS[v].correlates for v in VERDICTS if not VERDICT_KINDS[v].can_mark_bad)
