"""Bounded, jittered exponential backoff shared by every retrying adapter (git push, marketplace HTTP).

Temporary errors are retried a bounded number of times; the pause between tries grows exponentially up
to a cap, and "equal jitter" (a uniform draw in the upper half) keeps clients that failed together from
retrying together.
"""

from __future__ import annotations


def backoff_delay(retry: int, base_s: float, max_s: float, jitter: float) -> float:
    """Pause before retry number `retry` (1 = the first retry). `jitter` is a draw in [0, 1)."""
    ceiling = min(max_s, base_s * 2 ** (retry - 1))
    return ceiling * (0.5 + 0.5 * jitter)
