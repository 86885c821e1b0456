"""`make bench` = `python -m bench`: run every benchmark, print the figures, write bench/results.md.

`python -m bench pass git ingest ranking` runs a subset (results.md is only written for a full run).
Figures are medians of several repetitions on whatever machine runs them; the load average at start and
end is printed with them, because other work on the machine moves every number.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench import bench_git, bench_ingest, bench_pass, bench_ranking
from bench.common import Figure

BENCHES: dict[str, Callable[[], list[Figure]]] = {
    "pass": bench_pass.run,
    "git": bench_git.run,
    "ingest": bench_ingest.run,
    "ranking": bench_ranking.run,
}
RESULTS = Path(__file__).with_name("results.md")
NOTES = Path(__file__).with_name("notes.md")


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (1 min) / {five:.1f} (5 min)"


def table(figures: list[Figure]) -> list[str]:
    rows = ["| figure | value | target | result | detail |", "|---|---|---|---|---|"]
    rows += [f"| {f.name.strip()} | {f.shown()} | {f.target or ''} | {f.verdict()} | {f.detail} |" for f in figures]
    return rows


def main(argv: list[str]) -> int:
    chosen = argv or list(BENCHES)
    unknown = [name for name in chosen if name not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    started, load_before = time.perf_counter(), _load()
    print(f"bench: {os.cpu_count()} CPUs, load average {load_before}", flush=True)
    figures: list[Figure] = []
    for name in chosen:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        for figure in BENCHES[name]():
            figures.append(figure)
            target = f"  [target {figure.target}: {figure.verdict()}]" if figure.target else ""
            print(f"  {figure.name}: {figure.shown()}{target}\n      {figure.detail}", flush=True)
        print(f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
    total, load_after = time.perf_counter() - started, _load()
    print(f"bench: done in {total:.0f} s; load average now {load_after}")
    if argv:
        return 0
    lines = [
        "# Benchmark results", "",
        f"Written by `make bench` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} CPUs "
        f"({platform.machine()}, Python {platform.python_version()}); load average {load_before} at start, "
        f"{load_after} at the end (the machine is shared: figures move with the load); total {total:.0f} s.", "",
        *table(figures), "",
    ]
    if NOTES.exists():
        lines += [NOTES.read_text(encoding="utf-8").rstrip(), ""]
    RESULTS.write_text("\n".join(lines), encoding="utf-8")
    print(f"bench: wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
