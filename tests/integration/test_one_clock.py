"""One clock (issue 14 item 6): a worker whose clock is skewed (or jumps backwards mid-run) cannot reorder
the timeline or stretch a duration. Order and durations come from the controller's receive time; the worker's
own timestamps are kept as evidence, with the skew, in the API and in the committed verdict evidence."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.flows.judge import run_pass
from tests.controller_support import ADMIN_AUTH, Harness
from tests.fakes import Sleeps
from tests.gitrepos import git, make_origin, origin_file
from tests.scenarios import SPEC_YAML, T0


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "controller.db")
    yield harness
    harness.close()


def test_a_skewed_worker_clock_neither_reorders_the_timeline_nor_hides_its_skew(h: Harness, tmp_path: Path) -> None:
    iid = "rtx4090-0-skew01"
    # The worker's clock runs 3 hours behind, and is stepped back another hour by NTP mid-run.
    h.register(iid)
    sent = [("params", "started", "2026-12-02T15:00:10Z"), ("params", "done", "2026-12-02T15:10:00Z"),
            ("benchmark", "started", "2026-12-02T14:20:00Z"), ("benchmark", "failed", "2026-12-02T14:27:00Z")]
    for phase, status, at in sent:
        doc = {"protocol": 1, "phase": phase, "status": status, "at": at}
        if status == "failed":
            doc.update(exit_code=1, log_tail=["Error: connection refused (os error 111) connecting to 127.0.0.1:9820",
                                              "benchmark.sh: cuzk-bench exited with status 1, 0/10 proofs"])
        assert h.post(iid, "events", doc).status_code == 200
    assert h.post(iid, "result", {"protocol": 1, "outcome": "error", "at": "2026-12-02T14:27:05Z", "exit_code": 1,
                                  "requested": 10, "completed": 0, "failed": 0}).status_code == 200

    report = h.store.report(iid)
    assert report is not None
    arrivals = [e.at for e in report.events]
    assert arrivals == sorted(arrivals) and arrivals[0] > report.registered_at  # controller order = arrival order
    assert [e.worker_at.isoformat() for e in report.events if e.worker_at] == [
        "2026-12-02T15:00:10+00:00", "2026-12-02T15:10:00+00:00", "2026-12-02T14:20:00+00:00",
        "2026-12-02T14:27:00+00:00"]  # evidence kept as sent
    assert report.result is not None and report.result.at > arrivals[-1]
    skew = report.clock_skew_s
    assert skew is not None and -4 * 3600 < skew < -3 * 3600  # about 3 h 33 min behind, seen at the result

    detail = h.client.get(f"/api/instances/{iid}", headers=ADMIN_AUTH).json()
    times = list(detail["timeline"].values())
    assert times == sorted(times) and detail["clock"] == "controller" and detail["worker_clock_skew_s"] == skew

    bare, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    git(tmp_path, "clone", "--quiet", str(bare), str(tmp_path / "bot"))
    outcome = run_pass(GitFleetTree(GitStore(tmp_path / "bot", sleep=Sleeps(), rng=random.Random(1))), h.store,
                       T0 + timedelta(hours=3))
    assert outcome.ok and outcome.pushed, outcome.headline()
    record = yaml.safe_load(origin_file(bare, "fleet-spec/machines/4242.yaml") or "")
    evidence = record["benchmarks"][-1]["evidence"]
    assert evidence["worker_clock_skew_s"] == skew
    phases = list(evidence["phases"].values())
    assert phases == sorted(phases)  # the committed timeline is in order, on one clock
