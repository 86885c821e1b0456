"""Timing helpers, the `Figure` every benchmark returns, and git for the benchmarks' repositories."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: git for the benchmarks' repositories: no user or system config, never a prompt.
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    """Run git in `cwd`; its stdout, or RuntimeError with its stderr."""
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, check=False,
                          env={**os.environ, **GIT_ENV})
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode()


def fast_import_data(text: str | bytes) -> bytes:
    """A `data` command of a `git fast-import` stream."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return b"data %d\n" % len(raw) + raw + b"\n"


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
#: acknowledged only once written to the OS (synchronous_commit=on, PostgreSQL's default, said here explicitly),
#: and not fsynced (fsync=off): what SQLite's synchronous=NORMAL promises, so both stores are measured on the same
#: durability (a killed database loses nothing acknowledged; an OS crash may lose the last commits).
POSTGRES_SETTINGS = {"synchronous_commit": "on", "fsync": "off"}
