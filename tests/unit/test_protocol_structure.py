"""The structure check at the controller's edge (depth, integer range, finite numbers, valid Unicode) has a
fast path for the ingest hot path (issue 14); it must accept exactly what the full walk accepts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reconciler.adapters.controller.protocol import (
    MAX_JSON_DEPTH,
    _structure_sound,
    _structure_walk,
    structure_problems,
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
