"""After admission, end to end: real worker processes on the local marketplace, the real controller (HTTP +
SQLite), a real git origin, the reconciler pass and the provisioner, driven together like `fleet demo`.

Only cuzk and the cluster's demand are stand-ins (worker-image/standin: cuzk-daemon, cuzk-bench, and
proving-load, whose speed a test changes while the machine serves). Time is real but short: the spec asks
for heartbeats every 1.2 s, a 9 s rolling window and a 6 s lost deadline; every wait is bounded by a
deadline and checks a condition, so a loaded 2-core machine only makes the tests slower, not flaky.

Scenarios (the issue's "done when"):
- a machine passes, serves, then slows below the minimum: degraded, recorded, replaced;
- a machine stops heartbeating (its processes frozen, like a host gone silent): lost;
- after a controller outage the workers come back seconds apart: nobody is lost meanwhile;
- a machine hopeless after its first proofs: early verdict, the benchmark ended, the time saved shown;
- a record expires into probation, the machine is rented again, fails again: permanent.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler import REPO_ROOT
from reconciler.adapters.controller.server import ControllerServer
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.marketplace.local import LocalMachine, LocalMarketplace
from reconciler.adapters.params_mirror import ParamsMirrorServer
from reconciler.adapters.record_files import load_records
from reconciler.adapters.slot_provider import SLOT_STATE_FILE, SlotOutputs, SlotProvider, directory_digest
from reconciler.adapters.spec_files import load_spec
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.cli.demo import init_origin, make_params
from reconciler.domain.observations import InstanceReport
from reconciler.domain.status import status_view
from reconciler.flows.judge import PassResult, run_pass
from reconciler.flows.provision import Image, apply_fleet
from reconciler.render.text import render_text
from tests.loop_support import LoopWorld

pytestmark = [
    pytest.mark.slow,  # minutes of real worker processes: `make test` (CI) runs them, the quick loop skips them
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("jq", "curl", "b2sum", "git")),
                       reason="the worker scripts need jq, curl and b2sum (.ci/run installs them)"),
]

WORKER_IMAGE = REPO_ROOT / "worker-image"
DEADLINE_S = 150.0  # per scenario; typically 15-40 s on a loaded 2-core machine


def spec_text(controller_url: str, params_url: str, *, count: int, proofs: int = 4,
              expiry_machine_hours: float = 720.0) -> str:
    # Rates are real-time: the stand-ins run unscaled (STANDIN_TIME_SCALE=1), 0.25 s/proof = 14,400/h.
    doc = {
        "version": 1,
        "image": {"repository": "registry.local/fleet/cuzk-worker", "context": "worker-image"},
        "controller": {"url": controller_url, "log_ring_lines": 2000},
        "params": {"sector_size": "32GiB", "base_url": params_url, "fetch_timeout_minutes": 2},
        "circuit_breaker": {"distinct_machines": 3, "window_hours": 24},
        "kill_budget": {"max_fraction": 1, "min_machines": 3, "window_hours": 24},
        "serving": {"heartbeat_minutes": 0.02, "window_minutes": 0.15, "degraded_after_minutes": 0.05,
                    "degraded_margin": 0.1, "min_proofs": 3, "lost_after_minutes": 0.1, "verdict_wait_minutes": 1},
        "early_verdict": {"enabled": True, "warmup_proofs": 1, "min_measured_proofs": 1},
        "record_expiry": {"hours_by_blame": {"machine": expiry_machine_hours}, "probation_hours": 1},
        "pools": [{"name": "rtx4090", "gpu_name": "RTX 4090", "count": count, "min_rate_proofs_per_hour": 3600,
                   "max_price_usd_per_hour": 0.6, "min_reliability": 0.9,
                   "benchmark": {"proofs": proofs, "concurrency": 1, "timeout_minutes": 1}}],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def machine(tmp: Path, machine_id: str, price: float, seconds_per_proof: float, serve_seconds: float = 0.25,
            **env: str) -> LocalMachine:
    home = tmp / "machines" / machine_id
    return LocalMachine(machine_id=machine_id, host_id=f"h-{machine_id}", gpu_name="RTX 4090",
                        price_usd_per_hour=price, env={
                            "FLEET_USE_STANDINS": "1", "STANDIN_TIME_SCALE": "1",
                            "STANDIN_SECONDS_PER_PROOF": str(seconds_per_proof),
                            "STANDIN_SERVE_SECONDS_PER_PROOF": str(serve_seconds),
                            "STANDIN_STATE_DIR": str(home / "standin"), "STANDIN_DAEMON_STARTUP_S": "0.2",
                            "FLEET_PARAMS_DIR": str(home / "params"),
                            "FLEET_BENCH_C1": str(home / "params" / "c1.json"),
                            "FLEET_DAEMON_POLL_S": "0.2", "FLEET_LOG_SHIP_INTERVAL_S": "0.3",
                            "FLEET_PROGRESS_INTERVAL_S": "1", "FLEET_DIRECTIVE_POLL_S": "0.3",
                            "FLEET_VERDICT_WAIT_S": "60", "FLEET_SERVE_CMD": "proving-load",
                            "FLEET_SERVE_RETRY_S": "1", "FLEET_REPORT_RETRY_BASE_S": "0.2", **env})


@dataclass
class ServingWorld(LoopWorld):
    """The whole loop on this machine: controller, params mirror, origin, reconciler, provisioner."""

    deadline_s = DEADLINE_S
    poll_s = 0.3

    tmp: Path
    machines: list[LocalMachine]
    count: int
    proofs: int = 4
    expiry_machine_hours: float = 720.0
    passes: list[PassResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        make_params(self.tmp / "mirror", 64 << 10)
        self.store = SqliteStore(self.tmp / "controller.db", ring_lines=2000)
        self.secret = secrets.token_bytes(32)
        self.controller = ControllerServer(self.store, self.secret, admin_token=secrets.token_hex(16),
                                           require_machine_claim=True).start()
        self.mirror = ParamsMirrorServer(self.tmp / "mirror")
        self.mirror.start()
        origin = init_origin(self.tmp, spec_text(self.controller.url, self.mirror.url, count=self.count,
                                                 proofs=self.proofs,
                                                 expiry_machine_hours=self.expiry_machine_hours))
        self.bot = GitStore.clone(str(origin), self.tmp / "bot")
        self.ci = GitStore.clone(str(origin), self.tmp / "ci")
        self.market = LocalMarketplace(self.tmp / "market", self.machines)
        self.provider = SlotProvider(self.market, self.secret, on_destroyed=self._destroyed)
        self.state_path = self.tmp / "state" / SLOT_STATE_FILE
        self.image = Image(str(WORKER_IMAGE), directory_digest(WORKER_IMAGE))

    def _destroyed(self, out: SlotOutputs) -> None:
        self.store.mark_destroyed(out.instance_id, datetime.now(UTC))

    def step(self) -> PassResult:
        """CI applies the origin's records (every step: expiries need no commit), then one reconcile pass."""
        self.ci.sync()
        spec = load_spec(self.ci.workdir / "fleet-spec" / "fleet.yaml")
        apply_fleet(spec, load_records(self.ci.workdir / "fleet-spec"), self.provider, self.state_path, self.image,
                    datetime.now(UTC), echo=lambda line: None)
        result = run_pass(GitFleetTree(self.bot), self.store, datetime.now(UTC), desired_image_digest=self.image.digest,
                          directive_sink=self.store)
        assert result.ok, result.headline()
        self.passes.append(result)
        return result

    def reports(self) -> list[InstanceReport]:
        return list(self.store.reports())

    def report_of_machine(self, machine_id: str) -> list[InstanceReport]:
        return [r for r in self.reports() if r.machine_id == machine_id]

    def verdicts(self, machine_id: str) -> list[str]:
        rec = self.records().machines.get(machine_id)
        return [b.verdict for b in rec.benchmarks] if rec else []

    def heartbeats(self, instance_id: str) -> int:
        report = next(r for r in self.reports() if r.instance_id == instance_id)
        return sum(1 for e in report.events if e.phase == "serve" and "heartbeat" in e.details)

    def worker_pid(self, machine_id: str) -> int:
        state = json.loads((self.tmp / "market" / "marketplace.json").read_text())
        pids = [int(rec["pid"]) for rec in state["instances"].values() if rec.get("machine_id") == machine_id]
        assert len(pids) == 1, state
        return pids[0]

    def commit_subjects(self) -> list[str]:
        out = subprocess.run(["git", "-C", str(self.bot.workdir), "log", "--format=%s"], capture_output=True,
                             text=True, check=True).stdout
        return out.splitlines()

    def status_text(self) -> str:
        spec = load_spec(self.bot.workdir / "fleet-spec" / "fleet.yaml")
        return render_text(status_view(spec, self.records(), self.reports(), datetime.now(UTC),
                                       desired_image_digest=self.image.digest))

    def explain(self) -> str:
        lines = [f"passes: {[p.headline() for p in self.passes[-5:]]}", f"commits: {self.commit_subjects()[:6]}"]
        for r in self.reports():
            lines.append(f"{r.instance_id} machine {r.machine_id}: "
                         f"{[(e.phase, e.status) for e in r.events if e.status != 'progress'][-8:]} "
                         f"heartbeats={sum(1 for e in r.events if 'heartbeat' in e.details)} "
                         f"destroyed={r.destroyed_at}")
            lines += [f"    | {line}" for line in r.log_tail[-12:]]
        for log in sorted((self.tmp / "market" / "instances").glob("*/worker.log")):
            lines.append(f"--- {log}")
            lines += log.read_text(errors="replace").splitlines()[-15:]
        return "\n".join(lines)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            state = json.loads((self.tmp / "market" / "marketplace.json").read_text())
            for rec in state["instances"].values():  # a frozen worker must be able to handle its TERM
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(rec["pid"]), signal.SIGCONT)
        for inst in self.market.list_instances():
            with contextlib.suppress(Exception):
                self.market.destroy_instance(inst.contract_id)
        self.bot.close()
        self.ci.close()
        self.controller.stop()
        self.mirror.stop()
        self.store.close()


