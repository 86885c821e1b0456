"""The fleet status as one self-contained static HTML page (`fleet status --html out.html`).

A pure renderer of `reconciler.domain.status.FleetStatus` (the single source of the status data): no
status is computed here, only laid out. The page has no external JS, CSS or fonts, so it works from a file,
behind any static web server and offline; plots are inline SVG drawn here. Every string that comes from a
worker report or a record (log lines, reasons, ids) is untrusted and goes through `_e` (html.escape).
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from reconciler.domain.observations import format_time, parse_time
from reconciler.domain.status import BadMachineStatus, FleetStatus, InstanceStatus, PoolStatus, RatePoint, SuspectStatus
from reconciler.domain.verdicts import RATE_VERDICTS
from reconciler.render.text import render_timeline

OK_COLOR = "#2e7d32"
BAD_COLOR = "#c62828"
IMAGE_COLOR = "#ef6c00"
NEUTRAL_COLOR = "#607d8b"
#: Timeline segment colour by the step the segment leads to (what the instance was busy with).
SEGMENT_COLORS = {"params": "#1e88e5", "daemon": "#8e24aa", "bench": "#8e24aa", "result": "#8e24aa",
                  "destroyed": "#9e9e9e"}

CSS = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1c2430;
       background: #f4f6f8; }
header { background: #1c2430; color: #fff; padding: 14px 24px; }
header h1 { margin: 0 0 6px; font-size: 22px; }
header dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0; font-size: 13px; }
header dt { color: #9fb0c3; }
header dd { margin: 0; font-family: ui-monospace, "DejaVu Sans Mono", monospace; word-break: break-all; }
main { padding: 8px 24px 32px; max-width: 1500px; }
section { background: #fff; border: 1px solid #dde3ea; border-radius: 6px; margin: 16px 0; padding: 12px 16px; }
h2 { font-size: 17px; margin: 0 0 10px; }
h3 { font-size: 14px; margin: 12px 0 4px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e6ebf0; vertical-align: top; }
th { background: #eef2f6; font-weight: 600; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
.empty { color: #6b7785; font-style: italic; }
.state-ok { color: #2e7d32; font-weight: 600; }
.state-alert { color: #b71c1c; font-weight: 600; }
tr.alert td { background: #fff3f0; }
.banner { background: #fdecea; border: 1px solid #f5c2bd; color: #8a1c12; padding: 8px 12px; border-radius: 6px;
          margin: 16px 0 0; font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; max-width: 100%; overflow-x: auto; }
figcaption { font-size: 12px; color: #4a5663; max-width: 640px; }
.instance { border-top: 1px solid #e6ebf0; padding: 8px 0; }
.instance:first-of-type { border-top: none; }
.instance .head { display: flex; flex-wrap: wrap; gap: 4px 14px; align-items: baseline; }
.instance .id { font-weight: 600; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px; color: #fff;
         background: #607d8b; }
.badge.ok { background: #2e7d32; } .badge.failed { background: #c62828; } .badge.benchmarking { background: #1e88e5; }
.badge.destroyed { background: #757575; }
.root-cause { color: #b71c1c; font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px;
              white-space: pre-wrap; word-break: break-word; margin-top: 2px; }
.root-cause.image { color: #bf5000; }
.steps { color: #4a5663; font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
ul.problems li { color: #8a1c12; font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px;
                 white-space: pre-wrap; word-break: break-word; }
.legend span { margin-right: 14px; font-size: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
"""


