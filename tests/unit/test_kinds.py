"""The verdict-kind and blame-class registry (domain/kinds.py) is the one place these rules live: the record
schema, the records module, the breaker and the signatures all agree with it."""

from __future__ import annotations

import json

import pytest

from reconciler import SCHEMA_DIR
from reconciler.domain import records
from reconciler.domain.breaker import CORRELATED_VERDICTS
from reconciler.domain.kinds import (
    BLAME_CLASSES,
    BLAMES,
    VERDICT_KINDS,
    VERDICTS,
    blame_class,
    counts_against_image,
    verdict_kind,
)
from reconciler.domain.signatures import SIGNATURES


def _entry_schema() -> dict:
    schema = json.loads((SCHEMA_DIR / "machine-record.schema.json").read_text(encoding="utf-8"))
    return schema["$defs"]["entry"]["properties"]


def test_the_record_schema_enumerates_exactly_the_registry() -> None:
    props = _entry_schema()
    assert props["verdict"]["enum"] == list(VERDICTS), "add the new verdict kind to machine-record.schema.json"
    assert props["blame"]["enum"] == list(BLAMES), "add the new blame class to machine-record.schema.json"
    assert records.VERDICTS is VERDICTS and records.BLAMES is BLAMES


def test_only_image_blame_counts_against_an_image_and_only_failures_correlate() -> None:
    assert [b for b in BLAMES if BLAME_CLASSES[b].counts_against_image] == ["image"]
    assert {"benchmark-error", "params-failed", "timeout"} == CORRELATED_VERDICTS
    assert counts_against_image("benchmark-error", "image")
    assert not counts_against_image("below-min-rate", "machine") and not counts_against_image("stale-image", "image")
    for blame in ("machine", "network", "params", "configuration", "marketplace", "unknown", "none"):
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
    assert all(k.css in ("ok", "warn", "bad") for k in VERDICT_KINDS.values())
