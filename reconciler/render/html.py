"""The status page from Jinja2 templates (reconciler/render/templates/): the static export (`fleet status --html`)
and the live page the controller serves at `/`, from the same templates.

A pure renderer of the status view (`FleetStatus`) plus the surfaces' extras (`PageExtras`: pool economics,
recent commits, orphans). No status is computed here; charts are laid out here (coordinates, colours) as
small frozen dataclasses and drawn by template macros as inline SVG. Autoescape is on for every template:
every string from a worker report or a record (log lines, reasons, ids) is untrusted and is only ever
rendered escaped. The static page has no script and a CSP that forbids every fetch; the live page adds one
inline script (allowed by a per-response nonce) that re-fetches the `#live` fragment, nothing else.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2

from reconciler.domain.observations import format_time, parse_time
from reconciler.domain.status import BadMachineStatus, FleetStatus, InstanceStatus, PoolStatus, RatePoint
from reconciler.domain.surfaces import PageExtras, total_usd_per_hour
from reconciler.domain.verdicts import RATE_VERDICTS
from reconciler.render.text import render_timeline

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

OK_COLOR = "#2e7d32"
BAD_COLOR = "#c62828"
IMAGE_COLOR = "#ef6c00"
NEUTRAL_COLOR = "#607d8b"
#: Timeline segment colour by the step the segment leads to (what the instance was busy with).
SEGMENT_COLORS = {"params": "#1e88e5", "daemon": "#8e24aa", "bench": "#8e24aa", "result": "#8e24aa",
                  "serve": "#00897b", "destroyed": "#9e9e9e"}


#: What one page shows at most (a 10,000-machine fleet rendered whole is 33 MB and 14 s per refresh);
#: the rest is counted on the page and is in /status.json and `fleet status --json`.
MAX_MACHINE_ROWS = 150
MAX_TIMELINES = 40
MAX_CHART_MACHINES = 48
#: Bad machines listed on the page (those on probation first, then the newest verdicts); all with ?all=1.
MAX_BAD_ROWS = 100


@dataclass(frozen=True)
class LivePage:
    """Set for the page the controller serves: where the fragment is and how often to fetch it."""

    fragment_url: str
    refresh_s: float
    nonce: str


# --- number formatting --------------------------------------------------------------------------------------


def num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}".rstrip("0").rstrip(".")


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}"


def short_digest(digest: str | None) -> str:
    return digest[:19] if digest else ""


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


def _offset_text(start: datetime, at: datetime) -> str:
    delta = int((at - start).total_seconds())
    if delta < 3600:
        return f"+{delta // 60}m{delta % 60:02d}s"
    return f"+{delta // 3600}h{delta % 3600 // 60:02d}m"


# --- rate plot per pool ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class Bar:
    machine: str
    x: float
    y: float
    height: float
    color: str
    title: str


@dataclass(frozen=True)
class Dot:
    machine: str
    x: float
    y: float
    color: str
    verdict: str
    rate: str | None  # None: the benchmark measured no rate (drawn as a cross at 0)
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True)
class RatePlot:
    pool: str
    width: int
    height: int
    left: int
    right_x: int
    plot_mid_y: float
    zero_y: float
    min_rate: str
    min_rate_y: float
    ticks: tuple[Tick, ...]
    bars: tuple[Bar, ...]
    dots: tuple[Dot, ...]
    labels: tuple[Label, ...]
    empty_x: float | None  # where to say "no benchmark results yet", None when there are results


def rate_plot(pool: PoolStatus, points: Sequence[RatePoint]) -> RatePlot:
    """Every machine benchmarked in `pool`: a column each (bar: latest measured rate; dot: each benchmark;
    cross at 0: a benchmark that measured nothing) and the pool's min-rate line."""
    min_rate = pool.min_rate_proofs_per_hour
    by_machine: dict[str, list[RatePoint]] = {}
    for point in points:
        by_machine.setdefault(point.machine_id, []).append(point)

    def latest_rate(machine: str) -> float:
        rates = [p.proofs_per_hour for p in by_machine[machine] if p.proofs_per_hour is not None]
        return rates[-1] if rates else -1.0

    machines = sorted(by_machine, key=lambda m: (-latest_rate(m), m))
    if len(machines) > MAX_CHART_MACHINES:
        # Evenly spaced by rate, fastest and slowest kept: the distribution stays readable at any fleet size.
        step = (len(machines) - 1) / (MAX_CHART_MACHINES - 1)
        machines = [machines[round(i * step)] for i in range(MAX_CHART_MACHINES)]
        points = [p for p in points if p.machine_id in set(machines)]
    measured = [p.proofs_per_hour for p in points if p.proofs_per_hour is not None]
    y_max = 4 * _nice_ceiling(max([min_rate, *measured]) * 1.15 / 4)
    left, right, top, bottom, column = 52, 16, 14, 64, 64
    width = max(420, left + right + column * len(machines))
    height = 260
    plot_h = height - top - bottom

    def y(value: float) -> float:
        return round(top + plot_h * (1 - value / y_max), 1)

    bars, dots, labels = [], [], []
    for index, machine in enumerate(machines):
        cx = round(left + column * index + column / 2, 1)
        last = latest_rate(machine)
        if last >= 0:
            bars.append(Bar(machine, cx - 14, y(last), round(y(0) - y(last), 1),
                            OK_COLOR if last >= min_rate else BAD_COLOR, f"{machine}: latest {num(last)}/h"))
        for point in by_machine[machine]:
            tip = (f"{point.instance_id} at {point.at}: {point.verdict} (blame: {point.blame})"
                   + ("" if point.recorded else " [not yet recorded]"))
            if point.proofs_per_hour is None:
                dots.append(Dot(machine, cx, y(0) - 6, _point_color(point, min_rate), point.verdict, None,
                                f"{tip}: no rate measured"))
            else:
                dots.append(Dot(machine, cx, y(point.proofs_per_hour), _point_color(point, min_rate), point.verdict,
                                num(point.proofs_per_hour), f"{tip}: {num(point.proofs_per_hour)}/h"))
        labels.append(Label(cx, height - bottom + 14, machine))
    ticks = tuple(Tick(y(y_max * i / 4), num(y_max * i / 4)) for i in range(5))
    return RatePlot(pool=pool.name, width=width, height=height, left=left, right_x=width - right,
                    plot_mid_y=top + plot_h / 2, zero_y=y(0), min_rate=num(min_rate), min_rate_y=y(min_rate),
                    ticks=ticks, bars=tuple(bars), dots=tuple(dots), labels=tuple(labels),
                    empty_x=None if machines else left + (width - left - right) / 2)


