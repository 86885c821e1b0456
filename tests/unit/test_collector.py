"""adapters/collector.py: the collector paused around bulk work, and what the block allocated handed to the
oldest generation (not walked by the next young collection), with nothing lost to the collector."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from reconciler.adapters.collector import collector_paused


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def collector_as_found() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
        if not was:
            gc.disable()


def test_the_collector_is_paused_in_the_block_and_runs_after_it() -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_nested_block_leaves_it_to_the_outer_one() -> None:
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_what_the_block_allocated_is_not_left_in_the_young_generation() -> None:
    gc.collect()
    with collector_paused():
        kept = [[i] for i in range(200_000)]  # tracked objects that outlive the block
        assert gc.get_count()[0] >= 200_000  # (all young while the collector is paused)
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    # In the oldest generation already: no young collection walks them (left young, the first one after the block
    # would have, and moved them to the middle generation only).
    assert id(kept[0]) in oldest and id(kept[-1]) in oldest
    assert gc.get_freeze_count() == 0  # handed on, not frozen


def test_a_cycle_made_in_the_block_is_still_freed_by_a_full_collection() -> None:
    with collector_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a
        watch = weakref.ref(a)
        del a, b
    assert watch() is not None  # a cycle: refcounts alone do not free it
    gc.collect()
    assert watch() is None


def test_objects_a_caller_froze_stay_frozen() -> None:
    frozen = [[i] for i in range(10)]
    gc.freeze()
    before = gc.get_freeze_count()
    with collector_paused():
        more = [[i] for i in range(1000)]
    assert gc.get_freeze_count() == before  # not thawed by the block
    assert frozen and more
