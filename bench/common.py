"""Timing helpers and the `Figure` every benchmark returns."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One measured number. `target` is e.g. "< 2 s" with `passed` set, or None for context figures."""

    name: str
    value: float
    unit: str
    detail: str = ""
    target: str | None = None
    passed: bool | None = None

    def shown(self) -> str:
        if self.unit == "s":
            return f"{self.value:.3f} s" if self.value < 100 else f"{self.value:.0f} s"
        if self.unit == "ms":
            return f"{self.value:.2f} ms"
        if self.unit == "x":
            return f"{self.value:.2f}x"
        return f"{self.value:,.0f} {self.unit}"

    def verdict(self) -> str:
        if self.passed is None:
            return "-"
        return "PASS" if self.passed else "MISS"


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_time(fn: Callable[[], object], repeats: int, setup: Callable[[], object] | None = None) -> float:
    """Median wall time of `repeats` runs of `fn` (each after `setup`, which is not timed)."""
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        times.append(timed(fn))
    return statistics.median(times)


#: Settings of the PostgreSQL server the benches start (beyond tests/postgres_server.py's): a commit is
#: acknowledged only once written to the OS (synchronous_commit=on; the test server's `off` acknowledges before),
#: and not fsynced (fsync=off): what SQLite's synchronous=NORMAL promises, so both stores are measured on the same
#: durability (a killed database loses nothing acknowledged; an OS crash may lose the last commits).
POSTGRES_SETTINGS = {"synchronous_commit": "on", "fsync": "off"}