# --- rate history per machine (sparkline) -----------------------------------------------------------------


@dataclass(frozen=True)
class Sparkline:
    machine: str
    width: int
    height: int
    path: str  # polyline points of the measured rates in time order ("" with fewer than two)
    dots: tuple[Dot, ...]
    min_rate_y: float | None
    title: str


def sparkline(machine: str, points: Sequence[RatePoint], min_rate: float | None) -> Sparkline:
    """A machine's benchmarks in time order (x: index, not time: a machine benchmarked twice in a minute and
    once a week later still shows three readable dots), rates against the min-rate line."""
    width, height, pad = 140, 32, 4
    ordered = sorted(points, key=lambda p: p.at)
    measured = [p.proofs_per_hour for p in ordered if p.proofs_per_hour is not None]
    y_max = max([*measured, min_rate or 0.0, 1.0]) * 1.15
    step = (width - 2 * pad) / max(len(ordered) - 1, 1)

    def y(value: float) -> float:
        return round(pad + (height - 2 * pad) * (1 - value / y_max), 1)

    dots, line = [], []
    for index, point in enumerate(ordered):
        x = round(pad + step * index if len(ordered) > 1 else width / 2, 1)
        rate = point.proofs_per_hour
        color = _point_color(point, min_rate if min_rate is not None else 0.0)
        dots.append(Dot(machine, x, y(rate or 0.0), color, point.verdict, None if rate is None else num(rate),
                        f"{point.at}: {point.verdict}" + ("" if rate is None else f" {num(rate)}/h")))
        if rate is not None:
            line.append(f"{x},{y(rate)}")
    rates = ", ".join(num(r) for r in measured) or "no rate measured"
    return Sparkline(machine, width, height, " ".join(line) if len(line) > 1 else "", tuple(dots),
                     None if min_rate is None else y(min_rate), f"{machine}: {rates} proofs/h")


@dataclass(frozen=True)
class MachineRow:
    machine_id: str
    pool: str
    verdict: str
    blame: str
    root_cause: str | None
    at: str
    chart: Sparkline


def machine_rows(view: FleetStatus) -> tuple[MachineRow, ...]:
    """One row per machine with a judged benchmark: its latest verdict and root-cause line first, history after."""
    pools = {p.name: p for p in view.pools}
    causes = {i.instance_id: i.root_cause for i in view.instances}
    by_machine: dict[str, list[RatePoint]] = {}
    for point in view.rates:
        by_machine.setdefault(point.machine_id, []).append(point)
    bad = {m.machine_id: m.reason for m in view.bad_machines}
    rows = []
    for machine, points in by_machine.items():
        latest = max(points, key=lambda p: p.at)
        pool = pools.get(latest.pool)
        cause = causes.get(latest.instance_id) or (bad.get(machine) if latest.verdict != "ok" else None)
        rows.append(MachineRow(machine, latest.pool, latest.verdict, latest.blame, cause, latest.at,
                               sparkline(machine, points, pool.min_rate_proofs_per_hour if pool else None)))
    # Failures first (root cause on top), then by pool and machine.
    return tuple(sorted(rows, key=lambda r: (r.verdict == "ok", r.pool, r.machine_id)))


