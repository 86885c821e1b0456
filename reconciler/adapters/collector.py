"""Python's cyclic garbage collector around bulk work: a base every adapter and the flows may use.

A record load, an index build or one reconcile pass at fleet size allocates millions of objects (10,000
reports with their events, 100,000 record entries) that mostly stay alive for the whole step. CPython's
collector runs a generation each time allocations outnumber frees by its threshold, and each full run walks
every live object again: at that size those runs were half of a cold `fleet reconcile --once` (2.6 s of 5.2 s,
bench/notes.md). None of these objects sits in a reference cycle that must be freed during the step (refcounts
free them), so the collector is paused for the step and resumes after it.

What the step allocated is still in the collector's young generation when it resumes, and its next young
collection (at the first allocation) would walk all of it once: 1.4 s after the 30-day replay of a 10,000-machine
fleet (`fleet plan --what-if`). So the block's survivors are handed to the oldest generation first
(`gc.freeze()` then `gc.unfreeze()`, two list splices: CPython's documented way to move every tracked object
there), where the next full collection still frees any cycle among them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector paused for the block (refcounting still frees everything acyclic); it runs again
    after the block as it was before (a nested block leaves it to the outer one), with what the block left in
    the oldest generation. Objects a caller froze itself (`gc.freeze`, e.g. before a fork) stay frozen."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:  # (unfreeze would thaw a caller's frozen objects too)
                gc.freeze()
                gc.unfreeze()
            gc.enable()
