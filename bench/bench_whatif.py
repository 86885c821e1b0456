"""`fleet plan --what-if` over the last 30 days of a 1,000- and a 10,000-machine fleet (bench/whatif_history.py: its
records, verdict commits and demand samples), each side by side with a plain `fleet plan` of the same checkout in
the same run. A fresh `fleet` process each time, as the PR job runs it; the PR raises one pool's minimum rate.
Medians of 3 runs; the first run of each pair builds the record index (a fresh clone in CI has none), so the
cold run is given too."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Figure
from bench.whatif_history import Built, build, format_until

FLEETS = ((1_000, 5.0), (10_000, 20.0))
REPEATS = 3


def _fleet(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "reconciler.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"fleet {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def _raise_one_min(built: Built) -> None:
    """The PR: pool p01's minimum rate up by a fifth (a fixed pool: its admissions flip)."""
    spec = built.repo / "fleet-spec" / "fleet.yaml"
    lines = spec.read_text().splitlines()
    at = lines.index("  - name: p01")
    for i in range(at, at + 5):
        if lines[i].startswith("    min_rate_proofs_per_hour:"):
            rate = float(lines[i].split(":")[1])
            lines[i] = f"    min_rate_proofs_per_hour: {rate * 1.2:g}"
    spec.write_text("\n".join(lines) + "\n")


def run() -> list[Figure]:
    figures: list[Figure] = []
    for machines, target in FLEETS:
        with tempfile.TemporaryDirectory(prefix="bench-whatif-") as tmp:
            root = Path(tmp)
            t0 = time.perf_counter()
            built = build(root, machines)
            setup = time.perf_counter() - t0
            _raise_one_min(built)
            env = {**os.environ, "XDG_CACHE_HOME": str(root / "cache")}
            spec = str(built.repo / "fleet-spec" / "fleet.yaml")
            plain = ["plan", "--spec", spec]
            whatif = [*plain, "--what-if", "--since", "30d", "--at", format_until(built), "--json"]
            index = built.repo / ".git" / "fleet"
            shutil.rmtree(index, ignore_errors=True)
            cold_plain, _ = _fleet(plain, built.repo, env)
            shutil.rmtree(index, ignore_errors=True)
            cold_whatif, _ = _fleet(whatif, built.repo, env)
            plain_times, whatif_times = [], []
            out = ""
            for _ in range(REPEATS):
                plain_times.append(_fleet(plain, built.repo, env)[0])
                elapsed, out = _fleet(whatif, built.repo, env)
                whatif_times.append(elapsed)
            doc = json.loads(out)["what_if"]
            check = doc["self_check"]
            replayed = doc["replayed"]
            flips = doc["flip_count"]
            median = statistics.median(whatif_times)
            load = os.getloadavg()[0]
            figures.append(Figure(
                f"fleet plan --what-if, 30 days of {machines:,} machines", median, "s",
                f"median of {REPEATS} ({', '.join(f'{t:.2f}' for t in whatif_times)} s), 1-min load {load:.1f}; "
                f"cold (index built first) {cold_whatif:.2f} s; replayed {replayed['verdicts']:,} verdicts in "
                f"{replayed['passes']:,} passes, {replayed['demand_samples']:,} demand samples of "
                f"{replayed['demand_pools']} pools ({built.demand_bytes / 1e6:.1f} MB of day files), "
                f"{built.commits:,} commits; self-check {'passed' if check['ok'] else 'FAILED'} "
                f"({check['verdicts_matched']}/{check['verdicts']} verdicts, capacity "
                f"{check['capacity']['exact']}+{check['capacity']['near']}/{check['capacity']['recorded']}); "
                f"{flips} flips; history built in {setup:.0f} s", f"<= {target:g} s", median <= target))
            figures.append(Figure(
                f"reference: plain fleet plan, same checkout ({machines:,} machines)",
                statistics.median(plain_times), "s",
                f"median of {REPEATS} ({', '.join(f'{t:.2f}' for t in plain_times)} s); cold {cold_plain:.2f} s; "
                f"--what-if / plain: {median / statistics.median(plain_times):.1f}x"))
    return figures


if __name__ == "__main__":
    for f in run():
        print(f.name, f.shown(), f.detail)
