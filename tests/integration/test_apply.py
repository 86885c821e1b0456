"""`fleet apply` with the local backend: real worker processes, real state files, real records.

Converges a small spec, is a no-op the second time, replaces exactly the slot whose machine gets a bad
record (on another machine; the bad one is never rented again), scales down, and pauses for an image suspect.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.marketplace import vastai
from reconciler.adapters.marketplace.local import LocalMarketplace, load_local_machines
from reconciler.adapters.record_files import (
    image_record_path,
    machine_record_path,
    render_image_record,
    render_machine_record,
)
from reconciler.adapters.slot_provider import directory_digest
from reconciler.cli import main
from reconciler.domain.records import BenchmarkEntry, ImageSuspectRecord, MachineRecord

SPEC = """\
version: 1
image:
  repository: registry.example/worker
  context: {image}
controller:
  url: http://127.0.0.1:9
pools:
  - name: p4090
    gpu_name: RTX 4090
    count: {count}
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.60
    benchmark: {{proofs: 2, concurrency: 1, timeout_minutes: 5, after: serve}}
"""

MACHINES = """\
machines:
  - {machine_id: m-a, host_id: h-1, gpu_name: RTX 4090, price_usd_per_hour: 0.30}
  - {machine_id: m-b, host_id: h-1, gpu_name: RTX 4090, price_usd_per_hour: 0.35}
  - {machine_id: m-c, host_id: h-2, gpu_name: RTX 4090, price_usd_per_hour: 0.40}
  - {machine_id: m-d, host_id: h-3, gpu_name: RTX 4090, price_usd_per_hour: 0.70}
  - {machine_id: m-3090, host_id: h-4, gpu_name: RTX 3090, price_usd_per_hour: 0.10}