# --- instance timelines -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    x1: float
    x2: float
    color: str


@dataclass(frozen=True)
class Marker:
    label: str
    x: float
    radius: float
    color: str
    failed: bool
    title: str


@dataclass(frozen=True)
class MarkerText:
    x: float
    y: float
    text: str
    color: str
    bold: bool


@dataclass(frozen=True)
class Timeline:
    instance_id: str
    width: int
    height: int
    axis_y: int
    segments: tuple[Segment, ...]
    running: Segment | None
    markers: tuple[Marker, ...]
    texts: tuple[MarkerText, ...]
    total: str
    total_x: int
    now: str


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


def timeline(instance: InstanceStatus, now: str) -> Timeline | None:
    """One instance's lifecycle on its own time scale, failures in red; a still benchmarking instance's bar
    runs on (dashed) to `now`. Steps at the same second share one label."""
    width, height, left, right, axis_y = 900, 80, 12, 100, 40
    if not instance.timeline:
        return None
    times = [(label, parse_time(at)) for label, at in instance.timeline]
    start = min(t for _, t in times)
    end = max(t for _, t in times)
    running_to = parse_time(now) if instance.state == "benchmarking" and parse_time(now) > end else None
    span = max(((running_to or end) - start).total_seconds(), 1.0)

    def x(at: datetime) -> float:
        return round(left + (width - left - right) * max((at - start).total_seconds(), 0.0) / span, 1)

    # Time order for the bar (a skewed worker clock may put a phase before registration).
    ordered = sorted(times, key=lambda lt: lt[1])
    segments = tuple(Segment(x(t0), x(t1), _segment_color(label))
                     for (_, t0), (label, t1) in itertools.pairwise(ordered))
    running = Segment(x(end), x(running_to), "#1e88e5") if running_to is not None else None
    groups: dict[datetime, list[str]] = {}
    for label, at in times:
        groups.setdefault(at, []).append(label)
    lanes = [-1e9] * len(_LABEL_LANES)  # right edge of the last label in each lane
    markers, texts = [], []
    for at, labels in sorted(groups.items()):
        cx = x(at)
        failed = any(label.endswith("-failed") for label in labels)
        text = ", ".join(labels) + ("" if at == start else f" {_offset_text(start, at)}")
        half = 3.1 * len(text)
        anchor_x = min(max(cx, left + half), width - half - 2)
        free = [i for i, edge in enumerate(lanes) if edge < anchor_x - half]
        lane = free[0] if free else min(range(len(lanes)), key=lambda i: lanes[i])
        lanes[lane] = anchor_x + half + 8
        for label in labels:
            markers.append(Marker(label, cx, 6 if failed else 4.5, _marker_color(label), label.endswith("-failed"),
                                  f"{label} {format_time(at)}"))
        texts.append(MarkerText(round(anchor_x, 1), axis_y + _LABEL_LANES[lane], text,
                                BAD_COLOR if failed else _marker_color(labels[-1]),
                                failed or "destroyed" in labels))
    total = _offset_text(start, running_to or end).lstrip("+") + (" so far" if running_to else "")
    return Timeline(instance.instance_id, width, height, axis_y, segments, running, tuple(markers), tuple(texts),
                    total, width - right + 10, now)


def timelines_shown(instances: Sequence[InstanceStatus], cap: int = MAX_TIMELINES) -> list[InstanceStatus]:
    """At most `cap` instances, in the view's order: failures first, then the others alive, then the latest
    destroyed ones."""
    if len(instances) <= cap:
        return list(instances)
    order = {id(i): n for n, i in enumerate(instances)}

    def priority(i: InstanceStatus) -> tuple[int, int]:
        rank = 0 if i.state == "failed" else 1 if i.state != "destroyed" else 2
        return rank, -order[id(i)]

    chosen = {id(i) for i in sorted(instances, key=priority)[:cap]}
    return [i for i in instances if id(i) in chosen]


# --- problems -------------------------------------------------------------------------------------------


def problems(view: FleetStatus) -> list[str]:
    out = [*view.notes]
    last = view.last_pass if isinstance(view.last_pass, Mapping) else None
    if last is not None:
        for key, label in (("stalled", "reconciler stalled"), ("observation_error", "reconciler observation failed"),
                           ("error", "reconciler will retry")):
            if last.get(key):
                out.append(f"{label}: {last[key]}")
    out += [f"unreadable record (its machine is excluded from offers until fixed): {p}" for p in view.record_problems]
    return out


