"""`fleet plan --what-if` on a history the real loop made: real worker processes on the local marketplace, the real
controller (HTTP + SQLite), a real git origin, the provisioner (`apply_fleet`, with its slot state and prices), the
reconcile pass with its demand recorder, and curio's queue in a REAL PostgreSQL (harmony_task, read-only role).
Only cuzk and the cluster's load are stand-ins (worker-image/standin).

The history (module fixture, ~1-3 min of short timings): pool `fast` (RTX 4090, autoscaled 1..3 on a queue)
grows on waiting PoRep tasks, serves, then drains back to 1 when the tasks are claimed and the load stops; pool
`mixed` (RTX 3090, 4 slots) admits a fast machine, marks a slow one bad, holds the second slow one by its kill
budget (1 per window), and sees two machines fail alike on our image (cuda-error 700, blamed on the image: the
breaker needs 3 machines and never trips).

Then the replays, every expectation read from that history (the records, the commits, the demand files), not
written down beforehand: the unchanged spec reproduces every verdict, hold and capacity change; a raised minimum
rejects exactly the machines measured between the old and the new minimum, with their rates and $/h; a lowered
price cap drops the machines rented above it; slower scaling windows cost waits and save GPU-hours; a tighter
breaker trips on the image and pauses the pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler import REPO_ROOT
from reconciler.adapters.controller.server import ControllerServer
from reconciler.adapters.curio_queue import CurioQueue
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.marketplace.local import LocalMachine, LocalMarketplace
from reconciler.adapters.params_mirror import ParamsMirrorServer
from reconciler.adapters.record_files import RecordCache, load_records
from reconciler.adapters.slot_provider import SLOT_STATE_FILE, SlotOutputs, SlotProvider, directory_digest
from reconciler.adapters.spec_files import load_spec
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.cli import main
from reconciler.cli.demo import init_origin, make_params
from reconciler.cli.surfaces import slot_prices
from reconciler.domain.records import RecordSet
from reconciler.flows.demand import DemandRecorder
from reconciler.flows.judge import PassMemory, PassResult, run_pass
from reconciler.flows.provision import Image, apply_fleet
from tests.gitrepos import git
from tests.loop_support import LoopWorld
from tests.postgres_server import PostgresServer

pytestmark = [
    pytest.mark.slow,  # minutes of real worker processes: `make test` (CI) runs them, the quick loop skips them
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("jq", "curl", "b2sum", "git")),
                       reason="the worker scripts need jq, curl and b2sum (.ci/run installs them)"),
]

WORKER_IMAGE = REPO_ROOT / "worker-image"
DDL = (REPO_ROOT / "tests" / "fixtures" / "curio" / "harmony_task.sql").read_text()
DEADLINE_S = 240.0


def spec_doc(controller_url: str, params_url: str) -> dict[str, Any]:
    # Rates are real-time: the stand-ins run unscaled, 0.25 s/proof = 14,400/h. Priors at stand-in speed, so a
    # machine measured slow ranks below unknown ones (as a real slow machine ranks below the GPU's prior).
    bench = {"proofs": 4, "concurrency": 1, "timeout_minutes": 1}
    return {
        "version": 1,
        "image": {"repository": "registry.local/fleet/cuzk-worker", "context": "worker-image"},
        "controller": {"url": controller_url, "log_ring_lines": 2000},
        "params": {"sector_size": "32GiB", "base_url": params_url, "fetch_timeout_minutes": 2},
        "circuit_breaker": {"distinct_machines": 3, "window_hours": 24},
        "kill_budget": {"max_fraction": 0.25, "min_machines": 1, "window_hours": 24},
        "serving": {"heartbeat_minutes": 0.02, "window_minutes": 0.15, "degraded_after_minutes": 0.5,
                    "degraded_margin": 0.5, "min_proofs": 3, "lost_after_minutes": 0.5, "verdict_wait_minutes": 1},
        "early_verdict": {"enabled": True, "warmup_proofs": 1, "min_measured_proofs": 1},
        "gpu_priors": {"RTX 4090": 9000, "RTX 3090": 6000},
        "pools": [
            {"name": "fast", "gpu_name": "RTX 4090", "count": {"min": 1, "max": 3},
             "min_rate_proofs_per_hour": 3600, "max_price_usd_per_hour": 0.6, "min_reliability": 0.9,
             "benchmark": dict(bench),
             "scaling": {"target_utilization": 0.8, "scale_up_after_minutes": 0.1, "scale_down_after_minutes": 0.1,
                         "cooldown_minutes": 0.1, "cold_start_minutes": 0.2},
             "queue": {"url_env": "CURIO_DB_URL", "task_types": ["PoRep"]}},
            {"name": "mixed", "gpu_name": "RTX 3090", "count": 4, "min_rate_proofs_per_hour": 3600,
             "max_price_usd_per_hour": 0.6, "min_reliability": 0.9, "benchmark": dict(bench)},
        ],
    }


def machine(tmp: Path, machine_id: str, gpu: str, price: float, seconds_per_proof: float, **env: str) -> LocalMachine:
    home = tmp / "machines" / machine_id
    return LocalMachine(machine_id=machine_id, host_id=f"h-{machine_id}", gpu_name=gpu, price_usd_per_hour=price,
                        env={"FLEET_USE_STANDINS": "1", "STANDIN_TIME_SCALE": "1",
                             "STANDIN_SECONDS_PER_PROOF": str(seconds_per_proof),
                             "STANDIN_SERVE_SECONDS_PER_PROOF": "0.25",
                             "STANDIN_STATE_DIR": str(home / "standin"), "STANDIN_DAEMON_STARTUP_S": "0.2",
                             "FLEET_PARAMS_DIR": str(home / "params"),
                             "FLEET_BENCH_C1": str(home / "params" / "c1.json"),
                             "FLEET_DAEMON_POLL_S": "0.2", "FLEET_LOG_SHIP_INTERVAL_S": "0.3",
                             "FLEET_PROGRESS_INTERVAL_S": "1", "FLEET_DIRECTIVE_POLL_S": "0.3",
                             "FLEET_VERDICT_WAIT_S": "60", "FLEET_SERVE_CMD": "proving-load",
                             "FLEET_DRAIN_CMD": "proving-load cordon", "FLEET_UNDRAIN_CMD": "proving-load uncordon",
                             "FLEET_SERVE_RETRY_S": "1", "FLEET_REPORT_RETRY_BASE_S": "0.2", **env})


def machines(tmp: Path) -> list[LocalMachine]:
    return [
        # fast (RTX 4090): all pass; f3 is the dearest.
        machine(tmp, "f1", "RTX 4090", 0.30, 0.25), machine(tmp, "f2", "RTX 4090", 0.40, 0.4),
        machine(tmp, "f3", "RTX 4090", 0.55, 0.3),
        # mixed (RTX 3090): one passes, two are slow, two fail alike on our image.
        machine(tmp, "ok1", "RTX 3090", 0.10, 0.5), machine(tmp, "err1", "RTX 3090", 0.12, 0.3,
                                                              STANDIN_FAIL="cuda-error", STANDIN_CUDA_CODE="700"),
        machine(tmp, "err2", "RTX 3090", 0.14, 0.3, STANDIN_FAIL="cuda-error", STANDIN_CUDA_CODE="700"),
        machine(tmp, "slow1", "RTX 3090", 0.16, 1.2), machine(tmp, "slow2", "RTX 3090", 0.18, 1.3),
    ]


@dataclass
class World(LoopWorld):
    deadline_s = DEADLINE_S
    poll_s = 0.2

    tmp: Path
    queue_url: str
    passes: list[PassResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        make_params(self.tmp / "mirror", 64 << 10)
        self.store = SqliteStore(self.tmp / "controller.db", ring_lines=2000)
        self.secret = secrets.token_bytes(32)
        self.controller = ControllerServer(self.store, self.secret, admin_token=secrets.token_hex(16),
                                           require_machine_claim=True).start()
        self.mirror = ParamsMirrorServer(self.tmp / "mirror")
        self.mirror.start()
        self.origin = init_origin(self.tmp, yaml.safe_dump(spec_doc(self.controller.url, self.mirror.url),
                                                            sort_keys=False))
        self.bot = GitStore.clone(str(self.origin), self.tmp / "bot")
        self.ci = GitStore.clone(str(self.origin), self.tmp / "ci")
        self.market = LocalMarketplace(self.tmp / "market", machines(self.tmp))
        self.provider = SlotProvider(self.market, self.secret, on_destroyed=self._destroyed)
        self.state_dir = self.tmp / "state"
        self.image = Image(str(WORKER_IMAGE), directory_digest(WORKER_IMAGE))
        self.demand = DemandRecorder(resolution_s=1.0, flush_s=5.0)
        self.tree = GitFleetTree(self.bot, record_cache=RecordCache())  # the loop's: a warm pass after the first
        self.memory = PassMemory()
        self.queue = CurioQueue({"CURIO_DB_URL": self.queue_url})

    def _destroyed(self, out: SlotOutputs) -> None:
        self.store.mark_destroyed(out.instance_id, datetime.now(UTC))

    def step(self) -> PassResult:
        """CI applies the origin's records and capacity, then one reconcile pass (the leader's)."""
        self.ci.sync()
        spec = load_spec(self.ci.workdir / "fleet-spec" / "fleet.yaml")
        apply_fleet(spec, load_records(self.ci.workdir / "fleet-spec"), self.provider,
                    self.state_dir / SLOT_STATE_FILE, self.image, datetime.now(UTC), echo=lambda line: None)
        result = run_pass(self.tree, self.store, datetime.now(UTC), desired_image_digest=self.image.digest,
                          directive_sink=self.store, queue_reader=self.queue, prices=slot_prices(self.state_dir),
                          memory=self.memory, demand=self.demand)
        assert result.ok, result.headline()
        self.passes.append(result)
        return result

    def entries(self, pool: str) -> list[tuple[str, Any]]:
        recs = self.records()
        return [(m, e) for m, r in recs.machines.items() for e in r.benchmarks if e.pool == pool]

    def desired(self, pool: str) -> int | None:
        text = (self.bot.workdir / "fleet-spec" / "capacity.yaml")
        if not text.is_file():
            return None
        for line in text.read_text().splitlines():
            if line.startswith(f'"{pool}":'):
                return int(json.loads(line.split(": ", 1)[1])["desired"])
        return None

    def serving(self, pool: str) -> int:
        return sum(1 for r in self.store.reports() if r.pool == pool and r.first("serve", "started") is not None
                   and r.first("serve", "done") is None and r.destroyed_at is None)

    def idle_load(self) -> None:
        """The cluster stops sending work: every proving load goes into maintenance mode (curio's cordon)."""
        for pid_file in (self.tmp / "machines").glob("f*/standin/daemon-*.pid"):
            pid_file.with_suffix(".cordon").write_text("")

    def explain(self) -> str:
        lines = [f"passes: {[p.headline() for p in self.passes[-4:]]}"]
        for r in self.store.reports():
            lines.append(f"{r.instance_id} {r.pool} machine {r.machine_id}: "
                         f"{[(e.phase, e.status) for e in r.events if e.status != 'progress'][-6:]} "
                         f"destroyed={r.destroyed_at}")
        return "\n".join(lines)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            state = json.loads((self.tmp / "market" / "marketplace.json").read_text())
            for rec in state["instances"].values():
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


@dataclass(frozen=True)
class History:
    checkout: Path  # a clone of the origin at the end
    until: str  # the end of the window, as --at
    spec: dict[str, Any]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresServer) -> Iterator[History]:
    tmp = tmp_path_factory.mktemp("whatif")
    db = postgres_server.create_database().rsplit("/", 1)[1]
    postgres_server.execute(DDL, db)
    postgres_server.execute(
        "INSERT INTO harmony_machines (host_and_port, cpu, ram, gpu) VALUES ('10.0.0.7:1', 1, 1, 1)", db)
    role, password = f"r_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    postgres_server.create_role(role, password)
    postgres_server.execute(f'GRANT CONNECT ON DATABASE "{db}" TO "{role}"')
    postgres_server.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"; GRANT SELECT ON harmony_task TO "{role}"', db)
    world = World(tmp, postgres_server.uri(db, role, password))
    try:
        for _ in range(6):  # PoRep tasks waiting since ten minutes ago: the fast pool must grow
            postgres_server.execute("INSERT INTO harmony_task (posted_time, added_by, name) VALUES "
                                    "(now() - interval '10 minutes', 1, 'PoRep')", db)

        def admitted_and_grown(w: World) -> bool:
            mixed = [e for _, e in w.entries("mixed")]
            failed_on_image = {m for m, e in w.entries("mixed") if e.blame == "image"}
            return (w.desired("fast") == 3 and w.serving("fast") >= 2
                    and any(e.verdict == "ok" for e in mixed) and any(e.marks_bad for e in mixed)
                    and any(e.held_by == "kill-budget" for e in mixed) and len(failed_on_image) >= 2)

        world.run_until("the fast pool grows and the mixed pool judges its machines", admitted_and_grown)
        # Demand ends: the tasks are claimed, the load stops; the fast pool drains back to its minimum.
        postgres_server.execute("UPDATE harmony_task SET owner_id = 1", db)
        world.idle_load()
        world.run_until("the fast pool shrinks to 1", lambda w: w.desired("fast") == 1)
        world.demand.flush_s = 0.0
        world.step()  # the last samples go out
        until = datetime.now(UTC).replace(microsecond=0)
        checkout = tmp / "pr"
        git(tmp, "clone", "--quiet", str(world.origin), str(checkout))
        yield History(checkout, until.isoformat().replace("+00:00", "Z"),
                      yaml.safe_load((checkout / "fleet-spec" / "fleet.yaml").read_text()))
    finally:
        world.close()