@pytest.fixture
def make_world(tmp_path: Path) -> Iterator[Callable[..., ServingWorld]]:
    worlds: list[ServingWorld] = []

    def make(machines: list[LocalMachine], **kw: Any) -> ServingWorld:
        world = ServingWorld(tmp_path, machines, **kw)
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        world.close()


def serving_instance(world: ServingWorld, machine_id: str) -> str | None:
    for r in world.report_of_machine(machine_id):
        if r.first("serve", "started") is not None and r.destroyed_at is None:
            return r.instance_id
    return None


def test_a_machine_that_slows_down_while_serving_is_degraded_recorded_and_replaced(
        tmp_path: Path, make_world: Callable[..., ServingWorld]) -> None:
    world = make_world([machine(tmp_path, "m-fast", 0.30, 0.25), machine(tmp_path, "m-spare", 0.40, 0.25)], count=1)
    world.run_until("m-fast passes and sends heartbeats with proofs", lambda w: (
        (i := serving_instance(w, "m-fast")) is not None and w.heartbeats(i) >= 3))
    first = serving_instance(world, "m-fast")
    assert first is not None and world.verdicts("m-fast") == ["ok"]
    assert "serving:" in world.status_text()
    # Thermal throttling: 2 s per proof = 1,800/h, below 3,600/h - 10%.
    (tmp_path / "machines" / "m-fast" / "standin" / "serve-seconds-per-proof").write_text("2\n")
    world.run_until("degraded verdict recorded", lambda w: "degraded" in w.verdicts("m-fast"))
    record = world.records().machines["m-fast"]
    entry = record.benchmarks[-1]
    assert (record.status, entry.verdict, entry.blame, entry.stage) == ("bad", "degraded", "machine", "serving")
    assert entry.reason.startswith("degraded: serving: ") and entry.evidence["window"]["completed"] >= 0
    assert entry.expires_at is not None  # expires by blame (machine: 720 h here)
    assert any("degraded" in s for s in world.commit_subjects())
    # The directive stops serving; the provisioner replaces the slot with the spare machine.
    world.run_until("the spare machine serves in its place", lambda w: serving_instance(w, "m-spare") is not None)
    old = next(r for r in world.reports() if r.instance_id == first)
    assert old.destroyed_at is not None or old.first("serve", "done") is not None


