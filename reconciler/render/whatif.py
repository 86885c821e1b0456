"""`fleet plan --what-if` as text, JSON and the PR comment's section (pure renderers of `domain.whatif.WhatIf`).

The self-check comes first whenever it found a mismatch (with the first differing decision), then per pool a
table of base vs PR and the difference, the machines whose verdict flips with their rates and $/h, the guards
that would have tripped or held otherwise, and what could not be replayed (counted). Markdown collapses long
lists into <details>; every value from records is escaped for tables.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.domain.observations import format_time
from reconciler.domain.replay import Trip
from reconciler.domain.whatif import Flip, Hold, PoolDelta, PoolTotals, WhatIf

WHAT_IF_TITLE = "What would this PR have done?"


@dataclass(frozen=True)
class Header:
    """Where the replay came from: the spec file, the base ref and its commit."""

    spec: str
    base_ref: str
    base_sha: str


def _n(value: float | None, digits: int = 1) -> str:
    """A number to `digits` decimals (two more below 1, so a small difference never shows as 0)."""
    if value is None:
        return "?"
    if digits and 0 < abs(value) < 1:
        digits += 2
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _usd(value: float | None) -> str:
    return "?" if value is None else f"${value:,.2f}"


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _delta(base: float | None, pr: float | None, show: Callable[[float | None], str]) -> str:
    if base is None or pr is None:
        return ""
    d = pr - base
    if abs(d) < 1e-9:
        return "="
    text = show(abs(d))
    return ("+" if d > 0 else "-") + text


def _count_range(t: PoolTotals) -> str:
    if t.average_count is None:
        return "?"
    return f"{t.average_count:.1f} ({t.count_min}..{t.count_max})"


#: (label, how to read a value from PoolTotals, how to show it, whether it has a difference)
_ROWS: tuple[tuple[str, Callable[[PoolTotals], float | None], Callable[[float | None], str]], ...] = (
    ("admitted (passed admission)", lambda t: t.admitted, lambda v: _n(v, 0)),
    ("rejected at admission", lambda t: t.rejected, lambda v: _n(v, 0)),
    ("  of which early verdicts", lambda t: t.early, lambda v: _n(v, 0)),
    ("not rented (excluded or paused)", lambda t: t.not_rented, lambda v: _n(v, 0)),
    ("breaker trips", lambda t: t.trips, lambda v: _n(v, 0)),
    ("guard holds (breaker, kill budget)", lambda t: t.holds, lambda v: _n(v, 0)),
    ("GPU-hours rented", lambda t: t.gpu_hours, lambda v: _n(v)),
    ("idle GPU-hours", lambda t: t.idle_gpu_hours, lambda v: _n(v)),
    ("capacity changes up / down", lambda t: None, lambda v: ""),
    ("p95 task wait", lambda t: t.p95_wait_s, _span),
    ("max task wait", lambda t: t.max_wait_s, _span),
    ("spend", lambda t: t.spend_usd, _usd),
    ("proofs", lambda t: t.proofs, lambda v: _n(v, 0)),
    ("$/proof", lambda t: t.usd_per_proof, lambda v: "?" if v is None else f"${v:.4f}"),
)


def pool_rows(p: PoolDelta) -> list[tuple[str, str, str, str]]:
    """(what, base, PR, difference) rows of one pool."""
    out = []
    for label, get, show in _ROWS:
        if label.startswith("capacity changes"):
            out.append((label, f"{p.base.ups} / {p.base.downs}", f"{p.pr.ups} / {p.pr.downs}",
                        "=" if (p.base.ups, p.base.downs) == (p.pr.ups, p.pr.downs) else
                        f"{p.pr.ups - p.base.ups:+d} / {p.pr.downs - p.base.downs:+d}"))
            out.append(("machines rented (average, min..max)", _count_range(p.base), _count_range(p.pr),
                        _delta(p.base.average_count, p.pr.average_count, lambda v: _n(v))))
            continue
        if label.endswith("task wait") and not (p.base.queue or p.pr.queue):
            continue
        b, r = get(p.base), get(p.pr)
        out.append((label, show(b), show(r), _delta(b, r, show)))
    return out


def _flip_line(f: Flip) -> str:
    rate = f"{_n(f.rate)}/h" if f.rate is not None else "rate ?"
    price = f"${f.price:.2f}/h" if f.price is not None else "$?/h"
    mins = f" (min {_n(f.base_min)} -> {_n(f.pr_min)}/h)" if f.base_min != f.pr_min else ""
    return (f"{format_time(f.at)} {f.pool} machine {f.machine_id} ({f.instance_id}), {rate}, {price}: "
            f"{f.base} -> {f.pr}{mins}")


def _trip_line(t: Trip) -> str:
    return (f"{format_time(t.at)} image {t.image_digest[:19]} on {t.signature!r} ({len(t.machines)} machines; pools "
            f"{', '.join(t.pools) or 'all'})")


def _trip_json(t: Trip) -> dict[str, Any]:
    """A trip as the report gives it: how many machines it stood on, not which."""
    return {**t.__dict__, "at": format_time(t.at), "machines": len(t.machines)}


def _hold_line(h: Hold) -> str:
    return f"{format_time(h.at)} {h.pool} machine {h.machine_id} ({h.instance_id}) {h.verdict} held by {h.held_by}"


def summary_lines(r: WhatIf, header: Header) -> list[str]:
    """The lines every format starts with: the window, what was replayed, the self-check."""
    c = r.self_check
    cap = c.capacity
    lines = [f"window: {r.days:g} days, {format_time(r.since)} .. {format_time(r.until)}; base {header.base_ref} "
             f"({header.base_sha[:12]}), PR spec {header.spec}"
             + ("" if r.spec_changed else " (the same spec as the base: nothing differs)"),
             f"replayed: {r.attempts:,} verdicts in {r.passes:,} passes, {r.demand_samples:,} demand samples of "
             f"{r.demand_pools} pool(s), {r.history_specs} spec version(s) in force"]
    closeness = ""
    if cap.recorded:
        closeness = (f"; capacity {cap.exact + cap.near} of {cap.recorded} changes ({cap.exact} at the same sample"
                     + (f", {cap.near} within {_span(cap.max_shift_s)}" if cap.near else "") + ")")
    resolution = f"; samples every {_span(cap.resolution_s)}" if cap.resolution_s else ""
    if c.ok:
        lines.append(f"self-check passed: the specs as they were reproduce {c.verdicts_matched}/{c.verdicts} "
                     f"verdicts, {c.holds_matched}/{c.holds} guard holds and {c.trips_matched}/{c.trips} breaker "
                     f"trips exactly{closeness}{resolution}")
    else:
        lines.append(f"SELF-CHECK FAILED: {c.mismatch_count} recorded decision(s) not reproduced by the specs as they "
                     f"were (verdicts {c.verdicts_matched}/{c.verdicts}, holds {c.holds_matched}/{c.holds}, trips "
                     f"{c.trips_matched}/{c.trips}{closeness}); first: {c.first}")
    return lines


def render_whatif_text(r: WhatIf, header: Header) -> str:
    lines = [f"what if: {WHAT_IF_TITLE}", *summary_lines(r, header)]
    if not r.self_check.ok:
        lines += [f"  mismatch: {format_time(at)} {what}" for at, what in r.self_check.mismatches]
    for p in r.pools:
        rows = pool_rows(p)
        width = max(len(row[0]) for row in rows)
        cols = [max(len(row[i]) for row in rows) for i in (1, 2)]
        lines += ["", f"pool {p.pool}:", f"  {'':<{width}}  {'BASE':>{cols[0]}}  {'PR':>{cols[1]}}  DIFFERENCE"]
        lines += [f"  {a:<{width}}  {b:>{cols[0]}}  {c:>{cols[1]}}  {d}".rstrip() for a, b, c, d in rows]
        lines += _flip_sums(p)
    admission = [f for f in r.flips if f.stage == "admission"]
    serving = [f for f in r.flips if f.stage == "serving"]
    if admission:
        lines += ["", f"admission flips ({sum(1 for f in r.flips if f.stage == 'admission')}"
                      + (f" listed of {r.flip_count} flips" if r.flip_count > len(r.flips) else "") + "):"]
        lines += [f"  {_flip_line(f)}" for f in admission]
    if serving:
        lines += ["", "serving flips:", *(f"  {_flip_line(f)}" for f in serving)]
    lines += _guard_lines(r, "  ")
    if r.limits:
        lines += ["", "not replayed, or replayed with less (counted, never guessed):"]
        lines += [f"  {_n(limit.count)} {limit.what}" for limit in r.limits]
    return "\n".join(lines) + "\n"


def _flip_sums(p: PoolDelta) -> list[str]:
    out = []
    for label, (n, rate, usd, unpriced) in (("rejected by the PR, passed under the base", p.lost),
                                             ("passed under the PR, rejected under the base", p.gained)):
        if n:
            priced = f", {unpriced} without a recorded price" if unpriced else ""
            out.append(f"  {label}: {n} machine(s), {_n(rate)} proofs/h, ${usd:.2f}/h{priced}")
    return out


def _guard_lines(r: WhatIf, indent: str) -> list[str]:
    out: list[str] = []
    for title, trips in (("breaker trips only under the PR", r.trips_pr_only),
                         ("breaker trips only under the base", r.trips_base_only)):
        if trips:
            out += ["", f"{title}:", *(f"{indent}{_trip_line(t)}" for t in trips)]
    for title, holds in (("holds only under the PR", r.holds_pr_only), ("holds only under the base",
                                                                          r.holds_base_only)):
        if holds:
            out += ["", f"{title}:", *(f"{indent}{_hold_line(h)}" for h in holds)]
    return out


# --- markdown ----------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return html.escape(text, quote=False).replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _details(summary: str, lines: Sequence[str]) -> list[str]:
    return ["<details><summary>" + html.escape(summary, quote=False) + "</summary>", "", *lines, "", "</details>", ""]


def render_whatif_markdown(r: WhatIf, header: Header) -> str:
    """The PR comment's section."""
    c = r.self_check
    out = [f"### {WHAT_IF_TITLE} (last {r.days:g} days)", ""]
    head = summary_lines(r, header)
    if not c.ok:
        out += ["> [!WARNING]", f"> {_cell(head[2])}", ""]
        out += _details(f"{c.mismatch_count} mismatch(es)",
                        [f"- {_cell(format_time(at))} {_cell(what)}" for at, what in c.mismatches])
    out += [f"{_cell(head[0])}  ", f"{_cell(head[1])}  "]
    if c.ok:
        out.append(_cell(head[2]))
    out.append("")
    for p in r.pools:
        out += [f"**{_cell(p.pool)}**", "", "| | base | PR | difference |", "|---|---:|---:|---:|"]
        out += [f"| {_cell(a.strip())} | {_cell(b)} | {_cell(cc)} | {_cell(d)} |" for a, b, cc, d in pool_rows(p)]
        out.append("")
        out += [f"- {_cell(line.strip())}" for line in _flip_sums(p)]
        if _flip_sums(p):
            out.append("")
    admission = [f for f in r.flips if f.stage == "admission"]
    if admission:
        rows = ["| when | pool | machine | rate | $/h | base | PR |", "|---|---|---|---:|---:|---|---|"]
        rows += [f"| {format_time(f.at)} | {_cell(f.pool)} | {_cell(f.machine_id)} | "
                 f"{_n(f.rate) + '/h' if f.rate is not None else '?'} | "
                 f"{'?' if f.price is None else f'${f.price:.2f}'} | {_cell(f.base)} | {_cell(f.pr)} |"
                 for f in admission]
        more = r.flip_count - len(r.flips)
        out += _details(f"{len(admission)} machine(s) whose admission verdict flips"
                        + (f" ({more} more not listed)" if more > 0 else ""), rows)
    serving = [f for f in r.flips if f.stage == "serving"]
    if serving:
        out += _details(f"{len(serving)} serving verdict(s) that flip", [f"- {_cell(_flip_line(f))}" for f in serving])
    guards = _guard_lines(r, "- ")
    if guards:
        out += _details("guards that trip or hold differently",
                        [_cell(line) if line.startswith("- ") else (f"**{_cell(line)}**" if line else "")
                         for line in guards])
    if r.limits:
        out += _details(f"not replayed, or replayed with less ({len(r.limits)})",
                        [f"- {_n(limit.count)} {_cell(limit.what)}" for limit in r.limits])
    return "\n".join(out).rstrip() + "\n"


