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

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import fast_import_data, git
from bench.data import DIGEST, POOLS, SLOTS_PER_POOL, T0, machine_id_of, machine_records, make_report
from reconciler.adapters.git import BOT_EMAIL, BOT_NAME
from reconciler.adapters.record_files import render_machine_record
from reconciler.domain.observations import BenchmarkResult, format_time, parse_time
from reconciler.domain.records import BenchmarkEntry, MachineRecord


def verdict_entry(template: BenchmarkEntry, k: int) -> BenchmarkEntry:
    """The k-th verdict of the watched machine: a template entry under its own instance id."""
    instance = f"{template.pool}-0-t{k:05d}"
    return replace(template, instance_id=instance, evidence={**template.evidence, "instance_id": instance})


def write_why_history(repo: Path, commits: int, verdicts: int, machines: int) -> tuple[str, list[BenchmarkEntry]]:
    """Create `repo` with `commits` bot commits; every (commits // verdicts)-th one is a verdict of the watched
    machine (its record re-rendered with one more entry), the others each change one of `machines` other
    records. Returns the watched machine's id and its entries, oldest first."""
    git(repo.parent, "init", "--quiet", "--initial-branch=main", str(repo))
    template = next(iter(machine_records(1, 30)))
    others = [render_machine_record(r).encode() for r in machine_records(4, 10, seed=3)]
    every = max(1, commits // verdicts)
    clock = 1_760_000_000
    stream: list[bytes] = []
    entries: list[BenchmarkEntry] = []
    lines: list[str] = []  # the watched record's entry lines so far, each ending in a newline
    for n in range(commits):
        clock += 60
        who = (f"author {BOT_NAME} <{BOT_EMAIL}> {clock} +0000\n"
               f"committer {BOT_NAME} <{BOT_EMAIL}> {clock} +0000\n").encode()
        if n % every == every - 1 and len(entries) < verdicts:
            entry = verdict_entry(template.benchmarks[len(entries) % len(template.benchmarks)], len(entries))
            entries.append(entry)
            mid, instance = template.machine_id, entry.instance_id
            # The record as the reconciler renders it (header, `benchmarks:`, one line per entry): each entry
            # line is rendered once and appended (rendering the whole record again per verdict is quadratic).
            alone = render_machine_record(MachineRecord(
                mid, status="bad" if entry.marks_bad else "ok", host_id=template.host_id,
                gpu_name=template.gpu_name, benchmarks=(entry,)))
            header, line = alone.rsplit("\n- ", 1)
            lines.append("- " + line)
            text = (header + "\n" + "".join(lines)).encode()
        else:
            mid, instance = machine_id_of(1 + n % machines), f"other-{n}"
            # Another machine's record: a real rendered one under this id, distinct per commit.
            text = others[n % len(others)].replace(b"'100000'", f"'{mid}'".encode(), 1) + f"# {n}\n".encode()
        message = f"fleet: 1 verdict (machine {mid})\n\nFleet-Machine: {mid}\nFleet-Instance: {instance}\n"
        stream.append(b"commit refs/heads/main\n" + who + fast_import_data(message.encode())
                      + f"M 100644 inline fleet-spec/machines/{mid}.yaml\n".encode() + fast_import_data(text))
    git(repo, "fast-import", "--quiet", stdin=b"".join(stream))
    git(repo, "checkout", "--quiet", "main")
    return template.machine_id, entries


# --- a controller store at fleet size -------------------------------------------------------------------

#: What the instances of `write_fleet_store` are, by share of the fleet (the rest: admitted and serving).
FAILED_ALIVE = 0.02  # recorded failing verdict, not destroyed yet (needs the operator)
DESTROYED = 0.10  # replaced instances kept in the store (history)
BENCHMARKING = 0.04  # registered, benchmark running, no verdict
SILENT = 0.01  # serving, heartbeats stopped over an hour before `now` (lost, not recorded yet)


@dataclass(frozen=True)
class FleetShape:
    """What `write_fleet_store` wrote, by kind: the instance ids a view must show or leave out."""

    serving: tuple[str, ...]
    failed: tuple[str, ...]
    destroyed: tuple[str, ...]
    benchmarking: tuple[str, ...]
    silent: tuple[str, ...]
    now: datetime


def write_fleet_store(db: Path, records: Sequence[MachineRecord], instances: int, seed: int = 13) -> FleetShape:
    """A controller store with `instances` instances on the machines of `records` (one each, written as
    the worker protocol delivers them): most passed and serve with heartbeats; some failed (their recorded
    verdict), some were destroyed, some still benchmark, a few went silent while serving."""
    from reconciler.adapters.store.sqlite import SqliteStore

    clock = [T0]
    store = SqliteStore(db, now=lambda: clock[0])
    try:
        return fill_fleet(store, clock, records, instances, seed)
    finally:
        store.close()


def fill_fleet(store: Any, clock: list[datetime], records: Sequence[MachineRecord], instances: int, seed: int = 13,
               start: datetime = T0 + timedelta(hours=2), hours: float = 3.0) -> FleetShape:
    """`write_fleet_store`'s instances into `store` (either adapter), whose clock reads `clock[0]`: registered from
    `start` on (one a second), serving for `hours` - 1 until `start + hours` (the shape's `now`)."""
    if instances > len(records):
        raise ValueError(f"{instances} instances need as many machine records (one instance each), not {len(records)}")
    rng = random.Random(seed)
    now = start + timedelta(hours=hours)
    kinds: dict[str, list[str]] = {k: [] for k in ("serving", "failed", "destroyed", "benchmarking", "silent")}
    destroyed_at = now - timedelta(minutes=30)
    batch: list[Any] = []
    for i in range(instances):
        rec = records[i % len(records)]
        last = rec.benchmarks[-1]
        pool = next(p for p in POOLS if p[0] == last.pool)
        roll = rng.random()
        if roll < BENCHMARKING:
            kind, iid = "benchmarking", f"{pool[0]}-{i % SLOTS_PER_POOL}-b{i:06x}"
        elif last.verdict != "ok":
            kind, iid = ("failed" if roll < BENCHMARKING + FAILED_ALIVE * 8 else "destroyed"), last.instance_id
        elif roll < BENCHMARKING + DESTROYED:
            kind, iid = "destroyed", last.instance_id
        elif roll < BENCHMARKING + DESTROYED + SILENT:
            kind, iid = "silent", last.instance_id
        else:
            kind, iid = "serving", last.instance_id
        kinds[kind].append(iid)
        batch += _instance_writes(store, clock, iid, rec, pool, kind, start + timedelta(seconds=i), now)
        if len(batch) > 5_000:  # one transaction per few hundred instances (write_all)
            _write(store, batch)
            batch = []
    _write(store, batch)
    for iid in kinds["destroyed"]:
        store.mark_destroyed(iid, destroyed_at)
    return FleetShape(*(tuple(kinds[k]) for k in ("serving", "failed", "destroyed", "benchmarking", "silent")),
                      now=now)


def _write(store: Any, batch: list[Any]) -> None:
    for error, _ in store.write_all(batch):
        if error is not None:
            raise error


def _instance_writes(store: Any, clock: list[datetime], iid: str, rec: MachineRecord,
                     pool: tuple[str, str, float], kind: str, start: datetime, now: datetime) -> list[Any]:
    """The writes of one instance as the worker protocol delivers them, each prepared at its arrival time (the
    controller stamps what it receives with its own clock)."""
    report = make_report(iid, rec.machine_id, pool, "running" if kind == "benchmarking" else "ok",
                         pool[2] * 1.2, start)
    clock[0] = start
    writes = [store.prepare_register(iid, {
        "protocol": 1, "instance_id": iid, "at": format_time(start), "pool": pool[0], "slot": report.slot,
        "machine_id": rec.machine_id, "host_id": report.host_id, "contract_id": report.contract_id,
        "gpu_name": pool[1], "image_digest": DIGEST}), store.prepare_logs(iid, list(report.log_tail))]
    docs = [{"protocol": 1, "phase": e.phase, "status": e.status, "at": format_time(e.at),
             **({"details": dict(e.details)} if e.details else {})} for e in report.events]
    if kind in ("serving", "silent"):  # admitted: serving since its result, a heartbeat every 5 minutes
        served = start + timedelta(minutes=61)
        beats = 3 if kind == "silent" else int((now - served).total_seconds() // 300)
        docs.append({"protocol": 1, "phase": "serve", "status": "started", "at": format_time(served)})
        docs += [{"protocol": 1, "phase": "serve", "status": "progress",
                  "at": format_time(served + timedelta(minutes=5 * (n + 1))),
                  "details": {"heartbeat": {"seq": n, "interval_s": 300, "completed": 4, "failed": 0, "busy": True,
                                            "recent_proof_s": 75.0}}} for n in range(beats)]
    for doc in docs:
        clock[0] = parse_time(doc["at"])
        writes.append(store.prepare_event(iid, doc))
    if (r := report.result) is not None:
        clock[0] = r.at
        writes.append(store.prepare_result(iid, result_doc(r)))
    return writes


def result_doc(r: BenchmarkResult) -> dict[str, Any]:
    """A benchmark result as the worker posts it."""
    return {"protocol": 1, "outcome": r.outcome, "at": format_time(r.at), "requested": r.requested,
            "completed": r.completed, "failed": r.failed, "exit_code": r.exit_code,
            "proofs_per_hour": r.proofs_per_hour, "seconds_per_proof": r.seconds_per_proof,
            "image_digest": r.image_digest, "log_tail": list(r.log_tail),
            "started_at": format_time(r.started_at or r.at)}
