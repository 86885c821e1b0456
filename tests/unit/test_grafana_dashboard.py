"""The sample Grafana dashboard (docs/grafana/gpu-fleet.json) queries only metrics /metrics exposes, and every
metric family we expose appears on it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from reconciler.render.metrics import METRIC_NAMES

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "gpu-fleet.json"
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def _families(expr: str) -> set[str]:
    names = set()
    for word in re.findall(r"\bfleet_[a-z_]+\b", expr):
        for suffix in _SUFFIXES:
            if word.endswith(suffix) and word.removesuffix(suffix) in METRIC_NAMES:
                word = word.removesuffix(suffix)
        names.add(word)
    return names


def test_the_dashboard_uses_exactly_the_exposed_metric_names() -> None:
    doc = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for panel in doc["panels"]:
        for target in panel["targets"]:
            used |= _families(target["expr"])
    assert used - set(METRIC_NAMES) == set(), "dashboard queries metrics that do not exist"
    assert set(METRIC_NAMES) - used == set(), "exposed metrics missing from the sample dashboard"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
