"""status_html.render_html on pure status data (no browser): sections, plots, escaping of untrusted strings,
empty and stalled states. The browser rendering is tested in tests/integration/test_status_html.py.

The view comes from `status_view` over the seed incident (the page only lays out that view), plus a worker
whose log ends in hostile markup: log lines are untrusted input and must stay text.
"""

from __future__ import annotations

import re

from reconciler.domain.judging import decide
from reconciler.domain.observations import InstanceReport
from reconciler.domain.records import RecordSet
from reconciler.domain.status import FleetStatus, status_view
from reconciler.render.html import render_html
from tests.html_support import (
    FAST,
    FIRST,
    HOSTILE,
    HOSTILE_LINE,
    NOW,
    RUNNING,
    SECOND,
    SLOW,
    parse,
    table_rows,
    text_of,
)
from tests.scenarios import DIGEST, SPEC, T0


def incident_view(extra_reports: tuple[InstanceReport, ...] = (RUNNING, FAST, HOSTILE),
                  record_problems: tuple[str, ...] = ()) -> FleetStatus:
    """The seed incident as recorded by the loop, plus a still benchmarking and two rtx4090 workers."""
    decided = decide(SPEC, [FIRST, SECOND, SLOW], RecordSet(), set(), DIGEST, NOW)
    records = RecordSet(machines=decided.machine_records, images=decided.image_records, problems=record_problems)
    return status_view(SPEC, records, [FIRST, SECOND, SLOW, *extra_reports], NOW, desired_image_digest=DIGEST,
                       last_pass={"at": "2026-12-02T21:59:30Z", "headline": "nothing new; 0 pending"})


def test_the_page_shows_header_pools_rates_timelines_bad_machines_and_suspects() -> None:
    view = incident_view()
    page = render_html(view, spec_source="fleet-spec/fleet.yaml")
    dom = parse(page)

    meta = text_of(dom.find("dl", id="meta")[0])
    assert "fleet-spec/fleet.yaml" in meta and "2026-12-02T22:00:00Z" in meta and DIGEST in meta
    assert "nothing new; 0 pending" in meta

    pools = text_of(dom.find("section", id="pools")[0])
    assert f"paused: image {DIGEST[:19]} suspect (daemon-connection-refused)" in pools
    rows = {cells[0]: cells for cells in table_rows(dom, "pools")}
    # desired 2, running 4 (3 judged + 1 benchmarking), benchmarking 1, ok 0, bad 1, min 29, kill budget 1/1
    assert rows["rtx-pro-4000"][:9] == ["rtx-pro-4000", "RTX PRO 4000", "2", "4", "1", "0", "1", "29", "1/1"]
    assert rows["rtx4090"][-1] == "ok"

    (pro_plot,) = dom.find("svg", class_="rate-plot", data_pool="rtx-pro-4000")
    assert pro_plot.attrs["data-pool"] == "rtx-pro-4000"
    assert [e.attrs["data-rate"] for e in dom.find("line", class_="min-rate")] == ["29", "40"]
    points = dom.with_class("rate-point")
    assert {(p.attrs["data-machine"], p.attrs["data-verdict"]) for p in points} == {
        ("62001", "below-min-rate"), ("40213", "benchmark-error"), ("51877", "benchmark-error"),
        ("90001", "ok"), ("90002", "benchmark-error")}
    assert [p.attrs["data-rate"] for p in points if "data-rate" in p.attrs] == ["20", "52"]

    blocks = {b.attrs["data-instance"]: b for b in dom.find("div", class_="instance")}
    assert list(blocks) == [i.instance_id for i in view.instances]
    first = text_of(blocks[FIRST.instance_id])
    assert ("benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused (os error 111) "
            "connecting to 127.0.0.1:9820 "
            "(blame: image)") in first
    assert "registered 2026-12-02T18:00:00Z -> params-done +22m00s -> bench-started +25m00s" in first
    assert text_of(blocks[SECOND.instance_id]).count("held by circuit-breaker") == 1
    labels = [e.attrs["data-label"] for e in dom.find("circle") if e.attrs.get("data-label")]
    assert {"registered", "params-done", "bench-started", "bench-failed", "bench-done", "result",
            "destroyed"} <= set(labels)
    failed = [e for e in dom.with_class("failed", "circle")]
    assert {e.attrs["data-label"] for e in failed} == {"bench-failed"} and len(failed) == 3
    assert dom.find("line", class_="still-running")  # the benchmarking instance runs on to `now`

    # Blamed on the image: 40213 and 51877 are never bad machines; the slow one is, with its root cause.
    assert table_rows(dom, "bad-machines") == [["62001", "bad", "7781", "RTX PRO 4000", "rtx-pro-4000",
                                               "below-min-rate",
                                               "machine",
                                               "below-min-rate: benchmark exit 0, 10/10 proofs: "
                                               "20.0/h < 29/h (180.0 s/proof)",
                                               "2026-12-02T22:00:00Z"]]
    suspects = text_of(dom.find("section", id="image-suspects")[0])
    assert "daemon-connection-refused" in suspects and "40213, 51877" in suspects


