"""`fleet status`: the fleet at a glance - pools desired vs running vs benchmarking vs bad, the guards
(circuit breaker, kill budget), every instance's lifecycle timeline and the root cause of any failure in
one line, plus the reconcile loop's last pass.

`status_view` (pure: spec, records, reports, now -> FleetStatus) assembles the data; the text and JSON
renderers here and the HTML page (`reconciler/status_html.py`, `--html`) only format it. Verdicts shown
are the recorded ones (authoritative: they include breaker holds); a finished instance the loop has not
recorded yet is judged on the fly and marked "not yet recorded".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.breaker import kill_budgets
from reconciler.observations import InstanceReport, format_time, parse_time
from reconciler.planner import pool_pause
from reconciler.records import BenchmarkEntry, RecordError, RecordSet, load_records
from reconciler.spec import FleetSpec, SpecError, load_spec
from reconciler.verdict import judge

#: phase_times() keys -> the labels of the seed's dashboard timeline, in lifecycle order.
TIMELINE_LABELS = {
    "registered": "registered",
    "params-done": "params-done",
    "params-failed": "params-failed",
    "daemon-failed": "daemon-failed",
    "benchmark-started": "bench-started",
    "benchmark-done": "bench-done",
    "benchmark-failed": "bench-failed",
    "result": "result",
    "destroyed": "destroyed",
}


@dataclass(frozen=True)
class PoolStatus:
    name: str
    gpu_name: str
    desired: int
    running: int  # instances alive (registered, not destroyed)
    benchmarking: int  # alive and not judged yet
    ok: int  # alive with a passing verdict
    bad: int  # machines of this pool recorded bad
    min_rate_proofs_per_hour: float
    kill_budget_used: int
    kill_budget_allowed: int
    state: str  # "ok", "paused: ...", "image suspect: ...", "kill budget exhausted"


@dataclass(frozen=True)
class InstanceStatus:
    instance_id: str
    pool: str | None
    slot: str | None
    machine_id: str | None
    host_id: str | None
    gpu_name: str | None
    image_digest: str | None
    state: str  # benchmarking / ok / failed / destroyed ...
    timeline: tuple[tuple[str, str], ...]  # (label, RFC 3339 time) in lifecycle order
    verdict: str | None = None
    blame: str | None = None
    marks_bad: bool = False
    held_by: str | None = None
    root_cause: str | None = None
    recorded: bool = False


@dataclass(frozen=True)
class SuspectStatus:
    image_digest: str
    signature: str
    pools: tuple[str, ...]
    machines: tuple[str, ...]
    tripped_at: str
    reason: str


@dataclass(frozen=True)
class RatePoint:
    """One judged benchmark of a machine in a pool; `proofs_per_hour` is None when it measured no rate."""

    pool: str
    machine_id: str
    instance_id: str
    at: str
    verdict: str
    blame: str
    proofs_per_hour: float | None
    recorded: bool


@dataclass(frozen=True)
class BadMachineStatus:
    """A machine recorded bad, with the verdict that made it bad (the newest one that marked it)."""

    machine_id: str
    host_id: str | None
    gpu_name: str | None
    pool: str | None
    verdict: str | None  # None: set bad by a human edit, no verdict marked it
    blame: str | None
    reason: str
    at: str | None


@dataclass(frozen=True)
class FleetStatus:
    at: str
    pools: tuple[PoolStatus, ...]
    instances: tuple[InstanceStatus, ...]
    suspects: tuple[SuspectStatus, ...]
    record_problems: tuple[str, ...] = ()
    last_pass: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)  # problems met while observing (spec, store)
    rates: tuple[RatePoint, ...] = ()
    bad_machines: tuple[BadMachineStatus, ...] = ()
    desired_image_digest: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["instances"] = [{**asdict(i), "timeline": dict(i.timeline)} for i in self.instances]
        return out


def _recorded_entries(records: RecordSet) -> dict[str, tuple[str, BenchmarkEntry]]:
    out: dict[str, tuple[str, BenchmarkEntry]] = {}
    for rec in records.machines.values():
        for entry in rec.benchmarks:
            out[entry.instance_id] = (rec.machine_id, entry)
    return out


def _root_cause(reason: str, blame: str, held_by: str | None) -> str:
    held = f", held by {held_by}" if held_by else ""
    return f"{reason} (blame: {blame}{held})"


def _recorded_rates(records: RecordSet) -> list[RatePoint]:
    return [RatePoint(entry.pool, rec.machine_id, entry.instance_id, entry.at, entry.verdict, entry.blame,
                      entry.proofs_per_hour, True)
            for rec in records.machines.values() for entry in rec.benchmarks if entry.pool is not None]


def _bad_machines(records: RecordSet) -> tuple[BadMachineStatus, ...]:
    out = []
    for rec in sorted((r for r in records.machines.values() if r.is_bad), key=lambda r: r.machine_id):
        marking = next((b for b in reversed(rec.benchmarks) if b.marks_bad), None)
        if marking is None:
            out.append(BadMachineStatus(rec.machine_id, rec.host_id, rec.gpu_name, None, None, None,
                                        rec.note or "marked bad by hand (no verdict marked it)", None))
        else:
            out.append(BadMachineStatus(rec.machine_id, rec.host_id, rec.gpu_name, marking.pool, marking.verdict,
                                        marking.blame, marking.reason, marking.at))
    return tuple(out)


def status_view(spec: FleetSpec, records: RecordSet, reports: Iterable[InstanceReport], now: datetime, *,
                desired_image_digest: str | None = None, last_pass: Mapping[str, Any] | None = None,
                notes: Sequence[str] = ()) -> FleetStatus:
    recorded = _recorded_entries(records)
    pools_by_name = {p.name: p for p in spec.pools}
    instances: list[InstanceStatus] = []
    rates = _recorded_rates(records)
    for report in sorted(reports, key=lambda r: (r.registered_at, r.instance_id)):
        times = report.phase_times()
        # Lifecycle order, not time order: registration is stamped by the controller's clock, phases by
        # the worker's, and a skewed worker clock must not make "registered" look like the last step.
        timeline = tuple((label, format_time(times[key])) for key, label in TIMELINE_LABELS.items() if key in times)
        verdict = blame = held_by = cause = None
        marks_bad = is_recorded = False
        if report.instance_id in recorded:
            _, entry = recorded[report.instance_id]
            verdict, blame, held_by, marks_bad, is_recorded = (entry.verdict, entry.blame, entry.held_by,
                                                               entry.marks_bad, True)
            cause = _root_cause(entry.reason, entry.blame, entry.held_by)
        elif report.pool in pools_by_name:
            judged = judge(report, pools_by_name[report.pool], now, desired_image_digest=desired_image_digest)
            if judged is not None:
                verdict, blame, marks_bad = judged.verdict, judged.blame, judged.marks_bad
                cause = judged.root_cause() + " [not yet recorded]"
                if report.machine_id is not None:
                    rates.append(RatePoint(report.pool, report.machine_id, report.instance_id,
                                           format_time(judged.at), judged.verdict, judged.blame,
                                           judged.proofs_per_hour, False))
        if report.destroyed_at is not None:
            state = "destroyed"
        elif verdict is None:
            state = "benchmarking"
        else:
            state = "ok" if verdict == "ok" else "failed"
        instances.append(InstanceStatus(
            instance_id=report.instance_id, pool=report.pool, slot=report.slot, machine_id=report.machine_id,
            host_id=report.host_id, gpu_name=report.gpu_name, image_digest=report.image_digest, state=state,
            timeline=timeline, verdict=verdict, blame=blame, marks_bad=marks_bad, held_by=held_by,
            root_cause=cause if verdict != "ok" else None, recorded=is_recorded))

    budgets = kill_budgets(spec, records, now)
    suspects = records.suspect_images()
    pools = []
    for pool in spec.pools:
        alive = [i for i in instances if i.pool == pool.name and i.state != "destroyed"]
        bad_machines = {m for m, rec in records.machines.items() if rec.is_bad
                        and rec.benchmarks and rec.benchmarks[-1].pool == pool.name}
        budget = budgets[pool.name]
        pause = pool_pause(pool.name, records, desired_image_digest)
        naming = [s for s in suspects.values() if pool.name in s.pools or not s.pools]
        if pause is not None:
            state = f"paused: image {pause.image_digest[:19]} suspect ({pause.signature})"
        elif naming:
            state = "image suspect: " + ", ".join(f"{s.image_digest[:19]} ({s.signature})" for s in naming)
        elif budget.exhausted:
            state = f"kill budget exhausted ({len(budget.used)}/{budget.allowed})"
        else:
            state = "ok"
        pools.append(PoolStatus(
            name=pool.name, gpu_name=pool.gpu_name, desired=pool.count, running=len(alive),
            benchmarking=sum(1 for i in alive if i.state == "benchmarking"),
            ok=sum(1 for i in alive if i.state == "ok"), bad=len(bad_machines),
            min_rate_proofs_per_hour=pool.min_rate_proofs_per_hour, kill_budget_used=len(budget.used),
            kill_budget_allowed=budget.allowed, state=state))
    suspect_rows = tuple(SuspectStatus(s.image_digest, s.signature, s.pools, s.machines, s.tripped_at, s.reason)
                         for s in sorted(suspects.values(), key=lambda s: s.tripped_at))
    return FleetStatus(at=format_time(now), pools=tuple(pools), instances=tuple(instances), suspects=suspect_rows,
                       record_problems=records.problems, last_pass=last_pass, notes=tuple(notes),
                       rates=tuple(sorted(rates, key=lambda r: (r.pool, r.at, r.instance_id))),
                       bad_machines=_bad_machines(records), desired_image_digest=desired_image_digest)


# --- rendering ---------------------------------------------------------------------------------------------


def _offset(start: str, at: str) -> str:
    delta = int((parse_time(at) - parse_time(start)).total_seconds())
    sign, delta = ("-" if delta < 0 else "+"), abs(delta)
    if delta < 3600:
        return f"{sign}{delta // 60}m{delta % 60:02d}s"
    return f"{sign}{delta // 3600}h{delta % 3600 // 60:02d}m"


def render_timeline(timeline: Sequence[tuple[str, str]]) -> str:
    """`registered 18:00:00Z -> params-done +22m00s -> bench-done +1h00m`, like the seed's dashboard."""
    if not timeline:
        return ""
    (first_label, first_at), rest = timeline[0], timeline[1:]
    parts = [f"{first_label} {first_at}"] + [f"{label} {_offset(first_at, at)}" for label, at in rest]
    return " -> ".join(parts)