# --- rendering ---------------------------------------------------------------------------------------------


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR), autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(num=num, money=money, short_digest=short_digest, render_timeline=render_timeline)
    return env


def _bad_rows(view: FleetStatus) -> list[BadMachineStatus]:
    """At most MAX_BAD_ROWS bad machines (every one with --all / ?all=1): probation first, newest verdict next."""
    if (view.query or {}).get("all") or len(view.bad_machines) <= MAX_BAD_ROWS:
        return list(view.bad_machines)
    newest = sorted(view.bad_machines, key=lambda b: b.at or "", reverse=True)
    return sorted(newest, key=lambda b: b.standing != "probation")[:MAX_BAD_ROWS]  # stable: newest within each


@dataclass(frozen=True)
class _Attention:
    """The page's filter form and page links, from the view's query."""

    everything: bool
    pools: tuple[str, ...]
    machines: tuple[str, ...]
    since: str | None
    page_links: tuple[int, ...]

    @classmethod
    def of(cls, view: FleetStatus) -> _Attention:
        q = view.query or {}
        pages = view.pages
        near = {1, pages, *range(max(1, view.page - 3), min(pages, view.page + 3) + 1)}  # first, last, around
        return cls(bool(q.get("all")), tuple(q.get("pools") or ()), tuple(q.get("machines") or ()), q.get("since"),
                   tuple(sorted(near)))

    def link(self, page: int) -> str:
        params = [("pool", p) for p in self.pools] + [("machine", m) for m in self.machines]
        params += [("since", self.since)] if self.since else []
        params += [("all", "1")] if self.everything else []
        return "/?" + urlencode([*params, ("page", str(page))])


@dataclass(frozen=True)
class _Context:
    view: FleetStatus
    extras: PageExtras
    spec_source: str | None
    live: LivePage | None
    problems: list[str] = field(default_factory=list)

    def variables(self) -> dict[str, Any]:
        view = self.view
        machines = machine_rows(view)
        shown = timelines_shown(view.instances)
        economics = {e.pool: e for e in self.extras.economics}
        return {
            "view": view, "extras": self.extras, "spec_source": self.spec_source, "live": self.live,
            "problems": self.problems, "economics": economics,
            "total_usd_per_hour": total_usd_per_hour(self.extras.economics) if self.extras.economics else None,
            "rate_plots": [(pool, rate_plot(pool, [p for p in view.rates if p.pool == pool.name]),
                            [p for p in view.rates if p.pool == pool.name]) for pool in view.pools],
            "machines": machines[:MAX_MACHINE_ROWS], "machines_total": len(machines),
            "timelines": [(i, timeline(i, view.at)) for i in shown], "timelines_total": len(view.instances),
            "chart_cap": MAX_CHART_MACHINES, "attention": _Attention.of(view),
            "bad_rows": _bad_rows(view), "bad_total": len(view.bad_machines),
            "segment_legend": (("fetching params", SEGMENT_COLORS["params"]),
                               ("daemon + benchmark", SEGMENT_COLORS["bench"]),
                               ("until destroyed", SEGMENT_COLORS["destroyed"]), ("failure", BAD_COLOR)),
            "colors": {"ok": OK_COLOR, "bad": BAD_COLOR, "image": IMAGE_COLOR},
        }


def _context(view: FleetStatus, extras: PageExtras | None, spec_source: str | None,
             live: LivePage | None) -> dict[str, Any]:
    return _Context(view, extras or PageExtras(), spec_source, live, problems(view)).variables()


def render_page(view: FleetStatus, *, extras: PageExtras | None = None, spec_source: str | None = None,
                live: LivePage | None = None) -> str:
    """The whole page. Deterministic for given arguments (no clock read: `view.at` is the time shown)."""
    return environment().get_template("status.html.j2").render(_context(view, extras, spec_source, live))


def render_fragment(view: FleetStatus, *, extras: PageExtras | None = None, spec_source: str | None = None) -> str:
    """The `#live` part of the page alone: what the live page's script swaps in on each refresh."""
    return environment().get_template("fragment.html.j2").render(_context(view, extras, spec_source, None))


def render_login(*, action: str, problem: str | None = None, nonce: str = "") -> str:
    return environment().get_template("login.html.j2").render(action=action, problem=problem, nonce=nonce)


def render_html(view: FleetStatus, *, spec_source: str | None = None, extras: PageExtras | None = None) -> str:
    """The static export (`fleet status --html`, the demo's status.html): the same templates, no script."""
    return render_page(view, extras=extras, spec_source=spec_source)
