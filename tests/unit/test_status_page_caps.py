"""The status page stays readable and small at fleet scale: tables, charts and timelines are capped, failures
are never the ones left out, and the page says how much it left out."""

from __future__ import annotations

from reconciler.domain.status import FleetStatus, InstanceStatus, PoolStatus, RatePoint
from reconciler.render.html import MAX_CHART_MACHINES, MAX_MACHINE_ROWS, MAX_TIMELINES, render_page
from tests.html_support import parse, table_rows, text_of

N = 400
TIMELINE = (("registered", "2026-12-03T07:00:00Z"), ("bench-done", "2026-12-03T08:00:00Z"))


def big_view() -> FleetStatus:
    pools = (PoolStatus("rtx4090", "RTX 4090", N, N, 0, N - 1, 0, 40.0, 0, 2, "ok"),)
    instances = tuple(
        InstanceStatus(f"rtx4090-{i}-a", "rtx4090", f"rtx4090-{i}", str(100000 + i), None, "RTX 4090", None,
                       "failed" if i == 7 else "ok", TIMELINE, verdict="benchmark-error" if i == 7 else "ok",
                       blame="image" if i == 7 else "none", root_cause="boom (blame: image)" if i == 7 else None,
                       recorded=True) for i in range(N))
    rates = tuple(RatePoint("rtx4090", str(100000 + i), f"rtx4090-{i}-a", "2026-12-03T08:00:00Z",
                            "benchmark-error" if i == 7 else "ok", "image" if i == 7 else "none",
                            None if i == 7 else 40.0 + i / 10, True) for i in range(N))
    return FleetStatus(at="2026-12-03T08:01:00Z", pools=pools, instances=instances, suspects=(), rates=rates)


def test_a_big_fleet_is_shown_capped_with_its_failures_and_counts() -> None:
    page = render_page(big_view())
    dom = parse(page)
    machines = table_rows(dom, "machines")
    assert len(machines) == MAX_MACHINE_ROWS and machines[0][0] == "100007"  # the failure first
    assert f"Showing {MAX_MACHINE_ROWS} of {N} machines" in text_of(dom.find(id="machines-more")[0])
    blocks = dom.find("div", class_="instance")
    assert len(blocks) == MAX_TIMELINES and "rtx4090-7-a" in {b.attrs["data-instance"] for b in blocks}
    assert f"Showing {MAX_TIMELINES} of {N}" in text_of(dom.find(id="timelines-more")[0])
    (plot,) = dom.find("svg", class_="rate-plot")
    labels = [t for t in dom.with_class("machine-label")]
    assert len(labels) == MAX_CHART_MACHINES
    # The fastest machine and the one that measured nothing (the end of the order) are drawn.
    assert {"100399", "100007"} <= {text_of(t) for t in labels} and plot.attrs["data-pool"] == "rtx4090"
    assert len(page) < 600_000
