"""Read-only commands at 10,000 machines / 100,000 stored results, as a user runs them (a fresh `fleet`
process each time), with the record index (reconciler/adapters/record_index.py):

- cold: no index yet (first command in a fresh clone, or after the index was deleted): every record file is
  read, hashed and parsed once, and the index written;
- warm: the index is present: every file is only stat()ed;
- reference, in the same run: the raw read of the same record files (open + read every byte, one process
  already started), the floor any parse-everything approach stands on;
- `fleet why` on a machine with 600 verdict commits in a history of ~1,200 commits;
- `fleet --help`.
Each figure is the median of 3 runs.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Figure, fast_import_data, git, timed
from bench.data import DIGEST, machine_id_of, machine_records, spec_yaml, write_records
from reconciler.adapters.git import BOT_EMAIL, BOT_NAME
from reconciler.adapters.record_files import render_machine_record

MACHINES = 10_000
ENTRIES_PER_MACHINE = 10
REPEATS = 3
WHY_COMMITS = 600
COLD_TARGET_S = 3.0
WARM_TARGET_S = 0.5
WHY_TARGET_S = 0.5
HELP_TARGET_S = 0.3
RAW_FACTOR = 10.0


#: CPU seconds (user + system) of the last `_fleet` process: on this shared machine the wall time moves
#: with everyone else's load, the CPU time much less, so both are shown.
LAST_CPU: list[float] = [0.0]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _fleet(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Wall time of one `fleet ...` process (checked to succeed: exit 0, or 1 for findings)."""
    cpu = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "reconciler.cli", *args], cwd=cwd, env=env, capture_output=True,
                          check=False)
    elapsed = time.perf_counter() - start
    LAST_CPU[0] = _children_cpu() - cpu
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"fleet {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return elapsed


def _timed_runs(args: list[str], cwd: Path, env: dict[str, str], before: Any = None) -> tuple[list[float], float]:
    """REPEATS runs: their wall times and the median CPU time."""
    walls, cpus = [], []
    for _ in range(REPEATS):
        if before is not None:
            before()
        walls.append(_fleet(args, cwd, env))
        cpus.append(LAST_CPU[0])
    return walls, statistics.median(cpus)



def _raw_read(machines_dir: Path) -> float:
    def read_all() -> None:
        with os.scandir(machines_dir) as entries:
            for entry in entries:
                with open(entry.path, "rb") as fh:
                    fh.read()

    return statistics.median(timed(read_all) for _ in range(REPEATS))