"""

SLEEPER = f"{sys.executable} -c 'import time; time.sleep(600)'"


class Fleet:
    def __init__(self, root: Path):
        self.root = root
        self.spec_dir = root / "fleet-spec"
        self.spec_dir.mkdir()
        self.image = root / "worker-image"
        self.image.mkdir()
        (self.image / "entrypoint.sh").write_text("exec sleep 600\n")
        (root / "machines.yaml").write_text(MACHINES)
        self.state = root / "state"
        (root / "secret").write_text("local-demo-controller-secret\n")
        self.set_count(2)

    def set_count(self, count: int) -> None:
        (self.spec_dir / "fleet.yaml").write_text(SPEC.format(image=self.image, count=count))

    def apply(self, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
        code = main(["apply", "--spec", str(self.spec_dir / "fleet.yaml"), "--backend", "local",
                     "--state-dir", str(self.state), "--machines", str(self.root / "machines.yaml"),
                     "--controller-secret-file", str(self.root / "secret"), "--worker-command", SLEEPER, *extra])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    def slots(self) -> dict[str, dict]:
        return json.loads((self.state / "slots.json").read_text())["slots"]

    def market(self) -> LocalMarketplace:
        return LocalMarketplace(self.state / "market", load_local_machines(self.root / "machines.yaml"))

    def mark_bad(self, machine_id: str, *, expires_at: str | None = None, probation_until: str | None = None) -> None:
        entry = BenchmarkEntry(instance_id="x", at="2026-12-02T18:00:00Z", verdict="below-min-rate", blame="machine",
                               marks_bad=True, reason="3.0 proofs/h < 40", proofs_per_hour=3.0,
                               expires_at=expires_at, probation_until=probation_until)
        record = MachineRecord(machine_id=machine_id, status="bad", gpu_name="RTX 4090", benchmarks=(entry,))
        write_text_atomic(machine_record_path(self.spec_dir, machine_id), render_machine_record(record))


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    yield f
    if (f.state / "market").exists():
        market = f.market()
        for inst in market.list_instances():
            market.destroy_instance(inst.contract_id)


def test_converges_then_noop_then_replaces_exactly_the_bad_machine(fleet: Fleet,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out = fleet.apply(capsys)
    assert code == 0, out
    slots = fleet.slots()
    assert sorted(slots) == ["p4090-0", "p4090-1"]
    # cheapest fitting machines by prior/price; the 3090 and the over-cap machine never qualify
    assert {s["machine_id"] for s in slots.values()} == {"m-a", "m-b"}
    assert all(s["instance_id"].startswith(slot + "-") and len(s["instance_id"]) == len(slot) + 7
               for slot, s in slots.items())
    assert all(s["image_digest"] == directory_digest(fleet.image) for s in slots.values())
    running = fleet.market().list_instances()
    # Every instance carries the fleet's label prefix (the orphan sweep's key) + our instance id.
    assert sorted(i.label for i in running) == sorted(f"gpu-fleet/main/{s['instance_id']}" for s in slots.values())
    assert all(i.status == "running" for i in running)
    assert "converged: 2 slot(s), 2 change(s)" in out

    code, out = fleet.apply(capsys)
    assert code == 0 and "converged: 2 slot(s), no changes" in out
    # Only the status moved (loading -> running), and with it the time the status was first seen.
    now_slots = fleet.slots()
    assert all(now_slots[k]["status_since"] >= v["status_since"] for k, v in slots.items())
    assert ({k: {**v, "status_since": 0} for k, v in now_slots.items()}
            == {k: {**v, "status": "running", "status_since": 0} for k, v in slots.items()})

    victim = next(s for s in slots.values() if s["machine_id"] == "m-b")
    survivor = next(s for s in slots.values() if s["machine_id"] == "m-a")
    fleet.mark_bad("m-b")
    code, out = fleet.apply(capsys)
    assert code == 0, out
    after = fleet.slots()
    assert after[survivor["slot"]]["instance_id"] == survivor["instance_id"]  # untouched
    replaced = after[victim["slot"]]
    assert replaced["machine_id"] == "m-c" and replaced["instance_id"] != victim["instance_id"]
    assert "machine-bad: machine m-b is recorded bad" in out
    assert fleet.market().get_instance(victim["contract_id"]) is None  # destroyed, not left running
    labels = {i.label: i.machine_id for i in fleet.market().list_instances()}
    assert "m-b" not in labels.values() and len(labels) == 2

    # the bad machine is never rented again, even when it is the only free fitting one
    fleet.set_count(3)
    code, out = fleet.apply(capsys)
    assert code == 1 and "no offer fits pool p4090" in out and "1 bad machine(s) excluded" in out
    assert "m-b" not in {s["machine_id"] for s in fleet.slots().values()}


def test_scale_down_deletes_highest_slots_and_dead_worker_is_replaced(fleet: Fleet,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    fleet.set_count(3)
    assert fleet.apply(capsys)[0] == 0
    fleet.set_count(1)
    code, out = fleet.apply(capsys)
    assert code == 0, out
    assert list(fleet.slots()) == ["p4090-0"]
    assert out.index("p4090-2") < out.index("p4090-1")
    assert len(fleet.market().list_instances()) == 1

    # kill the worker behind the last slot: the next apply sees it exited and replaces it
    only = fleet.slots()["p4090-0"]
    market = fleet.market()
    market._stop(json.loads((fleet.state / "market" / "marketplace.json").read_text())
                 ["instances"][only["contract_id"]]["pid"], None)
    code, out = fleet.apply(capsys)
    assert code == 0 and "instance-dead" in out
    assert fleet.slots()["p4090-0"]["instance_id"] != only["instance_id"]


def test_image_change_replaces_and_suspect_image_pauses(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet.apply(capsys)[0] == 0
    before = fleet.slots()
    (fleet.image / "entrypoint.sh").write_text("exec sleep 601\n")
    new_digest = directory_digest(fleet.image)
    suspect = ImageSuspectRecord(image_digest=new_digest, signature="command not found", status="suspect",
                                 machines=("m-x", "m-y"), tripped_at="2026-12-02T18:00:00Z", pools=("p4090",))
    write_text_atomic(image_record_path(fleet.spec_dir, new_digest), render_image_record(suspect))
    code, out = fleet.apply(capsys)
    assert code == 1 and "pool p4090 paused" in out and "held by the circuit breaker" in out
    assert ({k: {**v, "status_since": 0} for k, v in fleet.slots().items()}
            == {k: {**v, "status": "running", "status_since": 0} for k, v in before.items()})  # nothing replaced

    image_record_path(fleet.spec_dir, new_digest).unlink()  # a human clears the record
    code, out = fleet.apply(capsys)
    assert code == 0 and out.count("image-changed") == 2
    assert {s["image_digest"] for s in fleet.slots().values()} == {new_digest}


def test_user_errors_are_one_line_without_traceback(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = fleet.apply(capsys, "--image", str(fleet.root / "nope"))
    assert code == 1 and "worker-image directory; not found" in out and "Traceback" not in out
    (fleet.spec_dir / "fleet.yaml").write_text("version: 1\npools: []\n")
    code, out = fleet.apply(capsys)
    assert code == 1 and "missing required field(s)" in out
    code = main(["apply", "--spec", str(fleet.root / "x.yaml"), "--backend", "local", "--state-dir",
                 str(fleet.state)])
    assert code == 1


# --- fleet plan ----------------------------------------------------------------------------------------------


def run_plan(fleet: Fleet, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["plan", "--spec", str(fleet.spec_dir / "fleet.yaml"), *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_plan_without_state_shows_desired_vs_records_only(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    fleet.mark_bad("m-b")
    code, out = run_plan(fleet, capsys)
    assert code == 0
    header, row = out.splitlines()[:2]
    assert header.split() == ["POOL", "GPU", "DESIRED", "RUNNING", "BAD", "KNOWN", "PROBATION", "PAUSED", "ACTIONS"]
    assert row.split() == ["p4090", "RTX", "4090", "2", "?", "1", "0", "no", "-"]
    assert "records only" in out
    code, out = run_plan(fleet, capsys, "--json")
    doc = json.loads(out)
    assert doc["records_only"] is True and doc["actions"] == [] and doc["converged"] is None
    assert doc["pools"] == [{"pool": "p4090", "gpu": "RTX 4090", "desired": 2, "running": None,
                             "bad_machines_known": 1, "probation_known": 0, "paused": False, "actions": {}}]


def test_plan_counts_a_machine_on_probation_as_rentable_not_bad(fleet: Fleet,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    fleet.mark_bad("m-b")
    fleet.mark_bad("m-a", expires_at="2026-12-03T18:00:00Z", probation_until="2027-01-02T18:00:00Z")
    code, out = run_plan(fleet, capsys, "--json", "--at", "2026-12-10T00:00:00Z")
    assert code == 0, out
    (pool,) = json.loads(out)["pools"]
    assert (pool["bad_machines_known"], pool["probation_known"]) == (1, 1)
    # Before its expiry the same record excludes the machine: the standing is read at the plan's time.
    code, out = run_plan(fleet, capsys, "--json", "--at", "2026-12-03T00:00:00Z")
    (pool,) = json.loads(out)["pools"]
    assert (pool["bad_machines_known"], pool["probation_known"]) == (2, 0)
    code, out = run_plan(fleet, capsys, "--at", "2026-12-10T00:00:00Z")
    header, row = out.splitlines()[:2]
    assert header.split()[4:8] == ["BAD", "KNOWN", "PROBATION", "PAUSED"] and row.split()[5:7] == ["1", "1"]


def test_plan_with_state_lists_the_actions_apply_would_take(fleet: Fleet,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    backend = ["--state-dir", str(fleet.state), "--backend", "local", "--machines", str(fleet.root / "machines.yaml")]
    code, out = run_plan(fleet, capsys, *backend, "--json")
    doc = json.loads(out)
    assert [(a["kind"], a["slot"]) for a in doc["actions"]] == [("create", "p4090-0"), ("create", "p4090-1")]
    assert fleet.apply(capsys)[0] == 0
    code, out = run_plan(fleet, capsys, *backend)
    assert code == 0 and "no changes: slots match the spec" in out
    victim = fleet.slots()["p4090-1"]["machine_id"]
    fleet.mark_bad(victim)
    code, out = run_plan(fleet, capsys, *backend, "--json")
    doc = json.loads(out)
    assert [(a["kind"], a["slot"], a["reason"]) for a in doc["actions"] if a["kind"] != "keep"] == [
        ("replace", "p4090-1", "machine-bad")]
    assert doc["pools"][0]["running"] == 2 and doc["pools"][0]["actions"] == {"replace": 1}
    # plan changed nothing
    assert fleet.slots()["p4090-1"]["machine_id"] == victim
    # without --backend: statuses from the state file, still no credentials needed
    code, out = run_plan(fleet, capsys, "--state-dir", str(fleet.state))
    assert code == 0 and "replace" in out and "as the last apply recorded them" in out


# --- fleet apply against the vast.ai API (a local fake of it on 127.0.0.1) ------------------------------


VAST_SPEC = """\
version: 1
image:
  repository: registry.example/worker
