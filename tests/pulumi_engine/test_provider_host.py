"""The slot provider under the SDK's REAL dynamic-provider host, started and spoken to as the engine does.

Each test launches `python -m pulumi.dynamic` through our re-implementation of the launcher (working
directory = Pulumi.yaml's `main:`, virtualenv resolved against it, PULUMI_RUNTIME_* and PULUMI_PROJECT from
Pulumi.yaml) and sends engine-shaped gRPC requests (tests/pulumi_engine/host.py): Configure with namespaced
keys and secrets, Check, Diff with known and Unknown inputs, Create, Read, Update, Delete, every number a
double. Backends: `local` (a worker created through the host runs the real entrypoint and completes its
benchmark against a real controller) and `vastai` (against tests/vast_fake.py).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime.proto import provider_pb2

from infra.hosts import pickler_restored, static_slot_props
from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.controller.server import ControllerServer
from reconciler.adapters.params_mirror import ParamsMirrorServer
from reconciler.adapters.pulumi_provider import SlotResourceProvider
from reconciler.adapters.record_files import (
    load_records,
    machine_record_path,
    render_machine_record,
)
from reconciler.adapters.slot_provider import directory_digest
from reconciler.adapters.spec_files import load_spec
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.cli.demo import make_params
from reconciler.domain.records import BenchmarkEntry, MachineRecord
from tests.pulumi_engine.host import (
    UNKNOWN,
    LauncherError,
    Project,
    Secret,
    launch,
    running_host,
)

REPO = Path(__file__).resolve().parents[2]
WORKER_IMAGE = REPO / "worker-image"
SECRET = "engine-test-controller-secret-0123"
ADMIN = "engine-test-admin-token-0123456789"
VAST_KEY = "engine-test-vast-key"

pytestmark = pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").is_file(),
                                reason="no .venv at the repository root: run `make venv` (the launcher needs it)")


# --- the launcher and the layout ------------------------------------------------------------------------------


def test_launcher_finds_the_project_venv_from_main_dir_like_the_language_host() -> None:
    project = Project.load(REPO)
    assert project.name == "gpu-fleet"
    assert project.pwd() == REPO / "infra"  # the engine's cwd for the provider host
    env = project.plugin_env({"PATH": "/usr/bin:/bin"})
    assert env["PULUMI_RUNTIME_VIRTUALENV"] == ".venv" and env["PULUMI_PROJECT"] == "gpu-fleet"
    argv = launch(project.pwd(), env, "127.0.0.1:1")
    # the launcher resolves against infra/ (pulumi/pulumi#7061), the language host against the root: same venv
    language_host_python = REPO / ".venv" / "bin" / "python"
    assert Path(argv[0]) == REPO / "infra" / ".venv" / "bin" / "python"
    assert os.path.samefile(argv[0], language_host_python)
    assert argv[1:4] == ["-u", "-m", "pulumi.dynamic"]
    assert env["PATH"].startswith(f"{REPO}/infra/.venv/bin:")


def test_the_link_is_committed_so_a_fresh_clone_needs_only_make_venv() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-s", "infra/.venv"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split()
    assert listed and listed[0] == "120000", "infra/.venv must be a committed symlink"
    target = subprocess.run(["git", "cat-file", "-p", listed[1]], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout
    assert target == "../.venv"


def test_without_the_link_the_host_would_not_start(tmp_path: Path) -> None:
    # What upstream #7061 does to `main: infra/` + `virtualenv: .venv` without our link: exit 1, every Check fails.
    (tmp_path / "infra").mkdir()
    shutil.copy(REPO / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    project = Project.load(tmp_path)
    with pytest.raises(LauncherError, match=r"infra/\.venv\" doesn't exist"):
        launch(project.pwd(), project.plugin_env({}), "127.0.0.1:1")


# --- a small fleet for the host ----------------------------------------------------------------------------------

SPEC = """\
version: 1
image:
  repository: registry.example/fleet/worker
  context: {context}
controller:
  url: {controller}
params:
  sector_size: 32GiB
  base_url: {params}
  fetch_timeout_minutes: 2
pools:
  - name: p4090
    gpu_name: RTX 4090
    count: 2
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.60
    min_reliability: 0.98
    benchmark: {{proofs: 2, concurrency: 2, timeout_minutes: 3, after: serve}}
