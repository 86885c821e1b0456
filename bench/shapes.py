"""Fleet-size shapes for the operator views (issue 25), shared by bench/bench_views.py and the tests that
assert what the views show at that size:

- `write_why_history`: a records repository with a long history (20,000 commits at bench size) in which one
  machine has many verdict commits (500), its record growing by one entry per verdict as the reconciler
  writes it, between commits of the rest of the fleet (10,000 machines, one record file each);
- (see `write_fleet_store`) a controller store of many instances in every lifecycle state.

History is written with `git fast-import` (one process, no per-commit `git commit`), as the bot would have
written it: its identity, `Fleet-Machine`/`Fleet-Instance` trailers, records rendered by record_files.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

from bench.data import machine_id_of, machine_records
from reconciler.adapters.git import BOT_EMAIL, BOT_NAME
from reconciler.adapters.record_files import render_machine_record
from reconciler.domain.records import BenchmarkEntry, MachineRecord

_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def _git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, check=False,
                          env={**os.environ, **_GIT_ENV})
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode()


def _data(raw: bytes) -> bytes:
    return b"data %d\n" % len(raw) + raw + b"\n"


def verdict_entry(template: BenchmarkEntry, k: int) -> BenchmarkEntry:
    """The k-th verdict of the watched machine: a template entry under its own instance id."""
    instance = f"{template.pool}-0-t{k:05d}"
    return replace(template, instance_id=instance, evidence={**template.evidence, "instance_id": instance})


def write_why_history(repo: Path, commits: int, verdicts: int, machines: int) -> tuple[str, list[BenchmarkEntry]]:
    """Create `repo` with `commits` bot commits; every (commits // verdicts)-th one is a verdict of the watched
    machine (its record re-rendered with one more entry), the others each change one of `machines` other
    records. Returns the watched machine's id and its entries, oldest first."""
    _git(repo.parent, "init", "--quiet", "--initial-branch=main", str(repo))
    template = next(iter(machine_records(1, 30)))
    others = [render_machine_record(r).encode() for r in machine_records(4, 10, seed=3)]
    every = max(1, commits // verdicts)
    clock = 1_760_000_000
    stream: list[bytes] = []
    entries: list[BenchmarkEntry] = []
    for n in range(commits):
        clock += 60
        who = (f"author {BOT_NAME} <{BOT_EMAIL}> {clock} +0000\n"
               f"committer {BOT_NAME} <{BOT_EMAIL}> {clock} +0000\n").encode()
        if n % every == every - 1 and len(entries) < verdicts:
            entry = verdict_entry(template.benchmarks[len(entries) % len(template.benchmarks)], len(entries))
            entries.append(entry)
            mid, instance = template.machine_id, entry.instance_id
            text = render_machine_record(MachineRecord(
                mid, status="bad" if entry.marks_bad else "ok", host_id=template.host_id,
                gpu_name=template.gpu_name, benchmarks=tuple(entries))).encode()
        else:
            mid, instance = machine_id_of(1 + n % machines), f"other-{n}"
            # Another machine's record: a real rendered one under this id, distinct per commit.
            text = others[n % len(others)].replace(b"'100000'", f"'{mid}'".encode(), 1) + f"# {n}\n".encode()
        message = f"fleet: 1 verdict (machine {mid})\n\nFleet-Machine: {mid}\nFleet-Instance: {instance}\n"
        stream.append(b"commit refs/heads/main\n" + who + _data(message.encode())
                      + f"M 100644 inline fleet-spec/machines/{mid}.yaml\n".encode() + _data(text))
    _git(repo, "fast-import", "--quiet", stdin=b"".join(stream))
    _git(repo, "checkout", "--quiet", "main")
    return template.machine_id, entries