def _e(value: object) -> str:
    """Escape anything for HTML text and attribute values (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _short_digest(digest: str | None) -> str:
    return digest[:19] if digest else ""


# --- sections --------------------------------------------------------------------------------------------


def _header(view: FleetStatus, spec_source: str | None) -> str:
    rows = [("spec", spec_source or "(not given)"), ("generated at", view.at),
            ("image digest", view.desired_image_digest or "unknown (stale-image checks off)")]
    last = view.last_pass if isinstance(view.last_pass, Mapping) else None
    if last is not None:
        rows.append(("reconciler last pass", f"{last.get('at', '?')}: {last.get('headline', '')}"))
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows)
    return f'<header><h1>Fleet status</h1><dl id="meta">{items}</dl></header>'


def _problems(view: FleetStatus) -> list[str]:
    out = [*view.notes]
    last = view.last_pass if isinstance(view.last_pass, Mapping) else None
    if last is not None:
        for key, label in (("stalled", "reconciler stalled"), ("observation_error", "reconciler observation failed"),
                           ("error", "reconciler will retry")):
            if last.get(key):
                out.append(f"{label}: {last[key]}")
    out += [f"unreadable record (its machine is excluded from offers until fixed): {p}" for p in view.record_problems]
    return out


def _problems_section(problems: Sequence[str]) -> str:
    if not problems:
        return '<section id="problems"><h2>Problems</h2><p class="empty">None.</p></section>'
    items = "".join(f"<li>{_e(p)}</li>" for p in problems)
    return f'<section id="problems"><h2>Problems ({len(problems)})</h2><ul class="problems">{items}</ul></section>'


def _table(columns: Sequence[str], rows: Iterable[tuple[str, Sequence[str]]], numeric: Iterable[int] = ()) -> str:
    """`rows` are (tr class, already-escaped cells)."""
    num = set(numeric)
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(
        f'<tr class="{css}">' + "".join(f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>"
                                        for i, c in enumerate(cells)) + "</tr>"
        for css, cells in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _pools_section(pools: Sequence[PoolStatus]) -> str:
    if not pools:
        return '<section id="pools"><h2>Pools</h2><p class="empty">No pools (spec not loaded).</p></section>'
    rows = []
    for p in pools:
        alert = p.state != "ok"
        state = f'<span class="{"state-alert" if alert else "state-ok"}">{_e(p.state)}</span>'
        budget = f"{p.kill_budget_used}/{p.kill_budget_allowed}"
        if p.kill_budget_used >= p.kill_budget_allowed:
            budget = f'<span class="state-alert" title="no more machines may be marked bad now">{budget}</span>'
        rows.append(("alert" if alert else "", [
            f"<b>{_e(p.name)}</b>", _e(p.gpu_name), str(p.desired), str(p.running), str(p.benchmarking), str(p.ok),
            str(p.bad), _e(_num(p.min_rate_proofs_per_hour)), budget, state]))
    table = _table(("pool", "GPU", "desired", "running", "benchmarking", "ok", "bad", "min proofs/h",
                    "kill budget used/allowed", "state (paused?)"), rows, numeric=range(2, 9))
    return f'<section id="pools"><h2>Pools</h2>{table}</section>'


def _nice_ceiling(value: float) -> float:
    """The next 'round' axis maximum >= value (1, 2, 2.5, 5 x 10^n)."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= value)


def _point_color(point: RatePoint, min_rate: float) -> str:
    if point.proofs_per_hour is not None and point.verdict in RATE_VERDICTS:
        return OK_COLOR if point.proofs_per_hour >= min_rate else BAD_COLOR
    return IMAGE_COLOR if point.blame == "image" else (BAD_COLOR if point.blame == "machine" else NEUTRAL_COLOR)


