"""`fleet status` on a generated large fleet (bench/shapes.py: records of every machine, a controller store of
instances in every state): what it shows (only what needs the operator: failing, judging, benchmarking, silent
while serving), what it leaves out (serving, destroyed: counted), what --all adds, and the filters; text and
JSON say the same."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from bench.data import spec_yaml, write_records
from bench.shapes import FleetShape, write_fleet_store
from reconciler.cli import main
from reconciler.domain.observations import format_time

MACHINES = 1200
INSTANCES = 1200


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FleetShape]:
    root = tmp_path_factory.mktemp("large")
    spec_dir = root / "fleet-spec"
    spec_dir.mkdir()
    (spec_dir / "fleet.yaml").write_text(spec_yaml(), encoding="utf-8")
    records = write_records(spec_dir, MACHINES, 2)
    shape = write_fleet_store(root / "controller.db", records, INSTANCES)
    return root, shape


def _status(capsys: pytest.CaptureFixture[str], fleet: tuple[Path, FleetShape], *args: str) -> str:
    root, shape = fleet
    code = main(["status", "--spec-dir", str(root / "fleet-spec"), "--controller-db", str(root / "controller.db"),
                 "--at", format_time(shape.now), *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _shown(out: str) -> list[str]:
    return re.findall(r"^  (\S+)  \S+  machine ", out, flags=re.M)


def test_the_shape_has_every_kind(fleet: tuple[Path, FleetShape]) -> None:
    _, shape = fleet
    assert all(len(ids) >= 5 for ids in (shape.serving, shape.failed, shape.destroyed, shape.benchmarking,
                                         shape.silent)), shape


def test_default_shows_only_what_needs_the_operator(fleet: tuple[Path, FleetShape],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _, shape = fleet
    needing = {*shape.failed, *shape.benchmarking, *shape.silent}
    out = _status(capsys, fleet, "--limit", "0")
    shown = _shown(out)
    assert set(shown) == needing and len(shown) == len(needing)
    assert not set(shown) & {*shape.serving, *shape.destroyed}
    # Failures first, then the silent ones, then those still benchmarking.
    order = [0 if i in shape.failed else 1 if i in shape.silent else 2 for i in shown]
    assert order == sorted(order)
    assert f"instances needing the operator: {len(needing)} (all shown)" in out
    assert (f"not shown, needing nothing: {len(shape.serving)} serving, {len(shape.destroyed)} destroyed "
            "(--all shows them)") in out
    # The pools table counts every instance, shown or not.
    pools = json.loads(_status(capsys, fleet, "-o", "json"))["pools"]
    assert sum(p["running"] for p in pools) == INSTANCES - len(shape.destroyed)
    assert sum(p["benchmarking"] for p in pools) == len(shape.benchmarking)
    assert sum(p["ok"] for p in pools) == len(shape.serving) + len(shape.silent)
    # A page at a time by default: the worst first.
    paged = _status(capsys, fleet)
    assert _shown(paged) == shown[:50] and f"page 1 of {-(-len(needing) // 50)}" in paged
    assert _shown(_status(capsys, fleet, "--page", "2")) == shown[50:100]


def test_all_adds_serving_and_destroyed(fleet: tuple[Path, FleetShape], capsys: pytest.CaptureFixture[str]) -> None:
    _, shape = fleet
    out = _status(capsys, fleet, "--all", "--limit", "0")
    shown = _shown(out)
    assert len(shown) == INSTANCES and set(shown) >= {*shape.serving, *shape.destroyed}
    assert "not shown" not in out


def test_filters_and_json_say_the_same(fleet: tuple[Path, FleetShape], capsys: pytest.CaptureFixture[str]) -> None:
    _, shape = fleet
    text = _shown(_status(capsys, fleet, "--pool", "rtx4090-a", "--limit", "0"))
    doc = json.loads(_status(capsys, fleet, "--pool", "rtx4090-a", "--limit", "0", "-o", "json"))
    assert [i["instance_id"] for i in doc["instances"]] == text and text
    assert {i["pool"] for i in doc["instances"]} == {"rtx4090-a"}
    assert doc["matching"] == len(text) and doc["query"]["pools"] == ["rtx4090-a"]
    assert dict(doc["left_out"])["serving"] > 0
    failed = next(i for i in doc["instances"] if i["instance_id"] in shape.failed)
    assert failed["root_cause"] and failed["state"] == "failed" and failed["timeline"]
    one = failed["machine_id"]
    by_machine = json.loads(_status(capsys, fleet, "--machine", one, "--all", "-o", "json"))
    assert {i["machine_id"] for i in by_machine["instances"]} == {one}
    recent = json.loads(_status(capsys, fleet, "--since", format_time(shape.now - timedelta(minutes=10)), "--all",
                                "--limit", "0", "-o", "json"))
    heard = {i["instance_id"] for i in recent["instances"]}
    assert heard and heard <= set(shape.serving)  # silent and destroyed ones said nothing in the last 10 min
    late = json.loads(_status(capsys, fleet, "--since", format_time(shape.now + timedelta(minutes=1)), "--all",
                              "-o", "json"))
    assert late["instances"] == [] and late["matching"] == 0
