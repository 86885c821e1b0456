"""Evidence is the whole stored log ring and the register body's GPU probe (issue 23 item 3), through the real
controller store (SQLite) and `run_pass` with a real git origin: a decisive line far above the last 50 lines
still decides the verdict, and a store that cannot give the ring judges nothing."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.record_files import load_records
from reconciler.adapters.store.port import REPORT_TAIL_LINES, ControllerStore
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.observations import InstanceReport
from reconciler.domain.tokens import machine_claim
from reconciler.flows.judge import run_pass
from tests.controller_support import SECRET, StepClock, register_doc
from tests.fakes import Sleeps
from tests.gitrepos import git, make_origin
from tests.scenarios import SPEC_YAML

DIGEST = "sha256:" + "ee" * 32
NOW = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)
#: nvidia-smi's own words when the host's driver is unreachable (NVIDIA's nvidia-smi, as it prints them).
UNREACHABLE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.")


def _events(instance_id: str) -> list[dict[str, Any]]:
    daemon_log = ["cuzk-daemon: 2026-12-02T18:22:01.000000Z  WARN cuzk_core::engine: nvidia-smi not available, "
                  "defaulting to single GPU (ordinal 0)"]
    return [{"protocol": 1, "phase": "params", "status": "done", "at": "2026-12-02T18:20:00Z"},
            {"protocol": 1, "phase": "daemon", "status": "failed", "at": "2026-12-02T18:22:02Z", "exit_code": 1,
             "message": "cuzk-daemon exited (code 1) before answering cuzk-bench status", "log_tail": daemon_log}]


def _world(tmp_path: Path) -> tuple[ControllerStore, GitStore]:
    origin, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    git(tmp_path, "clone", "--quiet", str(origin), str(tmp_path / "bot"))
    return (SqliteStore(tmp_path / "controller.db", now=StepClock()),
            GitStore(tmp_path / "bot", sleep=Sleeps(), rng=random.Random(1)))


def _instance(store: ControllerStore, instance_id: str, machine_id: str, *, probe: Sequence[str],
              first_line: str | None) -> None:
    doc = {**register_doc(instance_id), "machine_id": machine_id, "image_digest": DIGEST, "gpus": list(probe),
           "machine_claim": machine_claim(SECRET, instance_id, machine_id)}
    store.register(instance_id, doc)
    setup = [f"2026-12-02T18:{5 + n // 10:02d}:{n % 10 * 6:02d}Z fleet: params: {n} of 120 files verified"
             for n in range(120)]
    store.add_logs(instance_id, [*([first_line] if first_line else []), *setup])
    for event in _events(instance_id):
        store.add_event(instance_id, event)


@pytest.mark.parametrize("where", ["ring", "gpu-probe"])
def test_a_decisive_line_far_above_the_tail_decides_the_verdict(tmp_path: Path, where: str) -> None:
    store, publisher = _world(tmp_path)
    first = f"2026-12-02T18:00:10Z fleet: nvidia-smi failed: {UNREACHABLE}" if where == "ring" else None
    _instance(store, "rtx4090-0-e1de00", "81001", probe=[UNREACHABLE] if where == "gpu-probe" else [],
              first_line=first)
    (report,) = store.reports()
    assert not any("couldn't communicate" in line for line in report.log_tail)  # outside the 50-line tail
    assert len(report.log_tail) == REPORT_TAIL_LINES
    try:
        result = run_pass(GitFleetTree(publisher), store, NOW, desired_image_digest=DIGEST)
    finally:
        store.close()
    (verdict,) = result.verdicts
    assert (verdict.verdict, verdict.blame, verdict.marks_bad) == ("benchmark-error", "machine", True), verdict.reason
    assert verdict.signature == "nvidia-driver-unreachable" and "couldn't communicate" in verdict.reason
    entry = load_records(publisher.workdir / "fleet-spec").machines["81001"].benchmarks[0]
    assert "couldn't communicate with the NVIDIA driver" in entry.reason


class BrokenRings:
    """The store's reports, but its ring cannot be read (a database error mid-pass)."""

    def __init__(self, store: ControllerStore) -> None:
        self.store = store

    def reports(self) -> Sequence[InstanceReport]:
        return self.store.reports()

    def log_rings(self, instance_ids: Sequence[str]) -> Mapping[str, Sequence[str]]:
        raise OSError("disk I/O error")


def test_a_ring_that_cannot_be_read_judges_nothing(tmp_path: Path) -> None:
    store, publisher = _world(tmp_path)
    _instance(store, "rtx4090-0-e1de01", "81002", probe=[], first_line=None)
    try:
        result = run_pass(GitFleetTree(publisher), BrokenRings(store), NOW, desired_image_digest=DIGEST)
    finally:
        store.close()
    assert result.observation_error == "OSError: disk I/O error" and result.verdicts == () and result.commit is None
