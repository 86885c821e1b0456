"""Capacity in the views: `fleet status` text and JSON, the page's section and /metrics per autoscaled pool
(utilization now, waiting tasks and the queue's state from the last pass, desired vs bounds, the last
decision, $/h at min and max)."""

from __future__ import annotations

import html

from reconciler.domain.capacity import CapacityEntry, QueueSnapshot, apply_entries, capacity_json, decide_all
from reconciler.domain.records import RecordSet
from reconciler.domain.status import status_view
from reconciler.domain.surfaces import MetricsState
from reconciler.render.html import render_html
from reconciler.render.metrics import fleet_metrics
from reconciler.render.text import render_text
from tests.capacity_support import at, autoscaled_spec, serving

ENTRY = CapacityEntry("rtx4090", 2, (0, 1, 2), (2,), at(50), "down", "utilization 0.20 for 30 min; no task waiting")


def _view(queue: QueueSnapshot):  # type: ignore[no-untyped-def]
    spec = apply_entries(autoscaled_spec(), {"rtx4090": ENTRY})
    reports = [serving(f"i-{i}", f"rtx4090-{i}", [True] * 12) for i in range(3)]
    decisions = decide_all(spec, {"rtx4090": ENTRY}, reports, {"rtx4090": queue}, at(57))
    last_pass = {"at": "x", "headline": "nothing new", "capacity": [capacity_json(d, at(57)) for d in decisions]}
    return status_view(spec, RecordSet(machines={}), reports, at(57), last_pass=last_pass,
                       capacity_entries={"rtx4090": ENTRY})


def test_status_text_and_json_show_desired_vs_bounds_utilization_queue_and_the_last_decision() -> None:
    view = _view(QueueSnapshot({"PoRep": 4}, {"PoRep": 1}))
    (c,) = view.capacity
    assert (c.pool, c.min, c.max, c.desired, c.slots, c.draining) == ("rtx4090", 1, 8, 2, 3, ("rtx4090-2",))
    assert c.utilization == 1.0 and dict(c.waiting) == {"PoRep": 4} and c.queue_error is None
    text = render_text(view)
    assert ("  rtx4090: desired 2 of 1..8 (3 slot(s), draining rtx4090-2; 3 serving, 0 on the way); utilization "
            "1.00 over 20 min; 4 waiting (PoRep 4)") in text
    # The last change with its own time, direction and reason; this pass's hold on its own line.
    assert "      last change down at 2026-12-02T18:50:00Z: utilization 0.20 for 30 min; no task waiting\n" in text
    assert ("      now: held by the cooldown: utilization 1.00 over 20 min (above target 0.80): 2.0 busy need 3 "
            "machines at target 0.80; the last change (down at 2026-12-02T18:50:00Z) was 7 min ago (< cooldown 15 "
            "min + the 20 min window of a reversal)\n") in text
    assert "$0.50/h at min, $4.00/h at max (max price)" in text
    assert view.to_json()["capacity"][0]["usd_per_hour_at_max"] == 4.0


def test_an_unreadable_queue_is_said_in_status_the_page_and_metrics() -> None:
    view = _view(QueueSnapshot(error="InsufficientPrivilege: permission denied for table harmony_task"))
    assert ("queue unavailable (InsufficientPrivilege: permission denied for table harmony_task): utilization only, "
            "never scaled down on it") in render_text(view)
    page = render_html(view)
    assert '<section id="capacity">' in page and "queue unavailable (InsufficientPrivilege" in page
    metrics = fleet_metrics(lambda: MetricsState(view)).exposition().decode()
    assert 'fleet_pool_queue_up{pool="rtx4090"} 0.0' in metrics
    assert 'fleet_pool_capacity_desired{pool="rtx4090"} 2.0' in metrics
    assert 'fleet_pool_capacity_max{pool="rtx4090"} 8.0' in metrics
    assert 'fleet_pool_draining_instances{pool="rtx4090"} 1.0' in metrics
    assert 'fleet_pool_utilization{pool="rtx4090"} 1.0' in metrics
    ok = fleet_metrics(lambda: MetricsState(_view(QueueSnapshot({"PoRep": 4}, {})))).exposition().decode()
    assert 'fleet_pool_waiting_tasks{pool="rtx4090",task_type="PoRep"} 4.0' in ok
    assert 'fleet_pool_queue_up{pool="rtx4090"} 1.0' in ok


def test_the_pr_comment_shows_usd_per_hour_at_min_and_at_max() -> None:
    from reconciler.render.markdown import render_plan_markdown

    row = {"pool": "rtx4090", "gpu": "RTX 4090", "desired": 2, "running": None, "bad_machines_known": 0,
           "probation_known": 0, "paused": False, "actions": {},
           "autoscaled": {"min": 1, "max": 8, "desired": 2, "usd_per_hour_at_min": 0.5, "usd_per_hour_at_max": 4.0,
                          "target_utilization": 0.8, "queue": ["PoRep"]}}
    text = render_plan_markdown(pools=[row], actions=None, forecasts=[], image_digest=None, notes=[])
    assert "| **rtx4090** | 1..8 | 2 | $0.50 | $4.00 | 0.8 | PoRep |" in text


def test_a_count_held_because_the_fleet_is_unheard_is_said_in_status_the_page_and_metrics() -> None:
    spec = apply_entries(autoscaled_spec(), {"rtx4090": ENTRY})
    silent = [serving(f"i-{i}", f"rtx4090-{i}", [False] * 6) for i in range(3)]  # last heard at minute 26
    decisions = decide_all(spec, {"rtx4090": ENTRY}, silent, {"rtx4090": QueueSnapshot({"PoRep": 0}, {})}, at(57))
    last_pass = {"at": "x", "headline": "nothing new", "capacity": [capacity_json(d, at(57)) for d in decisions]}
    view = status_view(spec, RecordSet(machines={}), silent, at(57), last_pass=last_pass,
                       capacity_entries={"rtx4090": ENTRY})
    sentence = ("held at 2: the controller has heard no worker for 31 min (> lost_after 20 min): its own outage or a "
                "partition, not idleness; every count holds")
    assert f"      now: {sentence}\n" in render_text(view)
    page = render_html(view)
    assert html.escape(sentence) in page and 'data-held-by="fleet-unheard"' in page
    metrics = fleet_metrics(lambda: MetricsState(view)).exposition().decode()
    assert 'fleet_pool_capacity_held{held_by="fleet-unheard",pool="rtx4090"} 1.0' in metrics