# --- JSON --------------------------------------------------------------------------------------------------


def whatif_json(r: WhatIf, header: Header) -> dict[str, Any]:
    c = r.self_check

    def totals(t: PoolTotals) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in t.__dict__.items()}

    return {
        "window": {"since": format_time(r.since), "until": format_time(r.until), "days": r.days},
        "base": {"ref": header.base_ref, "commit": header.base_sha}, "spec": header.spec,
        "spec_changed": r.spec_changed,
        "replayed": {"verdicts": r.attempts, "passes": r.passes, "demand_samples": r.demand_samples,
                     "demand_pools": r.demand_pools, "spec_versions": r.history_specs},
        "self_check": {
            "ok": c.ok, "verdicts": c.verdicts, "verdicts_matched": c.verdicts_matched, "holds": c.holds,
            "holds_matched": c.holds_matched, "trips": c.trips, "trips_matched": c.trips_matched,
            "capacity": c.capacity.__dict__, "mismatch_count": c.mismatch_count, "first": c.first,
            "mismatches": [{"at": format_time(at), "what": what} for at, what in c.mismatches]},
        "pools": [{"pool": p.pool, "base": totals(p.base), "pr": totals(p.pr),
                   "rejected_by_pr": dict(zip(("machines", "proofs_per_hour", "usd_per_hour", "unpriced"), p.lost,
                                              strict=True)),
                   "admitted_by_pr": dict(zip(("machines", "proofs_per_hour", "usd_per_hour", "unpriced"), p.gained,
                                              strict=True))} for p in r.pools],
        "flips": [{**f.__dict__, "at": format_time(f.at)} for f in r.flips], "flip_count": r.flip_count,
        "guards": {
            "trips_pr_only": [_trip_json(t) for t in r.trips_pr_only],
            "trips_base_only": [_trip_json(t) for t in r.trips_base_only],
            "holds_pr_only": [{**h.__dict__, "at": format_time(h.at)} for h in r.holds_pr_only],
            "holds_base_only": [{**h.__dict__, "at": format_time(h.at)} for h in r.holds_base_only]},
        "limits": [{"count": limit.count, "what": limit.what} for limit in r.limits],
    }
