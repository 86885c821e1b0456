"""`make bench` = `python -m bench`: run every benchmark, print the figures, write bench/results.md.

`python -m bench pass git ingest ranking` runs a subset and rewrites only those sections of results.md
(one section per benchmark, each with its own date and load average; the others are kept as they were).
Figures are medians of several repetitions on whatever machine runs them; the load average at start and
end is printed with them, because other work on the machine moves every number.
"""

from __future__ import annotations

import compileall
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench import (
    bench_capacity,
    bench_failover,
    bench_git,
    bench_ingest,
    bench_pass,
    bench_program,
    bench_ranking,
    bench_records,
    bench_store,
    bench_views,
    bench_whatif,
)
from bench.common import Figure

BENCHES: dict[str, Callable[[], list[Figure]]] = {
    "pass": bench_pass.run,
    "store": bench_store.run,
    "git": bench_git.run,
    "ingest": bench_ingest.run,
    "ranking": bench_ranking.run,
    "program": bench_program.run,
    "records": bench_records.run,
    "failover": bench_failover.run,
    "views": bench_views.run,
    "capacity": bench_capacity.run,
    "whatif": bench_whatif.run,
}
RESULTS = Path(__file__).with_name("results.md")
NOTES = Path(__file__).with_name("notes.md")
PACKAGE = Path(__file__).resolve().parent.parent / "reconciler"


def compile_package() -> None:
    """Write the package's bytecode, as an installed package has it, before anything is timed. Python writes
    it on first import unless PYTHONDONTWRITEBYTECODE is set, as it is in our sandbox: then every `fleet`
    process the records bench starts would compile ~30 modules from source (~0.09 s of each warm command),
    which an operator's installed CLI never does."""
    compileall.compile_dir(PACKAGE, quiet=1)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (1 min) / {five:.1f} (5 min)"


def table(figures: list[Figure]) -> list[str]:
    rows = ["| figure | value | target | result | detail |", "|---|---|---|---|---|"]
    rows += [f"| {f.name.strip()} | {f.shown()} | {f.target or ''} | {f.verdict()} | {f.detail} |" for f in figures]
    return rows


def sections_of(text: str) -> dict[str, list[str]]:
    """The `## <benchmark>` sections of an earlier results.md (heading line included), by benchmark name."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
            current = out.setdefault(name, []) if name in BENCHES else None
        if current is not None:
            current.append(line)
    for lines in out.values():
        while lines and not lines[-1].strip():
            lines.pop()
    return out


def main(argv: list[str]) -> int:
    chosen = argv or list(BENCHES)
    unknown = [name for name in chosen if name not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    print(f"bench: {os.cpu_count()} CPUs, load average {_load()}", flush=True)
    compile_package()
    started = time.perf_counter()
    sections: dict[str, list[str]] = {}
    for name in chosen:
        print(f"== {name}", flush=True)
        t0, load_before, at = time.perf_counter(), _load(), datetime.now(UTC)
        figures: list[Figure] = []
        for figure in BENCHES[name]():
            figures.append(figure)
            target = f"  [target {figure.target}: {figure.verdict()}]" if figure.target else ""
            print(f"  {figure.name}: {figure.shown()}{target}\n      {figure.detail}", flush=True)
        seconds = time.perf_counter() - t0
        print(f"   ({seconds:.0f} s)", flush=True)
        sections[name] = [f"## {name}", "", f"Run {at:%Y-%m-%d %H:%M} UTC in {seconds:.0f} s; load average "
                          f"{load_before} at start, {_load()} at the end.", "", *table(figures)]
    print(f"bench: done in {time.perf_counter() - started:.0f} s; load average now {_load()}")
    kept = sections_of(RESULTS.read_text(encoding="utf-8")) if argv and RESULTS.exists() else {}
    lines = [
        "# Benchmark results", "",
        f"Written by `make bench` (every section) or `python -m bench <name>...` (those sections only); "
        f"{os.cpu_count()} CPUs ({platform.machine()}, Python {platform.python_version()}). The machine is "
        "shared: figures move with the load average given for each section.", "",
    ]
    for name in BENCHES:
        section = sections.get(name) or kept.get(name)
        if section:
            lines += [*section, ""]
    if NOTES.exists():
        lines += [NOTES.read_text(encoding="utf-8").rstrip(), ""]
    RESULTS.write_text("\n".join(lines), encoding="utf-8")
    print(f"bench: wrote {RESULTS}" + (f" (sections {', '.join(chosen)})" if argv else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