def render_text(view: FleetStatus) -> str:
    lines = [f"fleet status at {view.at}"]
    if view.last_pass:
        lines.append(f"reconciler: last pass {view.last_pass.get('at')}: {view.last_pass.get('headline')}")
    lines.append("")
    header = ("POOL", "GPU", "DESIRED", "RUNNING", "BENCHMARKING", "OK", "BAD", "MIN/H", "KILL-BUDGET", "STATE")
    rows = [header] + [(p.name, p.gpu_name, str(p.desired), str(p.running), str(p.benchmarking), str(p.ok),
                        str(p.bad), f"{p.min_rate_proofs_per_hour:g}", f"{p.kill_budget_used}/{p.kill_budget_allowed}",
                        p.state) for p in view.pools]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
    if view.suspects:
        lines += ["", "image suspects (circuit breaker):"]
        for s in view.suspects:
            lines.append(f"  {s.image_digest[:19]} {s.signature}: machines {', '.join(s.machines)}; pools "
                         f"{', '.join(s.pools) or 'all'}; since {s.tripped_at}")
    if view.instances:
        lines += ["", "instances:"]
    for i in view.instances:
        where = f"machine {i.machine_id or '?'}" + (f" (host {i.host_id})" if i.host_id else "")
        verdict = f" {i.verdict}" if i.verdict and i.verdict != i.state else ""
        lines.append(f"  {i.instance_id}  {i.pool or '?'}  {where}  {i.state}{verdict}")
        lines.append(f"      {render_timeline(i.timeline)}")
        if i.root_cause:
            lines.append(f"      {i.root_cause}")
    for problem in view.record_problems:
        lines.append(f"unreadable record (excluded from offers until fixed): {problem}")
    return "\n".join(lines) + "\n"