def rate_plot_svg(pool: PoolStatus, points: Sequence[RatePoint]) -> str:
    """Rates of every machine benchmarked in `pool` (one column per machine: a bar for its latest measured rate,
    a dot per benchmark, a cross at 0 for a benchmark that measured nothing) and the pool's min-rate line."""
    min_rate = pool.min_rate_proofs_per_hour
    by_machine: dict[str, list[RatePoint]] = {}
    for point in points:
        by_machine.setdefault(point.machine_id, []).append(point)

    def latest_rate(machine: str) -> float:
        rates = [p.proofs_per_hour for p in by_machine[machine] if p.proofs_per_hour is not None]
        return rates[-1] if rates else -1.0

    machines = sorted(by_machine, key=lambda m: (-latest_rate(m), m))
    measured = [p.proofs_per_hour for p in points if p.proofs_per_hour is not None]
    y_max = 4 * _nice_ceiling(max([min_rate, *measured]) * 1.15 / 4)
    left, right, top, bottom, column = 52, 16, 14, 64, 64
    width = max(420, left + right + column * len(machines))
    height = 260
    plot_h = height - top - bottom

    def y(value: float) -> float:
        return top + plot_h * (1 - value / y_max)

    parts = [f'<svg class="rate-plot" data-pool="{_e(pool.name)}" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="proofs per hour per machine in pool {_e(pool.name)}" font-size="11" '
             f'font-family="system-ui, sans-serif">']
    for i in range(5):
        tick = y_max * i / 4
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     f'stroke="#e6ebf0"/><text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" '
                     f'fill="#4a5663">{_e(_num(tick))}</text>')
    parts.append(f'<text x="12" y="{top + plot_h / 2:.1f}" transform="rotate(-90 12 {top + plot_h / 2:.1f})" '
                 f'text-anchor="middle" fill="#4a5663">proofs/hour</text>')
    for index, machine in enumerate(machines):
        cx = left + column * index + column / 2
        samples = by_machine[machine]
        last = latest_rate(machine)
        if last >= 0:
            color = OK_COLOR if last >= min_rate else BAD_COLOR
            parts.append(f'<rect class="rate-bar" data-machine="{_e(machine)}" x="{cx - 14:.1f}" y="{y(last):.1f}" '
                         f'width="28" height="{y(0) - y(last):.1f}" fill="{color}" fill-opacity="0.25" '
                         f'stroke="{color}"><title>{_e(machine)}: latest {_e(_num(last))}/h</title></rect>')
        for point in samples:
            color = _point_color(point, min_rate)
            tip = (f"{point.instance_id} at {point.at}: {point.verdict} (blame: {point.blame})"
                   + ("" if point.recorded else " [not yet recorded]"))
            if point.proofs_per_hour is None:
                yy = y(0) - 6
                parts.append(f'<g class="rate-point no-rate" data-machine="{_e(machine)}" '
                             f'data-verdict="{_e(point.verdict)}"><title>{_e(tip)}: no rate measured</title>'
                             f'<path d="M{cx - 5:.1f},{yy - 5:.1f} l10,10 m0,-10 l-10,10" stroke="{color}" '
                             f'stroke-width="2.5"/></g>')
            else:
                parts.append(f'<circle class="rate-point" data-machine="{_e(machine)}" '
                             f'data-rate="{_e(_num(point.proofs_per_hour))}" data-verdict="{_e(point.verdict)}" '
                             f'cx="{cx:.1f}" cy="{y(point.proofs_per_hour):.1f}" r="4.5" fill="{color}" '
                             f'stroke="#fff"><title>{_e(tip)}: {_e(_num(point.proofs_per_hour))}/h</title></circle>')
        label = f"{_e(machine)}"
        parts.append(f'<text class="machine-label" x="{cx:.1f}" y="{height - bottom + 14}" '
                     f'transform="rotate(-30 {cx:.1f} {height - bottom + 14})" text-anchor="end" '
                     f'fill="#1c2430">{label}</text>')
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#4a5663"/>')
    parts.append(f'<line class="min-rate" data-rate="{_e(_num(min_rate))}" x1="{left}" x2="{width - right}" '
                 f'y1="{y(min_rate):.1f}" y2="{y(min_rate):.1f}" stroke="{BAD_COLOR}" stroke-width="2" '
                 f'stroke-dasharray="6 4"><title>min rate {_e(_num(min_rate))} proofs/hour</title></line>')
    parts.append(f'<text class="min-rate-label" x="{width - right - 2}" y="{y(min_rate) - 5:.1f}" '
                 f'text-anchor="end" fill="{BAD_COLOR}" font-weight="600">min {_e(_num(min_rate))}/h</text>')
    if not machines:
        parts.append(f'<text x="{left + (width - left - right) / 2:.1f}" y="{top + plot_h / 2 + 20:.1f}" '
                     f'text-anchor="middle" fill="#6b7785" font-style="italic">no benchmark results yet</text>')
    parts.append("</svg>")
    return "".join(parts)


def _rates_section(view: FleetStatus) -> str:
    if not view.pools:
        return '<section id="rates"><h2>Rates vs min rate</h2><p class="empty">No pools.</p></section>'
    figures = []
    for pool in view.pools:
        points = [p for p in view.rates if p.pool == pool.name]
        caption = (f"{len({p.machine_id for p in points})} machine(s), {len(points)} benchmark(s). Bar: latest "
                   "measured rate; dot: each benchmark; cross: a benchmark that measured no rate (orange: blamed "
                   "on the image, red: on the machine).")
        figures.append(f'<figure class="rate-figure" data-pool="{_e(pool.name)}"><h3>{_e(pool.name)} '
                       f'({_e(pool.gpu_name)}), min {_e(_num(pool.min_rate_proofs_per_hour))} proofs/h</h3>'
                       f"{rate_plot_svg(pool, points)}<figcaption>{_e(caption)}</figcaption></figure>")
    return f'<section id="rates"><h2>Rates vs min rate</h2><div class="charts">{"".join(figures)}</div></section>'


def _segment_color(label: str) -> str:
    return SEGMENT_COLORS.get(label.split("-")[0], "#90a4ae")


