"""Text rendering of the fleet status (`fleet status`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.domain.observations import parse_time
from reconciler.domain.redact import escape_controls
from reconciler.domain.status import FleetStatus

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


def _gpu_text(gpus: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for g in gpus[:4]:
        temp, clock = g.get("temperature_c"), g.get("sm_clock_mhz")
        if temp is None and clock is None:
            continue
        bits = [f"{temp:g} C" if isinstance(temp, int | float) else "",
                f"{clock:g} MHz" if isinstance(clock, int | float) else ""]
        parts.append(f"GPU{g.get('index', '?')} " + " ".join(b for b in bits if b))
    return f"; {', '.join(parts)}" if parts else ""


def _suspect_lines(view: FleetStatus) -> list[str]:
    """Suspects a pool runs are its state; the others are history until a human clears them."""
    active = [s for s in view.suspects if s.in_use_by]
    history = [s for s in view.suspects if not s.in_use_by]
    lines: list[str] = []
    if active:
        lines += ["", "image suspects (circuit breaker):"]
        for s in active:
            lines.append(f"  {s.image_digest[:19]} {s.signature}: machines {', '.join(s.machines)}; run by pools "
                         f"{', '.join(s.in_use_by)}; since {s.tripped_at}")
    if history:
        lines += ["", "image suspects no pool runs any more (history; clear with status: cleared in "
                      "fleet-spec/images/<digest>.yaml):"]
        for s in history:
            lines.append(f"  {s.image_digest[:19]} {s.signature}: machines {', '.join(s.machines)}; since "
                         f"{s.tripped_at}")
    return lines


def _instances_heading(view: FleetStatus) -> list[str]:
    if view.matching is None:  # every instance was given (no triage)
        return ["", "instances:"] if view.instances else []
    everything = bool(view.query and view.query.get("all"))
    what = "instances" if everything else "instances needing the operator"
    page = f"; page {view.page} of {view.pages} (--page N)" if view.pages > 1 else ""
    shown = f"{len(view.instances)} shown" if len(view.instances) < view.matching else "all shown"
    lines = ["", f"{what}: {view.matching} ({shown}{page})" if view.matching else f"{what}: none"]
    if view.left_out:
        rest = ", ".join(f"{n} {state}" for state, n in view.left_out)
        lines.append(f"  not shown, needing nothing: {rest} (--all shows them)")
    return lines


def _bad_machine_lines(view: FleetStatus, everything: bool) -> list[str]:
    if not view.bad_machines:
        return []
    listed = view.bad_machines if everything else [b for b in view.bad_machines if b.standing == "probation"]
    by_standing: dict[str, int] = {}
    for b in view.bad_machines:
        by_standing[b.standing] = by_standing.get(b.standing, 0) + 1
    counts = ", ".join(f"{n} {state}" for state, n in sorted(by_standing.items()))
    lines = ["", f"machines excluded or on probation: {len(view.bad_machines)} ({counts})"
                 + ("" if everything else "; on probation listed, --all lists every one")]
    for b in listed:
        lines.append(f"  {b.machine_id}  {b.standing}: {b.standing_detail}  <- {b.verdict or 'hand edit'}: "
                     f"{escape_controls(b.reason)}")
    return lines


def render_text(view: FleetStatus, *, everything: bool = True) -> str:
    """`everything=False` (fleet status without --all): bad machines as counts, only those on probation listed."""
    lines = [f"fleet status at {view.at}"]
    if view.last_pass and view.last_pass.get("at"):
        lines.append(f"reconciler: last pass {view.last_pass.get('at')}: {view.last_pass.get('headline')}")
        cond = view.last_pass.get("condition")
        if isinstance(cond, dict):
            lines.append(f"  condition: {cond.get('type')}={cond.get('status')} {cond.get('reason')} since "
                         f"{cond.get('since')}: {cond.get('message')}")
    if view.last_pass and view.last_pass.get("exposure"):
        lines.append(f"warning: {view.last_pass['exposure']}")
    leadership = view.last_pass.get("leadership") if view.last_pass else None
    if isinstance(leadership, dict) and leadership.get("summary"):
        lines.append(f"leader: {leadership['summary']} (as of {leadership.get('at') or 'the last pass'})")
    lines.append("")
    header = ("POOL", "GPU", "DESIRED", "RUNNING", "BENCHMARKING", "OK", "BAD", "MIN/H", "KILL-BUDGET", "STATE")
    rows = [header] + [(p.name, p.gpu_name, str(p.desired), str(p.running), str(p.benchmarking), str(p.ok),
                        str(p.bad), f"{p.min_rate_proofs_per_hour:g}", f"{p.kill_budget_used}/{p.kill_budget_allowed}",
                        p.state) for p in view.pools]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
    if view.capacity:
        lines += ["", "capacity (autoscaled pools; bounds in fleet.yaml, decisions in capacity.yaml):"]
        for c in view.capacity:
            lines.append(f"  {c.pool}: {c.summary()}")
            lines.append(f"      {c.last()}")
            if c.note:
                lines.append(f"      now: {c.note}")
            if c.market is not None:
                lines.append(f"      {c.market.summary()}")
            lines.append(f"      ${c.usd_per_hour_at_min:.2f}/h at min, ${c.usd_per_hour_at_max:.2f}/h at max "
                         "(max price)")
    lines += _suspect_lines(view)
    lines += _instances_heading(view)
    for i in view.instances:
        where = f"machine {i.machine_id or '?'}" + (f" (host {i.host_id})" if i.host_id else "")
        verdict = f" {i.verdict}" if i.verdict and i.verdict != i.state else ""
        standing = f" [machine {i.standing}]" if i.standing and i.standing not in ("ok", i.state) else ""
        lines.append(f"  {i.instance_id}  {i.pool or '?'}  {where}  {i.state}{verdict}{standing}")
        if i.root_cause:  # the root cause first (issue 14), then how the attempt went
            lines.append(f"      {escape_controls(i.root_cause)}")  # one line, whatever an older record holds
        lines.append(f"      {render_timeline(i.timeline)}")
        if i.serving is not None:
            lines.append(f"      serving: {i.serving.summary}{_gpu_text(i.serving.gpus)}")
    lines += _bad_machine_lines(view, everything)
    if view.early_saved_minutes:
        lines += ["", f"early verdicts saved ~{view.early_saved_minutes:.0f} benchmark minutes, "
                      f"<= ${view.early_saved_usd_at_most:.2f} (at the pools' max price)"]
    for problem in view.record_problems:
        lines.append(f"unreadable record (excluded from offers until fixed): {problem}")
    if view.market is not None:
        m = view.market
        lines += ["", f"marketplace (fleet {m.fleet}, labels {m.label_prefix}*, as of the last apply {m.at}):",
                  f"  {m.cap_line()}"]
        if m.wait is not None:
            lines.append(f"  the market asked us to wait: no call before {m.wait.get('until')} ({m.wait.get('why')})")
        if m.orphans:
            lines.append(f"  {len(m.orphans)} instance(s) with this fleet's label and no slot (orphans):")
        for o in m.orphans:
            price = o.get("price_usd_per_hour")
            age = o.get("age_s")
            lines.append(f"    {o.get('contract_id')}  {o.get('label')}  machine {o.get('machine_id')}  "
                         f"{o.get('status')}  {'?' if price is None else f'${float(price):.2f}/h'}  "
                         f"{'age ?' if age is None else f'{float(age) / 60:.0f} min old'}  "
                         f"{'DUE: destroyed by the next apply --workdir' if o.get('due') else 'in grace'}")
            lines.append(f"      {o.get('why')}")
    return "\n".join(lines) + "\n"