# --- command -----------------------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="pools, guards, instance timelines and root causes")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workdir", type=Path, help="the reconciler's clone (reads <workdir>/fleet-spec and "
                                                    "the loop's last pass)")
    where.add_argument("--spec-dir", type=Path, help="spec directory (default: fleet-spec)")
    p.add_argument("--controller-db", type=Path, help="controller store (SQLite); without it, records only")
    p.add_argument("--image-digest", default=None, help="desired image digest (default: $FLEET_IMAGE_DIGEST)")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable output")
    output.add_argument("--html", type=Path, metavar="FILE",
                        help="write a self-contained static HTML status page to FILE (also written, with the "
                             "problem shown, when the spec is stalled or the controller store is unreadable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reconciler.commands.reconcile import desired_digest_arg, last_pass_path

    spec_dir: Path = args.workdir / "fleet-spec" if args.workdir else (args.spec_dir or Path("fleet-spec"))
    html_out: Path | None = args.html
    try:
        desired = desired_digest_arg(args.image_digest)
    except RecordError as exc:
        print(f"fleet status: --image-digest / $FLEET_IMAGE_DIGEST: {exc}", file=sys.stderr)
        return 2
    last_pass = None
    if args.workdir is not None:
        try:
            last_pass = json.loads(last_pass_path(args.workdir).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            last_pass = None
    now = datetime.now(UTC)
    try:
        spec = load_spec(spec_dir / "fleet.yaml")
    except SpecError as exc:
        print(f"fleet status: stalled: {exc}", file=sys.stderr)
        if html_out is not None:
            # A page that vanishes when the spec breaks hides the one thing the reader must know.
            stalled = FleetStatus(at=format_time(now), pools=(), instances=(), suspects=(),
                                  record_problems=load_records(spec_dir).problems, last_pass=last_pass,
                                  notes=(f"spec stalled: {exc}",), desired_image_digest=desired)
            _write_html(html_out, stalled, spec_dir / "fleet.yaml")
        return 1
    reports: list[InstanceReport] = []
    observation_error: str | None = None
    if args.controller_db is not None:
        from reconciler.store import ControllerStore, StoreError

        if not args.controller_db.is_file():
            observation_error = f"{args.controller_db}: no controller store there"
        else:
            try:
                store = ControllerStore(args.controller_db)
                try:
                    reports = store.reports()
                finally:
                    store.close()
            except StoreError as exc:
                observation_error = str(exc)
    if observation_error is not None:
        print(f"fleet status: {observation_error}", file=sys.stderr)
        if html_out is None:
            return 1
    notes = () if observation_error is None else (f"observation failed, instances not shown: {observation_error}",)
    view = status_view(spec, load_records(spec_dir), reports, now,
                       desired_image_digest=desired, last_pass=last_pass, notes=notes)
    if html_out is not None:
        written = _write_html(html_out, view, spec_dir / "fleet.yaml")
        return 1 if observation_error is not None or not written else 0
    if args.json:
        json.dump(view.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(view))
    return 0


def _write_html(path: Path, view: FleetStatus, spec_source: Path) -> bool:
    from reconciler.records import write_text_atomic
    from reconciler.status_html import render_html

    try:
        # Atomic: a web server serving the file never sends a half-written page.
        write_text_atomic(path, render_html(view, spec_source=str(spec_source)))
    except OSError as exc:
        print(f"fleet status: --html {path}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return False
    print(f"fleet status: wrote {path} ({len(view.pools)} pools, {len(view.instances)} instances, "
          f"{len(view.bad_machines)} bad machines)")
    return True