def test_untrusted_log_lines_reasons_and_problems_are_rendered_inert() -> None:
    view = incident_view(record_problems=(f"fleet-spec/machines/666.yaml: $.note: {HOSTILE_LINE}",))
    page = render_html(view, spec_source="</dd><script>alert(1)</script>")
    dom = parse(page)
    assert not dom.find("script") and not dom.find("img")
    assert "<script>" not in page and "<img" not in page and "onerror=\"" not in page
    (hostile,) = dom.find("div", data_instance=HOSTILE.instance_id)
    cause = text_of(hostile)
    assert HOSTILE_LINE in cause  # shown literally, as text
    problems = text_of(dom.find("section", id="problems")[0])
    assert HOSTILE_LINE in problems
    assert "</dd><script>alert(1)</script>" in text_of(dom.find("dl", id="meta")[0])


def test_an_empty_fleet_renders_every_section_with_its_empty_state() -> None:
    view = status_view(SPEC, RecordSet(), [], T0)
    dom = parse(render_html(view))
    assert "No instances reported yet." in text_of(dom.find("section", id="timelines")[0])
    assert "No machine is recorded bad." in text_of(dom.find("section", id="bad-machines")[0])
    assert "No image is suspect." in text_of(dom.find("section", id="image-suspects")[0])
    assert "None." in text_of(dom.find("section", id="problems")[0]) and not dom.find(id="problem-banner")
    assert "unknown (stale-image checks off)" in text_of(dom.find("dl", id="meta")[0])
    # Each pool still gets its plot with the min-rate line, and says there is nothing measured yet.
    assert [p.attrs["data-pool"] for p in dom.find("svg", class_="rate-plot")] == ["rtx-pro-4000", "rtx4090"]
    assert len(dom.find("line", class_="min-rate")) == 2 and not dom.with_class("rate-point")
    assert text_of(dom.find("section", id="rates")[0]).count("no benchmark results yet") == 2


def test_a_stalled_spec_and_observation_failures_are_listed_as_problems() -> None:
    view = FleetStatus(at="2026-12-02T18:00:00Z", pools=(), instances=(), suspects=(),
                       notes=("spec stalled: fleet.yaml:7: pools[0].count: -1 is less than the minimum of 0",),
                       last_pass={"at": "2026-12-02T17:59:00Z", "observation_error": "StoreError: database is locked",
                                  "headline": "observation failed, nothing judged"})
    dom = parse(render_html(view))
    assert "2 problem(s)" in text_of(dom.find(id="problem-banner")[0])
    problems = [text_of(li) for li in dom.find("li")]
    assert problems == ["spec stalled: fleet.yaml:7: pools[0].count: -1 is less than the minimum of 0",
                        "reconciler observation failed: StoreError: database is locked"]
    assert "No pools (spec not loaded)." in text_of(dom.find("section", id="pools")[0])


def test_the_page_is_a_function_of_the_view_alone() -> None:
    view = incident_view()
    assert render_html(view) == render_html(view)
    page = render_html(view)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched from anywhere