def _marker_color(label: str) -> str:
    if label.endswith("-failed"):
        return BAD_COLOR
    if label == "destroyed":
        return "#424242"
    return "#1c2430"


#: Label rows around a timeline bar (y offsets from the bar), in order of preference.
_LABEL_LANES = (-12, 20, -25, 33)


def timeline_svg(instance: InstanceStatus, now: str) -> str:
    """One instance's lifecycle on its own time scale: registered ... destroyed, failures in red. A still
    benchmarking instance's bar runs on (dashed) to `now`. Steps at the same second share one label."""
    width, height, left, right, axis_y = 900, 80, 12, 100, 40
    if not instance.timeline:
        return ""
    times = [(label, parse_time(at)) for label, at in instance.timeline]
    start = min(t for _, t in times)
    end = max(t for _, t in times)
    running_to = parse_time(now) if instance.state == "benchmarking" and parse_time(now) > end else None
    span = max(((running_to or end) - start).total_seconds(), 1.0)

    def x(at: datetime) -> float:
        return left + (width - left - right) * max((at - start).total_seconds(), 0.0) / span

    parts = [f'<svg class="timeline" data-instance="{_e(instance.instance_id)}" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-size="11" '
             f'font-family="system-ui, sans-serif">']
    # Time order for the bar (a skewed worker clock may put a phase before registration).
    ordered = sorted(times, key=lambda lt: lt[1])
    for (_, t0), (label, t1) in itertools.pairwise(ordered):
        parts.append(f'<line x1="{x(t0):.1f}" x2="{x(t1):.1f}" y1="{axis_y}" y2="{axis_y}" '
                     f'stroke="{_segment_color(label)}" stroke-width="8"/>')
    if running_to is not None:
        parts.append(f'<line class="still-running" x1="{x(end):.1f}" x2="{x(running_to):.1f}" y1="{axis_y}" '
                     f'y2="{axis_y}" stroke="#1e88e5" stroke-width="8" stroke-dasharray="4 3" opacity="0.6">'
                     f"<title>still running at {_e(now)}</title></line>")
    groups: dict[datetime, list[str]] = {}
    for label, at in times:
        groups.setdefault(at, []).append(label)
    lanes = [-1e9] * len(_LABEL_LANES)  # right edge of the last label in each lane
    for at, labels in sorted(groups.items()):
        cx = x(at)
        failed = any(label.endswith("-failed") for label in labels)
        color = BAD_COLOR if failed else _marker_color(labels[-1])
        text = ", ".join(labels) + ("" if at == start else f" {_offset_text(start, at)}")
        half = 3.1 * len(text)
        anchor_x = min(max(cx, left + half), width - half - 2)
        free = [i for i, edge in enumerate(lanes) if edge < anchor_x - half]
        lane = free[0] if free else min(range(len(lanes)), key=lambda i: lanes[i])
        lanes[lane] = anchor_x + half + 8
        for label in labels:
            css = "event failed" if label.endswith("-failed") else "event"
            parts.append(f'<circle class="{css}" data-label="{_e(label)}" cx="{cx:.1f}" cy="{axis_y}" '
                         f'r="{6 if failed else 4.5}" fill="{_marker_color(label)}" stroke="#fff" stroke-width="1.5">'
                         f"<title>{_e(label)} {_e(format_time(at))}</title></circle>")
        weight = ' font-weight="600"' if failed or "destroyed" in labels else ""
        parts.append(f'<text class="event-label" x="{anchor_x:.1f}" y="{axis_y + _LABEL_LANES[lane]}" '
                     f'text-anchor="middle" fill="{color}"{weight}>{_e(text)}</text>')
    total = _offset_text(start, running_to or end).lstrip("+")
    parts.append(f'<text x="{width - right + 10}" y="{axis_y + 4}" fill="#4a5663">{_e(total)}'
                 f'{" so far" if running_to else ""}</text></svg>')
    return "".join(parts)


def _offset_text(start: datetime, at: datetime) -> str:
    delta = int((at - start).total_seconds())
    if delta < 3600:
        return f"+{delta // 60}m{delta % 60:02d}s"
    return f"+{delta // 3600}h{delta % 3600 // 60:02d}m"