def run() -> list[Figure]:
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="bench-records-") as tmp:
        root = Path(tmp) / "fleet"
        spec_dir = root / "fleet-spec"
        spec_dir.mkdir(parents=True)
        git(root, "init", "--quiet", "--initial-branch=main")
        (spec_dir / "fleet.yaml").write_text(spec_yaml(), encoding="utf-8")
        started = time.perf_counter()
        write_records(spec_dir, MACHINES, ENTRIES_PER_MACHINE)
        megabytes = sum(f.stat().st_size for f in (spec_dir / "machines").iterdir()) / 1e6
        print(f"    wrote {MACHINES:,} record files ({megabytes:.0f} MB) in {time.perf_counter() - started:.0f} s",
              flush=True)
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
        index = root / ".git" / "fleet" / "records.sqlite"
        raw = _raw_read(spec_dir / "machines")
        figures.append(Figure(f"raw read of the {MACHINES:,} record files ({megabytes:.0f} MB), reference", raw, "s",
                              f"median of {REPEATS}: open + read every file in one running process, page cache "
                              "warm; the floor for reading every record"))
        commands = {
            "records": ["records", "--spec-dir", "fleet-spec"],
            "status": ["status", "--spec-dir", "fleet-spec", "--at", "2026-12-03T12:00:00Z"],
            "plan": ["plan", "--spec", "fleet-spec/fleet.yaml", "--image-digest", DIGEST],
        }
        def drop_index() -> None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{index}{suffix}").unlink(missing_ok=True)

        for name, args in commands.items():
            cold, cold_cpu = _timed_runs(args, root, env, drop_index)
            warm, warm_cpu = _timed_runs(args, root, env)
            cold_s, warm_s = statistics.median(cold), statistics.median(warm)
            passed = cold_s <= COLD_TARGET_S and cold_s <= RAW_FACTOR * raw
            figures.append(Figure(
                f"fleet {name}, cold (no index): {MACHINES:,} machines, {MACHINES * ENTRIES_PER_MACHINE:,} results",
                cold_s, "s", f"median of {REPEATS} processes ({', '.join(f'{t:.2f}' for t in cold)} s), CPU "
                f"{cold_cpu:.2f} s; {cold_s / raw:.1f}x the raw read; parses every file and writes the index",
                target=f"<= {COLD_TARGET_S:g} s and <= {RAW_FACTOR:g}x raw read", passed=passed))
            figures.append(Figure(
                f"fleet {name}, warm (index present)", warm_s, "s",
                f"median of {REPEATS} processes ({', '.join(f'{t:.2f}' for t in warm)} s), CPU {warm_cpu:.2f} s; "
                "stat()s every file, answers from the index", target=f"<= {WARM_TARGET_S:g} s",
                passed=warm_s <= WARM_TARGET_S))
            print(f"    {name}: cold {cold_s:.2f} s (CPU {cold_cpu:.2f}), warm {warm_s:.2f} s (CPU {warm_cpu:.2f})",
                  flush=True)
        figures.append(_why(Path(tmp)))
        helps, help_cpu = _timed_runs(["--help"], root, env)
        help_s = statistics.median(helps)
        figures.append(Figure("fleet --help", help_s, "s", f"median of {REPEATS} processes (interpreter start "
                              f"included), CPU {help_cpu:.2f} s; imports no command module",
                              target=f"<= {HELP_TARGET_S:g} s",
                              passed=help_s <= HELP_TARGET_S))
    return figures



def _why(tmp: Path) -> Figure:
    """A repo whose history has WHY_COMMITS verdict commits of one machine (its record growing to its last
    30 entries, as a capped record would) interleaved with as many commits of other machines."""
    repo = tmp / "why"
    git(tmp, "init", "--quiet", "--initial-branch=main", str(repo))
    template = next(iter(machine_records(1, 30)))
    target = template.machine_id
    clock = 1_760_000_000
    parts = []
    for n in range(WHY_COMMITS * 2):
        clock += 60
        who = f"author {BOT_NAME} <{BOT_EMAIL}> {clock} +0000\ncommitter {BOT_NAME} <{BOT_EMAIL}> {clock} +0000\n"
        if n % 2 == 0:
            mid = target
            k = n // 2
            entries = template.benchmarks[: 1 + k % len(template.benchmarks)]
            text = render_machine_record(type(template)(mid, status="bad", host_id=template.host_id,
                                                        gpu_name=template.gpu_name, benchmarks=entries))
            instance = entries[-1].instance_id
        else:
            mid = machine_id_of(1 + n % 500)
            text = f"machine_id: '{mid}'\nstatus: ok\nbenchmarks: []\n"
            instance = f"other-{n}"
        message = f"fleet: 1 verdict (machine {mid})\n\nFleet-Machine: {mid}\nFleet-Instance: {instance}\n"
        parts.append(f"commit refs/heads/main\n{who}".encode() + fast_import_data(message)
                     + f"M 100644 inline fleet-spec/machines/{mid}.yaml\n".encode() + fast_import_data(text))
    git(repo, "fast-import", "--quiet", stdin=b"".join(parts))
    git(repo, "checkout", "--quiet", "main")
    commits = len(git(repo, "rev-list", "HEAD").split())
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache")}
    times, cpu = _timed_runs(["why", target], repo, env)
    why_s = statistics.median(times)
    return Figure(f"fleet why, machine with {WHY_COMMITS} verdict commits ({commits:,} commits in history)", why_s,
                  "s", f"median of {REPEATS} processes ({', '.join(f'{t:.2f}' for t in times)} s), CPU {cpu:.2f} s "
                  "(git's included); one path-limited "
                  "git log + one git cat-file --batch", target=f"<= {WHY_TARGET_S:g} s", passed=why_s <= WHY_TARGET_S)


if __name__ == "__main__":
    for f in run():
        print(f.name, "|", f.shown(), "|", f.detail, f.verdict())