def what_if(h: History, capsys: pytest.CaptureFixture[str], change: Callable[[dict[str, Any]], None] | None = None,
            *extra: str) -> dict[str, Any]:
    """`fleet plan --what-if -o json` in the clone, with the spec changed by `change` (the PR)."""
    spec_path = h.checkout / "fleet-spec" / "fleet.yaml"
    doc = json.loads(json.dumps(h.spec))
    if change is not None:
        change(doc)
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        capsys.readouterr()
        assert main(["plan", "--spec", str(spec_path), "--what-if", "--since", "1d", "--at", h.until,
                     "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["what_if"]
    finally:
        git(h.checkout, "checkout", "--quiet", "--", "fleet-spec/fleet.yaml")


def records_of(h: History) -> RecordSet:
    return load_records(h.checkout / "fleet-spec")


def test_the_unchanged_spec_reproduces_every_recorded_verdict_hold_and_capacity_change(
        history: History, capsys: pytest.CaptureFixture[str]) -> None:
    doc = what_if(history, capsys)
    check = doc["self_check"]
    assert check["ok"], check["mismatches"]
    entries = [e for r in records_of(history).machines.values() for e in r.benchmarks]
    assert check["verdicts"] == check["verdicts_matched"] == len(entries) == doc["replayed"]["verdicts"]
    assert check["holds"] == check["holds_matched"] == sum(1 for e in entries if e.held_by) >= 1
    cap = check["capacity"]
    assert cap["recorded"] >= 2 and cap["exact"] == cap["recorded"], cap  # up to 3, back down to 1
    assert doc["spec_changed"] is False and doc["flips"] == []
    assert doc["replayed"]["demand_samples"] > 0


def _admissions(h: History, pool: str | None = None) -> list[tuple[str, Any]]:
    """(machine id, entry) of every recorded admission verdict (of `pool`)."""
    return [(m, e) for m, r in records_of(h).machines.items() for e in r.benchmarks
            if e.stage != "serving" and (pool is None or e.pool == pool)]


def test_a_raised_minimum_shows_the_machines_it_would_have_rejected_with_their_rates_and_prices(
        history: History, capsys: pytest.CaptureFixture[str]) -> None:
    passed = [(m, e) for m, e in _admissions(history) if e.verdict == "ok"]
    rates = sorted({e.proofs_per_hour for _, e in passed})
    assert len(rates) >= 2, passed  # the history has fast and slower passing machines
    new_min = rates[-1] - 1  # every passing machine but the fastest measured below it

    def raise_min(doc: dict[str, Any]) -> None:
        for pool in doc["pools"]:
            pool["min_rate_proofs_per_hour"] = new_min

    doc = what_if(history, capsys, raise_min)
    assert doc["self_check"]["ok"]
    flips = {f["instance_id"]: f for f in doc["flips"] if f["stage"] == "admission"}
    below = [(m, e) for m, e in passed if e.proofs_per_hour < new_min]
    for machine_id, e in below:
        f = flips[e.instance_id]
        assert (f["machine_id"], f["base"], f["rate"], f["price"]) == (machine_id, "ok", e.proofs_per_hour,
                                                                       e.price_usd_per_hour)
        # Rejected (the kill budget may hold it: then it is not marked bad, but it does not pass either).
        assert f["pr"].split(" (held by")[0] in ("below-min-rate", "early-below-min-rate") and f["pr_min"] == new_min
    kept = {e.instance_id for _, e in passed if e.proofs_per_hour >= new_min}
    assert kept and not kept & {i for i, f in flips.items() if f["base"] == "ok"}
    # Per pool: how many it would have rejected, the proofs/h they measured and the $/h they cost.
    for pool in doc["pools"]:
        mine = [e for _, e in below if e.pool == pool["pool"]]
        lost = pool["rejected_by_pr"]
        assert lost["machines"] == len(mine)
        assert lost["proofs_per_hour"] == pytest.approx(sum(e.proofs_per_hour for e in mine))
        assert lost["usd_per_hour"] == pytest.approx(sum(e.price_usd_per_hour or 0 for e in mine))
        assert lost["unpriced"] == sum(1 for e in mine if e.price_usd_per_hour is None) == 0


def test_a_lower_price_cap_drops_the_machines_rented_above_it(
        history: History, capsys: pytest.CaptureFixture[str]) -> None:
    fast = _admissions(history, "fast")
    prices = sorted({e.price_usd_per_hour for _, e in fast})
    assert None not in prices and len(prices) >= 2  # the leader recorded what each machine cost
    cap = prices[-1] - 0.01

    def lower_cap(doc: dict[str, Any]) -> None:
        doc["pools"][0]["max_price_usd_per_hour"] = cap

    doc = what_if(history, capsys, lower_cap)
    above = {e.instance_id for _, e in fast if e.price_usd_per_hour > cap}
    dropped = {f["instance_id"]: f for f in doc["flips"] if f["pr"] == "not rented"}
    assert set(dropped) == above
    assert all("above the pool's max price" in f["reason"] for f in dropped.values())
    pool = next(p for p in doc["pools"] if p["pool"] == "fast")
    assert pool["pr"]["not_rented"] == len(above) and pool["base"]["not_rented"] == 0
    assert any("which offer would have filled" in limit["what"] or "would not have rented" in limit["what"]
               for limit in doc["limits"])


def test_slower_scaling_windows_save_gpu_hours_and_cost_task_waits(
        history: History, capsys: pytest.CaptureFixture[str]) -> None:
    def slower(doc: dict[str, Any]) -> None:
        doc["pools"][0]["scaling"]["scale_up_after_minutes"] *= 3

    doc = what_if(history, capsys, slower)
    fast = next(p for p in doc["pools"] if p["pool"] == "fast")
    base, pr = fast["base"], fast["pr"]
    assert base["ups"] >= 1  # history grew on its queue
    assert pr["gpu_hours"] < base["gpu_hours"]
    assert pr["max_wait_s"] >= base["max_wait_s"] and pr["p95_wait_s"] >= base["p95_wait_s"]
    assert doc["self_check"]["ok"] and doc["flips"] == []  # scaling changes no verdict


def test_a_tighter_breaker_trips_on_the_failing_image_and_pauses_the_pool(
        history: History, capsys: pytest.CaptureFixture[str]) -> None:
    failures = sorted((e.at, m, e) for m, e in _admissions(history, "mixed") if e.blame == "image")
    machines = {m for _, m, _ in failures}
    assert len(machines) == 2 and len({e.signature for *_, e in failures}) == 1  # two machines, one signature
    # History: the breaker needs 3 machines and never tripped. The PR's needs 2: it trips at the first failure
    # of the second machine.
    second = next(at for at, m, _ in failures if m != failures[0][1])

    def tighter(doc: dict[str, Any]) -> None:
        doc["circuit_breaker"]["distinct_machines"] = 2

    doc = what_if(history, capsys, tighter)
    assert doc["guards"]["trips_base_only"] == []
    (trip,) = doc["guards"]["trips_pr_only"]
    assert (trip["at"], trip["signature"], trip["pools"], trip["machines"]) == (
        second, failures[0][2].signature, ["mixed"], 2)
    held = {h["instance_id"] for h in doc["guards"]["holds_pr_only"] if h["held_by"] == "circuit-breaker"}
    assert failures[1][2].instance_id in held  # the failure that tripped it is held, not blamed on the machine
    # Paused: what history rented into the pool on that image after the trip, the PR would not have rented.
    pool = next(p for p in doc["pools"] if p["pool"] == "mixed")
    assert pool["pr"]["trips"] == 1 and pool["pr"]["not_rented"] >= 1 and pool["base"]["not_rented"] == 0
    assert all("was paused" in f["reason"] or "excluded" in f["reason"]
               for f in doc["flips"] if f["pr"] == "not rented")


def test_the_pr_comment_section_and_the_text_say_the_same(
        history: History, capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = history.checkout / "fleet-spec" / "fleet.yaml"
    doc = yaml.safe_load(spec_path.read_text())
    doc["pools"][1]["min_rate_proofs_per_hour"] = 8000
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        capsys.readouterr()
        argv = ["plan", "--spec", str(spec_path), "--what-if", "--since", "1d", "--at", history.until]
        assert main([*argv, "--format", "markdown"]) == 0
        markdown = capsys.readouterr().out
        assert main(argv) == 0
        text = capsys.readouterr().out
    finally:
        git(history.checkout, "checkout", "--quiet", "--", "fleet-spec/fleet.yaml")
    assert "### What would this PR have done? (last 1 days)" in markdown
    assert "self-check passed" in markdown and "self-check passed" in text
    ok1 = next(e for m, e in _admissions(history, "mixed") if m == "ok1" and e.verdict == "ok")
    assert f"| {ok1.at} | mixed | ok1 |" in markdown and "<details><summary>" in markdown
    assert f"mixed machine ok1 ({ok1.instance_id})" in text