"""


def provider_blob(backend: dict[str, Any]) -> str:
    """`__provider` as the program registers it (the engine strips the secret wrapper: acceptSecrets=False)."""
    with pickler_restored():
        return str(serialize_provider(SlotResourceProvider(backend)))


def stack_config(**extra: Any) -> dict[str, Any]:
    """The full stack config, namespaced, as the engine hands it to a dynamic provider (strings; secrets wrapped)."""
    return {"gpu-fleet:specPath": "fleet-spec/fleet.yaml", "gpu-fleet:controllerSecret": Secret(SECRET),
            "aws:region": "eu-west-1", **extra}


def mark_bad(spec_dir: Path, machine_id: str) -> None:
    entry = BenchmarkEntry(instance_id="i-x", at="2026-12-02T18:00:00Z", verdict="below-min-rate", blame="machine",
                           marks_bad=True, reason="slow", proofs_per_hour=3.0)
    rec = MachineRecord(machine_id=machine_id, status="bad", gpu_name="RTX 4090", benchmarks=(entry,))
    write_text_atomic(machine_record_path(spec_dir, machine_id), render_machine_record(rec))


def inputs_for(spec_dir: Path, pool_data_dir: Path, image: str, digest: str) -> dict[str, dict[str, Any]]:
    """Each slot's inputs, built by the program's own function, plus the image fields."""
    spec = load_spec(spec_dir / "fleet.yaml")
    records = load_records(spec_dir)
    static = static_slot_props(spec, spec.pools[0], records, pool_data_dir=str(pool_data_dir))
    return {slot: {**props, "image": image, "image_digest": digest} for slot, props in static.items()}


def code_and_details(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return exc.code(), exc.details() or ""  # type: ignore[attr-defined]


# --- local backend: a worker created through the host completes its benchmark ----------------------------------


class LocalFleet:
    def __init__(self, root: Path) -> None:
        self.root = root
        params_src = root / "params-src"
        make_params(params_src, 64 * 1024)
        self.mirror = ParamsMirrorServer(params_src).start()
        self.store = SqliteStore(root / "controller.db")
        self.controller = ControllerServer(self.store, SECRET.encode(), ADMIN, "127.0.0.1", 0).start()
        self.spec_dir = root / "fleet-spec"
        self.spec_dir.mkdir()
        (self.spec_dir / "fleet.yaml").write_text(SPEC.format(context=WORKER_IMAGE, controller=self.controller.url,
                                                              params=self.mirror.url))
        machines = []
        for machine_id, price in (("m-cheap", 0.30), ("m-dear", 0.40)):
            home = root / "machines" / machine_id
            machines.append({"machine_id": machine_id, "host_id": "h-1", "gpu_name": "RTX 4090",
                             "price_usd_per_hour": price, "reliability": 0.99,
                             "env": {"FLEET_USE_STANDINS": "1", "STANDIN_TIME_SCALE": "0.01",
                                     "STANDIN_SECONDS_PER_PROOF": "60", "STANDIN_STATE_DIR": str(home / "standin"),
                                     "FLEET_PARAMS_DIR": str(home / "params"), "FLEET_DAEMON_POLL_S": "0.2",
                                     "FLEET_LOG_SHIP_INTERVAL_S": "0.5", "FLEET_PROGRESS_INTERVAL_S": "1",
                                     "FLEET_BENCH_C1": str(home / "params" / "c1.json")}})
        self.machines_file = root / "machines.yaml"
        self.machines_file.write_text(yaml.safe_dump({"machines": machines}))
        self.pool_data_dir = root / "pool-data"
        self.backend = {"kind": "local", "state_dir": str(root / "market"), "machines_file": str(self.machines_file),
                        "controller_url": self.controller.url, "pool_data_dir": str(self.pool_data_dir)}
        self.digest = directory_digest(WORKER_IMAGE)

    def inputs(self) -> dict[str, dict[str, Any]]:
        blob = provider_blob(self.backend)
        return {s: {**p, "__provider": blob} for s, p in
                inputs_for(self.spec_dir, self.pool_data_dir, str(WORKER_IMAGE), self.digest).items()}

    def close(self) -> None:
        from reconciler.adapters.marketplace.local import LocalMarketplace, load_local_machines

        market = LocalMarketplace(self.backend["state_dir"], load_local_machines(self.machines_file))
        for inst in market.list_instances():
            market.destroy_instance(inst.contract_id)
        self.controller.stop()
        self.store.close()
        self.mirror.stop()


@pytest.fixture
def local_fleet(tmp_path: Path) -> Iterator[LocalFleet]:
    fleet = LocalFleet(tmp_path)
    try:
        yield fleet
    finally:
        fleet.close()


def wait_for_result(store: SqliteStore, instance_id: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        report = store.report(instance_id)
        if report is not None and (report.result is not None or report.failure() is not None):
            return report
        time.sleep(0.25)
    return store.report(instance_id)


@pytest.mark.slow
def test_local_backend_full_lifecycle_through_the_real_host(local_fleet: LocalFleet, tmp_path: Path) -> None:
    fleet = local_fleet
    with running_host(Project.load(REPO), tmp_path / "host.log") as host:
        engine = host.client()
        configured = engine.configure(stack_config())
        assert not configured.acceptSecrets  # so the engine strips secrets from every later call

        slot = "p4090-0"
        news = fleet.inputs()[slot]
        checked, failures = engine.check(slot, {}, news)
        assert failures == [], host.stderr()
        assert checked["pool"]["benchmark"]["proofs"] == 2.0  # what the engine will send back: a double

        id_, state = engine.create(slot, checked)
        assert id_.startswith(f"{slot}-") and state["machine_id"] == "m-cheap"  # cheapest fitting machine

        # the worker, started by the host through the local marketplace, runs its whole benchmark
        report = wait_for_result(fleet.store, id_)
        assert report is not None, host.stderr()
        assert report.failure() is None, (report.failure(), report.log_tail[-20:])
        assert report.result is not None and report.result.outcome == "completed", report.log_tail[-20:]
        assert report.result.completed == 2 and report.result.requested == 2
        assert report.result.concurrency == 2 and report.machine_id == "m-cheap"
        assert report.image_digest == fleet.digest

        read_id, fresh = engine.read(slot, id_, state, checked)
        assert read_id == id_ and fresh["instance_id"] == id_
        # `after: serve`: the worker stays up after its benchmark (with `exit` a slow machine could read the
        # instance already `exited`, which the status table rightly replaces at once)
        assert fresh["status"] == "running", fresh

        # unchanged spec: no change
        same = engine.diff(slot, id_, fresh, news, checked)
        assert same.changes == provider_pb2.DiffResponse.DIFF_NONE and list(same.replaces) == []

        # preview of an image rebuild: the digest is an Unknown -> replace (never "update")
        preview = engine.diff(slot, id_, fresh, {**news, "image_digest": UNKNOWN, "paused_reason": UNKNOWN}, checked)
        assert preview.changes == provider_pb2.DiffResponse.DIFF_SOME
        assert list(preview.replaces) == ["image_digest"] and preview.deleteBeforeReplace

        # a constraint change: update in place (the instance stays)
        dearer = {**news, "pool": {**news["pool"], "max_price_usd_per_hour": 0.7}}
        changed = engine.diff(slot, id_, fresh, dearer, checked)
        assert changed.changes == provider_pb2.DiffResponse.DIFF_SOME and list(changed.replaces) == []
        updated = engine.update(slot, id_, fresh, dearer, checked)
        assert updated["instance_id"] == id_ and updated["pool"]["max_price_usd_per_hour"] == 0.7

        # the machine is now recorded bad: that slot is replaced
        mark_bad(fleet.spec_dir, "m-cheap")
        after = {**fleet.inputs()[slot]}
        bad = engine.diff(slot, id_, updated, after, dearer)
        assert list(bad.replaces) == ["pool_data"] and bad.deleteBeforeReplace

        engine.delete(slot, id_, updated, dearer)
        gone_id, _ = engine.read(slot, id_, updated, dearer)
        assert gone_id == ""  # the engine drops a resource whose read returns no id

        # the replacement: the bad machine is excluded, the other one is rented
        new_id, new_state = engine.create(slot, engine.check(slot, dearer, after)[0])
        assert new_state["machine_id"] == "m-dear"
        engine.delete(slot, new_id, new_state, after)


def test_check_refuses_bad_values_naming_slot_and_field(local_fleet: LocalFleet, tmp_path: Path) -> None:
    with running_host(Project.load(REPO), tmp_path / "host.log") as host:
        engine = host.client()
        engine.configure(stack_config())
        news = local_fleet.inputs()["p4090-1"]
        for field, value, words in (("proofs", 2.5, "expected an integer, got 2.5"),
                                    ("proofs", "10.0", "expected an integer, got '10.0'"),
                                    ("concurrency", True, "expected an integer, got True")):
            bad = {**news, "pool": {**news["pool"], "benchmark": {**news["pool"]["benchmark"], field: value}}}
            _, failures = engine.check("p4090-1", {}, bad)
            assert len(failures) == 1 and failures[0].property == "pool", failures
            assert f"slot p4090-1: input pool.benchmark.{field}: {words}" in failures[0].reason
        _, failures = engine.check("p4090-1", {}, {**news, "pool": {**news["pool"], "verified_only": "yes"}})
        assert "pool.verified_only: expected true or false" in failures[0].reason
        # preview: image fields unknown is fine in Check
        _, failures = engine.check("p4090-1", {}, {**news, "image": UNKNOWN, "image_digest": UNKNOWN,
                                                   "paused_reason": UNKNOWN})
        assert failures == []


def test_missing_controller_secret_names_the_stack_config_key(local_fleet: LocalFleet, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLEET_CONTROLLER_SECRET"}
    with running_host(Project.load(REPO), tmp_path / "host.log", env=env) as host:
        engine = host.client()
        engine.configure({"gpu-fleet:specPath": "fleet-spec/fleet.yaml"})
        news = local_fleet.inputs()["p4090-0"]
        with pytest.raises(grpc.RpcError) as caught:
            engine.create("p4090-0", engine.check("p4090-0", {}, news)[0])
        code, details = code_and_details(caught.value)
        assert code == grpc.StatusCode.UNKNOWN
        assert "gpu-fleet:controllerSecret" in details and "fleet:controllerSecret" in details


# --- vastai backend, against the project's fake ------------------------------------------------------------------


def request_env(body: dict[str, Any]) -> dict[str, str]:
    """The worker env of a create request, as the fake recorded it (an object, or vast's `-e K=V` string)."""
    env = body.get("env")
    if isinstance(env, dict):
        return env
    out = {}
    for part in str(env or "").split(" -e "):
        key, _, value = part.removeprefix("-e ").partition("=")
        out[key.strip()] = value
    return out


def test_vastai_backend_lifecycle_through_the_real_host(tmp_path: Path) -> None:
    from tests.vast_fake import STRICT_LIMITS, RealClock, VastFake, scale_limits

    spec_dir = tmp_path / "fleet-spec"
    spec_dir.mkdir()
    (spec_dir / "fleet.yaml").write_text(SPEC.format(context=WORKER_IMAGE, controller="https://controller.example",
                                                     params="https://params.example"))
    digest = "sha256:" + "e" * 64
    image = f"registry.example/fleet/worker@{digest}"
    env = {k: v for k, v in os.environ.items() if k not in ("VAST_API_KEY", "FLEET_CONTROLLER_SECRET")}
    # The provider host is another process: it cannot share the fake's virtual clock. Real time, with vast's
    # limits and the client's pacing both scaled to 1/100 (strict, and no test waits seconds).
    with VastFake(api_key=VAST_KEY, clock=RealClock(), limits=scale_limits(STRICT_LIMITS, 0.01)) as fake, \
            running_host(Project.load(REPO), tmp_path / "host.log", env=env) as host:
        backend = {"kind": "vastai", "base_url": fake.base_url, "pool_data_dir": str(tmp_path / "pool-data"),
                   "time_scale": 0.01}
        blob = provider_blob(backend)
        # what the stored provider says: plain settings, never a secret
        assert VAST_KEY.encode() not in base64.b64decode(blob) and SECRET.encode() not in base64.b64decode(blob)
        engine = host.client()
        engine.configure(stack_config(**{"gpu-fleet:vastaiApiKey": Secret(VAST_KEY),
                                         "gpu-fleet:registryUsername": "bot",
                                         "gpu-fleet:registryPassword": Secret("registry-pw"),
                                         "gpu-fleet:registryServer": "registry.example"}))
        slots = {s: {**p, "__provider": blob} for s, p in inputs_for(spec_dir, tmp_path / "pool-data", image,
                                                                     digest).items()}
        states = {}
        for slot, news in slots.items():
            checked, failures = engine.check(slot, {}, news)
            assert failures == [], host.stderr()
            id_, state = engine.create(slot, checked)
            states[slot] = (id_, state)
        assert {s["machine_id"] for _, s in states.values()} == {"41001", "41002"}  # fitting, best per $

        creates = fake.requests_to("PUT", "/api/v0/asks/")
        assert len(creates) == 2
        for req in creates:
            assert req.body["image"] == image
            worker_env = request_env(req.body)
            # integers stay integers: a double from the wire never reaches the worker as "2.0"
            assert worker_env["FLEET_BENCH_PROOFS"] == "2" and worker_env["FLEET_BENCH_CONCURRENCY"] == "2"
            assert worker_env["FLEET_BENCH_TIMEOUT_S"] == "180" and worker_env["FLEET_PARAMS_TIMEOUT_S"] == "120"
            assert worker_env["FLEET_IMAGE_DIGEST"] == digest
            assert req.body["disk"] == 200 and not isinstance(req.body["disk"], float)

        slot = "p4090-0"
        id_, state = states[slot]
        read_id, fresh = engine.read(slot, id_, state, slots[slot])
        assert read_id == id_

        # a new record for the OTHER slot's machine: only that slot is replaced; this one: no change
        other_id, other_state = states["p4090-1"]
        mark_bad(spec_dir, other_state["machine_id"])
        after = {s: {**p, "__provider": blob} for s, p in inputs_for(spec_dir, tmp_path / "pool-data", image,
                                                                     digest).items()}
        assert engine.diff(slot, id_, fresh, after[slot], slots[slot]).changes == provider_pb2.DiffResponse.DIFF_NONE
        replaced = engine.diff("p4090-1", other_id, other_state, after["p4090-1"], slots["p4090-1"])
        assert list(replaced.replaces) == ["pool_data"]

        # a rebuilt image (known digest): replace every slot
        new_digest = "sha256:" + "f" * 64
        rebuilt = {**after[slot], "image": f"registry.example/fleet/worker@{new_digest}", "image_digest": new_digest}
        assert list(engine.diff(slot, id_, fresh, rebuilt, slots[slot]).replaces) == ["image_digest"]

        # a constraint change: update in place, nothing rented or destroyed
        dearer = {**after[slot], "pool": {**after[slot]["pool"], "max_price_usd_per_hour": 0.7}}
        assert engine.diff(slot, id_, fresh, dearer, slots[slot]).changes == provider_pb2.DiffResponse.DIFF_SOME
        updated = engine.update(slot, id_, fresh, dearer, slots[slot])
        assert updated["instance_id"] == id_ and updated["contract_id"] == fresh["contract_id"]
        assert len(fake.requests_to("PUT", "/api/v0/asks/")) == 2 and not fake.requests_to("DELETE", "/api/v0/")
        states[slot] = (id_, updated)

        for s, (i, st) in states.items():
            engine.delete(s, i, st, slots[s])
        assert len(fake.requests_to("DELETE", "/api/v0/instances/")) == 2


def test_a_pool_that_cannot_be_filled_says_what_was_short(tmp_path: Path) -> None:
    from tests.vast_fake import VastFake

    spec_dir = tmp_path / "fleet-spec"
    spec_dir.mkdir()
    text = SPEC.format(context=WORKER_IMAGE, controller="https://controller.example", params="https://p.example")
    (spec_dir / "fleet.yaml").write_text(text.replace("max_price_usd_per_hour: 0.60", "max_price_usd_per_hour: 0.30"))
    digest = "sha256:" + "e" * 64
    with VastFake(api_key=VAST_KEY) as fake, running_host(Project.load(REPO), tmp_path / "host.log") as host:
        backend = {"kind": "vastai", "base_url": fake.base_url, "pool_data_dir": str(tmp_path / "pool-data")}
        engine = host.client()
        engine.configure(stack_config(**{"gpu-fleet:vastaiApiKey": Secret(VAST_KEY)}))
        news = {**inputs_for(spec_dir, tmp_path / "pool-data", f"r.example/w@{digest}", digest)["p4090-0"],
                "__provider": provider_blob(backend)}
        with pytest.raises(grpc.RpcError) as caught:
            engine.create("p4090-0", engine.check("p4090-0", {}, news)[0])
        _, details = code_and_details(caught.value)
        assert "NoOfferError: slot p4090-0: no offer fits pool p4090: the market lists 6 RTX 4090 x1 offer(s): " \
               "6 above the price cap $0.3/h (cheapest of them $0.31/h)" in details
        assert not fake.requests_to("PUT", "/api/v0/asks/")  # nothing rented
