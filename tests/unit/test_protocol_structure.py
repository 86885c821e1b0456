"""The structure check at the controller's edge (depth, integer range, finite numbers, valid Unicode) has a
fast path for the ingest hot path (issue 14); it must accept exactly what the full walk accepts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reconciler.adapters.controller.protocol import (
    MAX_JSON_DEPTH,
    ApiError,
    _structure_sound,
    _structure_walk,
    structure_problems,
    validate_event_batch,
    validate_report,
)

LEAVES = (st.none() | st.booleans() | st.integers(min_value=-2**60, max_value=2**60)
          | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6)
          | st.sampled_from(["\ud800", "a\udfffb", "ok"]))
VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=4) | st.just("\udc00"), inner, max_size=4), max_leaves=30)


@given(VALUES)
def test_fast_structure_check_agrees_with_the_full_walk(value: object) -> None:
    assert _structure_sound(value) == (_structure_walk(value) == [])
    assert structure_problems(value) == _structure_walk(value)


def test_fast_structure_check_counts_depth_as_the_walk_does() -> None:
    for depth in range(MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 3):
        for leaf in ([], "s", 1, {}, {"k": "v"}):
            value: object = leaf
            for _ in range(depth):
                value = [value]
            assert _structure_sound(value) == (_structure_walk(value) == []), (depth, leaf)
            assert structure_problems(value) == _structure_walk(value)


GOOD_EVENT = {"protocol": 1, "phase": "params", "status": "progress", "at": "2026-12-02T18:00:00Z"}


@given(VALUES)
def test_a_batch_is_checked_as_its_events_would_be_one_by_one(details: object) -> None:
    event = {**GOOD_EVENT, "details": details}
    try:
        validate_report("event", event)
        alone: list[dict[str, object]] = []
    except ApiError as exc:
        alone = [{**p, "path": f"$.events[1]{p['path'][1:]}", "index": 1} for p in exc.detail]
    try:
        validate_event_batch({"protocol": 1, "events": [GOOD_EVENT, event]})
        in_batch: list[dict[str, object]] = []
    except ApiError as exc:
        in_batch = exc.detail
    assert in_batch == alone