def test_a_machine_that_stops_heartbeating_is_lost(tmp_path: Path, make_world: Callable[..., ServingWorld]) -> None:
    world = make_world([machine(tmp_path, "m-a", 0.30, 0.25), machine(tmp_path, "m-b", 0.35, 0.25),
                        machine(tmp_path, "m-c", 0.50, 0.25)], count=2)
    world.run_until("m-a and m-b serve", lambda w: all(
        (i := serving_instance(w, m)) is not None and w.heartbeats(i) >= 2 for m in ("m-a", "m-b")))
    silent = serving_instance(world, "m-a")
    os.killpg(world.worker_pid("m-a"), signal.SIGSTOP)  # the host goes silent: no exit, no last words
    world.run_until("lost verdict recorded", lambda w: "lost" in w.verdicts("m-a"))
    entry = world.records().machines["m-a"].benchmarks[-1]
    assert (entry.verdict, entry.blame, entry.marks_bad, entry.stage) == ("lost", "marketplace", True, "serving")
    assert entry.instance_id == silent and "no heartbeat for" in entry.reason
    assert entry.expires_at is not None  # a marketplace fault expires soon (24 h by default)
    world.run_until("m-c replaces m-a", lambda w: serving_instance(w, "m-c") is not None)
    assert world.records().machines.get("m-b") is not None and "lost" not in world.verdicts("m-b")