def _instance_block(instance: InstanceStatus, now: str) -> str:
    where = f"machine {instance.machine_id or '?'}" + (f" (host {instance.host_id})" if instance.host_id else "")
    facts = [f'<span class="id">{_e(instance.instance_id)}</span>',
             f'<span class="badge {_e(instance.state)}">{_e(instance.state)}</span>',
             f"<span>pool {_e(instance.pool or '?')}</span>", f"<span>{_e(where)}</span>",
             f"<span>{_e(instance.gpu_name or '')}</span>"]
    if instance.verdict:
        recorded = "" if instance.recorded else " (not yet recorded)"
        facts.append(f'<span class="verdict">verdict <b>{_e(instance.verdict)}</b>{_e(recorded)}</span>')
    if instance.image_digest:
        digest = instance.image_digest
        facts.append(f'<span class="mono" title="{_e(digest)}">{_e(_short_digest(digest))}</span>')
    cause = ""
    if instance.root_cause:
        css = "root-cause image" if instance.blame == "image" else "root-cause"
        cause = f'<div class="{css}">{_e(instance.root_cause)}</div>'
    steps = f'<div class="steps">{_e(render_timeline(instance.timeline))}</div>'
    return (f'<div class="instance" data-instance="{_e(instance.instance_id)}" data-state="{_e(instance.state)}">'
            f'<div class="head">{"".join(facts)}</div>{timeline_svg(instance, now)}{cause}{steps}</div>')


def _timelines_section(view: FleetStatus) -> str:
    legend = ('<div class="legend">' + "".join(
        f'<span><i style="background:{color}"></i>{_e(text)}</span>' for text, color in (
            ("fetching params", SEGMENT_COLORS["params"]), ("daemon + benchmark", SEGMENT_COLORS["bench"]),
            ("until destroyed", SEGMENT_COLORS["destroyed"]), ("failure", BAD_COLOR))) + "</div>")
    if not view.instances:
        body = '<p class="empty">No instances reported yet.</p>'
    else:
        body = legend + "".join(_instance_block(i, view.at) for i in view.instances)
    return f'<section id="timelines"><h2>Instance timelines ({len(view.instances)})</h2>{body}</section>'


def _bad_machines_section(machines: Sequence[BadMachineStatus]) -> str:
    if not machines:
        return '<section id="bad-machines"><h2>Bad machines</h2><p class="empty">No machine is recorded bad.</p>' \
               "</section>"
    rows = [("", [f"<code>{_e(m.machine_id)}</code>", _e(m.host_id or ""), _e(m.gpu_name or ""), _e(m.pool or ""),
                  _e(m.verdict or "(set by hand)"), _e(m.blame or ""), f'<span class="mono">{_e(m.reason)}</span>',
                  _e(m.at or "")]) for m in machines]
    table = _table(("machine_id", "host_id", "GPU", "pool", "verdict", "blame", "reason (root cause)", "date"), rows)
    return f'<section id="bad-machines"><h2>Bad machines ({len(machines)})</h2>{table}</section>'


def _suspects_section(suspects: Sequence[SuspectStatus]) -> str:
    if not suspects:
        return ('<section id="image-suspects"><h2>Image suspects (circuit breaker)</h2>'
                '<p class="empty">No image is suspect.</p></section>')
    rows = [("alert", [f'<code title="{_e(s.image_digest)}">{_e(_short_digest(s.image_digest))}</code>',
                       _e(s.signature), _e(", ".join(s.pools) or "all"), _e(", ".join(s.machines)),
                       _e(s.tripped_at), f'<span class="mono">{_e(s.reason)}</span>']) for s in suspects]
    table = _table(("image digest", "signature", "pools paused", "machines", "tripped at", "reason"), rows)
    return f'<section id="image-suspects"><h2>Image suspects (circuit breaker)</h2>{table}</section>'


def render_html(view: FleetStatus, *, spec_source: str | None = None) -> str:
    """The whole page. Deterministic for a given view (no clock read here: `view.at` is the time shown)."""
    problems = _problems(view)
    banner = (f'<div class="banner" id="problem-banner">{len(problems)} problem(s): see '
              '<a href="#problems">Problems</a> below.</div>' if problems else "")
    body = "".join((
        _header(view, spec_source), "<main>", banner, _pools_section(view.pools), _rates_section(view),
        _timelines_section(view), _bad_machines_section(view.bad_machines), _suspects_section(view.suspects),
        _problems_section(problems), "</main>"))
    return ("<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\">"
            f"<title>fleet status {_e(view.at)}</title><style>{CSS}</style></head>"
            f"<body>{body}</body></html>\n")