controller:
  url: https://controller.example
pools:
  - name: rtx4090
    gpu_name: RTX 4090
    count: 2
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.60
    min_reliability: 0.95
    min_inet_down_mbps: 500
"""


def test_apply_with_vastai_backend_rents_by_digest_and_replaces_bad(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.vast_fake import VastFake

    spec_dir = tmp_path / "fleet-spec"
    spec_dir.mkdir()
    (spec_dir / "fleet.yaml").write_text(VAST_SPEC)
    digest = "sha256:" + "e" * 64
    monkeypatch.setenv("VAST_API_KEY", "test-vast-key")
    monkeypatch.setenv("FLEET_CONTROLLER_SECRET", "vast-test-controller-secret")
    with VastFake(api_key="test-vast-key") as fake:
        # The client deep inside `fleet apply` paces and backs off on the fake's clock: no real wait.
        monkeypatch.setattr(vastai.client, "TIME", vastai.TimeSource(fake.clock, fake.clock.sleep))
        argv = ["apply", "--spec", str(spec_dir / "fleet.yaml"), "--backend", "vastai", "--state-dir",
                str(tmp_path / "state"), "--vast-base-url", fake.base_url,
                "--image", f"registry.example/worker@{digest}"]
        assert main(argv) == 0, capsys.readouterr()
        slots = json.loads((tmp_path / "state" / "slots.json").read_text())["slots"]
        # default market: best prior per $ among fitting offers: 41002 ($0.38), 41001 ($0.45); 41003 ($0.52)
        # fits too; the others are unreliable, unverified or short of host RAM
        assert {s["machine_id"] for s in slots.values()} == {"41001", "41002"}
        creates = fake.requests_to("PUT", "/api/v0/asks/")
        assert len(creates) == 2
        for req in creates:
            assert req.body["image"] == f"registry.example/worker@{digest}"
            assert req.body["label"] in {f"gpu-fleet/main/{s['instance_id']}" for s in slots.values()}
            assert req.body["env"]["FLEET_IMAGE_DIGEST"] == digest

        capsys.readouterr()
        assert main(argv) == 0 and "no changes" in capsys.readouterr().out

        victim = slots["rtx4090-0"]
        bad = MachineRecord(machine_id=victim["machine_id"], status="bad", gpu_name="RTX 4090")
        write_text_atomic(machine_record_path(spec_dir, victim["machine_id"]), render_machine_record(bad))
        code = main(argv)
        out = capsys.readouterr().out
        assert code == 0 and "machine-bad" in out, out
        assert fake.requests_to("DELETE", f"/api/v0/instances/{victim['contract_id']}/")
        after = json.loads((tmp_path / "state" / "slots.json").read_text())["slots"]
        assert after["rtx4090-0"]["machine_id"] == "41003"
        assert after["rtx4090-1"]["instance_id"] == slots["rtx4090-1"]["instance_id"]  # untouched
        searches = fake.requests_to("POST", "/api/v0/bundles/")
        assert int(victim["machine_id"]) in searches[-1].body["machine_id"]["notin"]  # excluded in the query