def test_after_a_controller_outage_nobody_is_lost_while_the_fleet_comes_back(
        tmp_path: Path, make_world: Callable[..., ServingWorld]) -> None:
    # Issue 23: the first worker back made every worker not yet back `lost` at the next pass.
    world = make_world([machine(tmp_path, "m-a", 0.30, 0.25), machine(tmp_path, "m-b", 0.35, 0.25)], count=2)
    world.run_until("m-a and m-b serve", lambda w: all(
        (i := serving_instance(w, m)) is not None and w.heartbeats(i) >= 2 for m in ("m-a", "m-b")))
    a, b = serving_instance(world, "m-a"), serving_instance(world, "m-b")
    assert a is not None and b is not None
    port = world.controller.bound_port
    world.controller.stop()  # our outage: the workers queue their heartbeats
    os.killpg(world.worker_pid("m-b"), signal.SIGSTOP)  # m-b will come back later than m-a
    time.sleep(8)  # longer than lost_after (6 s): every worker is silent past the deadline
    heard_a = world.heartbeats(a)
    world.controller = ControllerServer(world.store, world.secret, admin_token=secrets.token_hex(16), port=port,
                                        require_machine_claim=True).start()
    world.run_until("m-a is heard again", lambda w: w.heartbeats(a) > heard_a, timeout_s=30)
    world.step()  # a pass with m-b silent for > 6 s and m-a back: not a verdict yet
    assert "lost" not in world.verdicts("m-b"), world.explain()
    heard_b = world.heartbeats(b)
    os.killpg(world.worker_pid("m-b"), signal.SIGCONT)
    world.run_until("m-b is heard again", lambda w: w.heartbeats(b) > heard_b, timeout_s=30)
    deadline = time.monotonic() + 8  # past lost_after since both came back: still serving, nobody lost
    while time.monotonic() < deadline:
        world.step()
        time.sleep(0.3)
    assert "lost" not in world.verdicts("m-a") and "lost" not in world.verdicts("m-b"), world.explain()
    assert serving_instance(world, "m-a") == a and serving_instance(world, "m-b") == b


def test_a_hopeless_machine_gets_an_early_verdict_and_the_time_saved_is_shown(
        tmp_path: Path, make_world: Callable[..., ServingWorld]) -> None:
    # 1.5 s/proof = 2,400/h < 3,600/h: after the warm-up and one measured proof, 10 more cannot help.
    world = make_world([machine(tmp_path, "m-slow", 0.30, 1.5), machine(tmp_path, "m-good", 0.40, 0.25)],
                       count=1, proofs=12)
    world.run_until("early verdict recorded", lambda w: "early-below-min-rate" in w.verdicts("m-slow"))
    entry = world.records().machines["m-slow"].benchmarks[-1]
    assert entry.marks_bad and entry.evidence["saved"]["minutes"] > 0
    assert "ended early: saved ~" in entry.reason
    subjects = world.commit_subjects()
    assert any("early verdict saved" in s for s in subjects), subjects
    assert "early verdicts saved" in world.status_text()
    # The benchmark did not run its 12 proofs: either the worker read the stop directive and ended it, or the
    # provisioner destroyed the instance first (whichever comes first under load; both stop the bill).
    def ended(w: ServingWorld) -> bool:
        (slow,) = w.report_of_machine("m-slow")
        told = any(e.phase == "benchmark" and e.status == "done" and "ended early by the controller" in
                   (e.message or "") for e in slow.events)
        return told or slow.destroyed_at is not None

    world.run_until("the benchmark ended early", ended)
    (slow,) = world.report_of_machine("m-slow")
    assert slow.result is None or slow.result.completed < 12  # it never ran to the end
    world.run_until("the good machine passes in its place", lambda w: "ok" in w.verdicts("m-good"))


def test_an_expired_record_puts_the_machine_on_probation_and_a_second_failure_is_permanent(
        tmp_path: Path, make_world: Callable[..., ServingWorld]) -> None:
    # One slow machine, records of machine faults expire after ~11 s here.
    world = make_world([machine(tmp_path, "m-slow", 0.30, 1.5)], count=1, proofs=2, expiry_machine_hours=0.003)
    world.run_until("first failure recorded", lambda w: w.verdicts("m-slow") == ["below-min-rate"])
    first = world.records().machines["m-slow"]
    assert first.status == "bad" and first.benchmarks[-1].expires_at is not None
    assert first.standing(datetime.now(UTC)).state == "bad"
    world.run_until("rented again on probation and failed again",
                    lambda w: w.verdicts("m-slow") == ["below-min-rate", "below-min-rate"])
    final = world.records().machines["m-slow"]
    last = final.benchmarks[-1]
    assert last.probation is True and last.expires_at is None and last.reason.endswith("[on probation: permanent]")
    assert final.standing(datetime.now(UTC)).state == "permanent"
    assert "permanent" in world.status_text()
    why = subprocess.run([str(Path(sys.executable).parent / "fleet"), "why", "m-slow", "--repo",
                          str(world.bot.workdir)], capture_output=True, text=True, check=False)
    assert why.returncode == 0, why.stderr
    assert "permanent" in why.stdout and "expiry:    never: failed again while on probation" in why.stdout
