"""Python's cyclic garbage collector around bulk work: a base every adapter and the flows may use.

A record load, an index build or one reconcile pass at fleet size allocates millions of objects (10,000
reports with their events, 100,000 record entries) that mostly stay alive for the whole step. CPython's
collector runs a generation each time allocations outnumber frees by its threshold, and each full run walks
every live object again: at that size those runs were half of a cold `fleet reconcile --once` (2.6 s of 5.2 s,
bench/notes.md). None of these objects sits in a reference cycle that must be freed during the step (refcounts
free them), so the collector is paused for the step and resumes after it, when it collects what the step left.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector paused for the block (refcounting still frees everything acyclic); it runs again
    after the block as it was before (a nested block leaves it to the outer one)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
