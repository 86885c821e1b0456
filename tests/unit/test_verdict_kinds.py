"""The verdict-kind registry is the one list of kinds: the record schema and the breaker agree with it."""

from __future__ import annotations

import json

from reconciler import SCHEMA_DIR
from reconciler.domain.breaker import CORRELATED_VERDICTS
from reconciler.domain.verdicts import BLAMES, RATE_VERDICTS, VERDICT_KINDS, VERDICTS


def _benchmark_entry_schema() -> dict:
    schema = json.loads((SCHEMA_DIR / "machine-record.schema.json").read_text())
    found = [node for node in _walk(schema) if isinstance(node, dict) and "verdict" in node and "blame" in node]
    assert found, "machine-record schema has no benchmark entry with verdict and blame"
    return found[0]


def _walk(node: object):  # type: ignore[no-untyped-def]
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def test_the_record_schema_lists_exactly_the_registered_verdict_kinds_and_blames() -> None:
    entry = _benchmark_entry_schema()
    assert entry["verdict"]["enum"] == list(VERDICTS)
    assert entry["blame"]["enum"] == list(BLAMES)


def test_derived_sets_come_from_the_registry() -> None:
    assert {"ok", "below-min-rate"} == RATE_VERDICTS
    assert {k for k, v in VERDICT_KINDS.items() if v.correlates} == CORRELATED_VERDICTS
    assert "stale-image" not in CORRELATED_VERDICTS and not VERDICT_KINDS["stale-image"].can_mark_bad
