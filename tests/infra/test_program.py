"""The real Pulumi program under `pulumi.runtime.set_mocks`: no engine, no registry, no market.

The mocks stand in for the engine only: the docker Image "push" returns a repo digest, and each slot's
create runs the real `SlotProvider.create` (ranking, query, env) against a fake of our Marketplace port.
Diffs between two program runs go through the real dynamic provider's `diff`.
"""

from __future__ import annotations

import base64
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dill
import pulumi
import pytest

from infra import program
from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.pulumi_provider import SlotResourceProvider
from reconciler.adapters.record_files import (
    image_record_path,
    machine_record_path,
    render_image_record,
    render_machine_record,
)
from reconciler.adapters.slot_provider import SlotProvider
from reconciler.domain.marketplace import Offer
from reconciler.domain.records import BenchmarkEntry, ImageSuspectRecord, MachineRecord
from reconciler.domain.slots import PoolPausedError, SlotInputs
from tests.fakes import FakeMarket

DIGEST = "sha256:" + "c" * 64
REPO_DIGEST = f"registry.example/fleet/worker@{DIGEST}"
SECRET = b"infra-test-controller-secret"
SLOT_TYPE = "pulumi-python:dynamic/fleet:Slot"
INFRA_DIR = Path(program.__file__).parent

SPEC = """\
version: 1
image:
  repository: registry.example/fleet/worker
  context: {context}
  base_image: nvidia/cuda:12.4.1-runtime-ubuntu22.04
controller:
  url: https://controller.example
pools:
  - name: big
    gpu_name: RTX 4090
    count: 3
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.60
  - name: small
    gpu_name: RTX 5090
    count: 1
    min_rate_proofs_per_hour: 80
    max_price_usd_per_hour: 1.20
"""


def offer(machine_id: str, gpu: str, price: float) -> Offer:
    return Offer(offer_id=f"ask-{machine_id}", machine_id=machine_id, host_id=f"h-{machine_id}", gpu_name=gpu,
                 num_gpus=1, price_usd_per_hour=price, reliability=0.99, inet_down_mbps=1000, disk_gb=500,
                 cpu_ram_gb=256, cuda_max_good=12.8)




PROGRAM_OFFERS = [offer("m1", "RTX 4090", 0.30), offer("m2", "RTX 4090", 0.32), offer("m3", "RTX 4090", 0.34),
                  offer("m4", "RTX 4090", 0.36), offer("m5", "RTX 4090", 0.38), offer("g1", "RTX 5090", 0.9)]


@dataclass
class FleetMocks(pulumi.runtime.Mocks):
    market: FakeMarket = field(default_factory=lambda: FakeMarket(PROGRAM_OFFERS, filter_queries=True, exclusive=True,
                                                                   first_contract_id=100))
    resources: dict[str, pulumi.runtime.MockResourceArgs] = field(default_factory=dict)
    created: dict[str, dict[str, Any]] = field(default_factory=dict)
    create_errors: dict[str, Exception] = field(default_factory=dict)
    pool_data_dir: str = ""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        self.resources[args.name] = args
        if args.typ == "docker:index/image:Image":
            return f"{args.name}-id", {**args.inputs, "repoDigest": REPO_DIGEST}
        if args.typ == SLOT_TYPE:
            try:
                decoded = SlotResourceProvider({"pool_data_dir": self.pool_data_dir}).decode_inputs(args.inputs)
                out = SlotProvider(self.market, SECRET).create(decoded)
            except Exception as exc:  # the engine would record a failed create; so do we
                self.create_errors[args.name] = exc
                return None, dict(args.inputs)
            state = {**args.inputs, **out.to_props()}
            self.created[args.name] = state
            return out.instance_id, state
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        return {}, None


class Repo:
    def __init__(self, root: Path):
        self.spec_dir = root / "fleet-spec"
        self.spec_dir.mkdir()
        context = root / "worker-image"
        context.mkdir()
        (context / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n")
        (self.spec_dir / "fleet.yaml").write_text(SPEC.format(context=context))
        self.context = context
        self.pool_data_dir = root / "pool-data"

    def mark_bad(self, machine_id: str) -> None:
        entry = BenchmarkEntry(instance_id="i", at="2026-12-02T18:00:00Z", verdict="below-min-rate", blame="machine",
                               marks_bad=True, reason="slow", proofs_per_hour=3.0)
        rec = MachineRecord(machine_id=machine_id, status="bad", gpu_name="RTX 4090", benchmarks=(entry,))
        write_text_atomic(machine_record_path(self.spec_dir, machine_id), render_machine_record(rec))

    def config(self) -> dict[str, str]:
        return {"gpu-fleet:specPath": str(self.spec_dir / "fleet.yaml"), "gpu-fleet:backend": "vastai",
                "gpu-fleet:registryServer": "registry.example", "gpu-fleet:registryUsername": "bot",
                "gpu-fleet:registryPassword": "hunter2-registry",
                "gpu-fleet:poolDataDir": str(self.pool_data_dir)}


def run_entry_point(repo: Repo, mocks: FleetMocks) -> None:
    """Run infra/ the way Pulumi's Python host does: the directory's __main__.py as a script."""

    mocks.pool_data_dir = str(repo.pool_data_dir)

    @pulumi.runtime.test
    def go() -> None:
        pulumi.runtime.set_mocks(mocks, project="gpu-fleet", stack="test", preview=False)
        pulumi.runtime.set_all_config(repo.config(), secret_keys=["gpu-fleet:registryPassword"])
        runpy.run_path(str(INFRA_DIR), run_name="__main__")

    go()


def run_program(repo: Repo, mocks: FleetMocks) -> dict[str, Any]:
    """Run infra/program.main() to completion under mocks; return its exports (resolved)."""
    resolved: dict[str, Any] = {}
    mocks.pool_data_dir = str(repo.pool_data_dir)

    @pulumi.runtime.test
    def go() -> pulumi.Output:
        pulumi.runtime.set_mocks(mocks, project="gpu-fleet", stack="test", preview=False)
        pulumi.runtime.set_all_config(repo.config(), secret_keys=["gpu-fleet:registryPassword"])
        result = program.main()
        slots = result["slots"]
        names = sorted(slots)
        return pulumi.Output.all(result["image_repo_digest"],
                                 *[slots[n]["instance_id"] for n in names]).apply(
            lambda values: resolved.update(digest=values[0], instances=dict(zip(names, values[1:], strict=True))))

    go()
    return resolved


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


def test_image_built_from_worker_image_and_slots_pinned_by_digest(repo: Repo) -> None:
    mocks = FleetMocks()
    exports = run_program(repo, mocks)
    assert exports["digest"] == REPO_DIGEST

    image = mocks.resources["worker-image"]
    assert image.typ == "docker:index/image:Image"
    build = image.inputs["build"]
    assert build["context"] == str(repo.context) and build["dockerfile"] == f"{repo.context}/Dockerfile"
    assert build["platform"] == "linux/amd64"
    assert build["args"]["BASE_IMAGE"] == "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    assert build["args"]["IMAGE_VERSION"] == image.inputs["imageName"].rsplit(":", 1)[1]  # the content tag
    assert image.inputs["imageName"].startswith("registry.example/fleet/worker:")
    assert not image.inputs["imageName"].endswith(":latest")
    # the registry block carries the password from a config secret, so the engine sees it as a secret
    registry = image.inputs["registry"]
    assert registry[pulumi.runtime.rpc._special_sig_key] == pulumi.runtime.rpc._special_secret_sig
    assert registry["value"] == {"server": "registry.example", "username": "bot", "password": "hunter2-registry"}

    slots = {name: args for name, args in mocks.resources.items() if args.typ == SLOT_TYPE}
    assert sorted(slots) == ["big-0", "big-1", "big-2", "small-0"]  # one resource per slot
    for name, args in slots.items():
        assert args.inputs["image"] == REPO_DIGEST  # repo@sha256:..., never a tag
        assert args.inputs["image_digest"] == DIGEST
        assert args.inputs["slot"] == name
    assert sorted(exports["instances"]) == ["big-0", "big-1", "big-2", "small-0"]
    assert all(iid.startswith(slot + "-") for slot, iid in exports["instances"].items())
    # machines: best prior per $ within each pool's GPU model (slots are created in parallel, so which
    # slot got which of the three is up to the race, as on a real market)
    assert {mocks.created[f"big-{i}"]["machine_id"] for i in range(3)} == {"m1", "m2", "m3"}
    assert mocks.created["small-0"]["machine_id"] == "g1"


def test_registry_password_and_controller_secret_stay_out_of_slot_inputs(repo: Repo) -> None:
    mocks = FleetMocks()
    run_program(repo, mocks)
    for args in mocks.resources.values():
        if args.typ == SLOT_TYPE:
            text = repr({k: v for k, v in args.inputs.items() if k != "__provider"})
            assert "hunter2-registry" not in text and SECRET.decode() not in text
            blob = args.inputs["__provider"]
            # the serialized provider is always marked secret (ResourceProvider.serialize_as_secret_always)
            assert blob[pulumi.runtime.rpc._special_sig_key] == pulumi.runtime.rpc._special_secret_sig
            raw = base64.b64decode(blob["value"])
            assert b"hunter2-registry" not in raw and SECRET not in raw
            provider = dill.loads(raw)  # noqa: S301 - our own blob, as Pulumi's provider process loads it
            assert isinstance(provider, SlotResourceProvider) and provider.backend == {
                "kind": "vastai", "controller_url": "https://controller.example",
                "pool_data_dir": str(repo.pool_data_dir)}


def test_bad_machines_are_excluded_from_every_query(repo: Repo) -> None:
    repo.mark_bad("m1")
    repo.mark_bad("m3")
    mocks = FleetMocks()
    run_program(repo, mocks)
    assert mocks.market.queries and all(q.exclude_machine_ids == {"m1", "m3"} for q in mocks.market.queries)
    slot_inputs = [a.inputs for a in mocks.resources.values() if a.typ == SLOT_TYPE]
    # each slot carries a reference to its pool's exclusion set (one file per pool), not the set itself
    assert all("bad_machine_ids" not in i and i["pool_data"]["excluded"] == 2 for i in slot_inputs)
    provider = SlotResourceProvider({"pool_data_dir": str(repo.pool_data_dir)})
    assert all(provider.decode_inputs(i).bad_machine_ids == {"m1", "m3"} for i in slot_inputs)
    rented = {mocks.created[f"big-{i}"]["machine_id"] for i in range(3)}
    assert rented == {"m2", "m4", "m5"}


def test_a_new_bad_record_replaces_exactly_that_slot(repo: Repo) -> None:
    first = FleetMocks()
    run_program(repo, first)
    victim_slot = "big-1"
    victim_machine = first.created[victim_slot]["machine_id"]
    repo.mark_bad(victim_machine)

    second = FleetMocks(market=first.market)
    run_program(repo, second)
    provider = SlotResourceProvider({"kind": "vastai", "pool_data_dir": str(repo.pool_data_dir)})
    replaced, changed = {}, set()
    for slot, old_state in first.created.items():
        new_inputs = second.resources[slot].inputs
        diff = provider.diff(old_state["instance_id"], old_state, new_inputs)
        assert diff.delete_before_replace
        if diff.replaces:
            replaced[slot] = diff.replaces
        if diff.changes:
            changed.add(slot)
    assert replaced == {victim_slot: ["pool_data"]}
    assert changed == {victim_slot}  # the pool's other slots preview as no change


def test_new_image_digest_replaces_every_slot_and_unknown_digest_in_preview_may(repo: Repo) -> None:
    first = FleetMocks()
    run_program(repo, first)
    provider = SlotResourceProvider({"kind": "vastai", "pool_data_dir": str(repo.pool_data_dir)})
    new_digest = "sha256:" + "d" * 64
    for old in first.created.values():
        moved = {**second_inputs(old), "image": f"registry.example/fleet/worker@{new_digest}",
                 "image_digest": new_digest}
        assert provider.diff(old["instance_id"], old, moved).replaces == ["image_digest"]
        unknown = pulumi.runtime.rpc.UNKNOWN
        preview = {**second_inputs(old), "image": unknown, "image_digest": unknown}
        assert provider.diff(old["instance_id"], old, preview).replaces == ["image_digest"]
        assert not provider.diff(old["instance_id"], old, second_inputs(old)).replaces


def second_inputs(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k in SlotInputs.__dataclass_fields__ or k == "pool_data"}


def test_suspect_image_pauses_its_pool_only(repo: Repo) -> None:
    suspect = ImageSuspectRecord(image_digest=DIGEST, signature="command not found", status="suspect",
                                 machines=("x1", "x2"), tripped_at="2026-12-02T18:00:00Z", pools=("big",))
    write_text_atomic(image_record_path(repo.spec_dir, DIGEST), render_image_record(suspect))
    mocks = FleetMocks()
    run_program(repo, mocks)
    assert sorted(mocks.create_errors) == ["big-0", "big-1", "big-2"]
    assert all(isinstance(e, PoolPausedError) and "pool big paused" in str(e) for e in mocks.create_errors.values())
    assert "small-0" in mocks.created
    assert all(q.gpu_name == "RTX 5090" for q in mocks.market.queries)  # the paused pool never searched


def test_entry_point_runs_the_same_program(repo: Repo) -> None:
    mocks = FleetMocks()
    run_entry_point(repo, mocks)
    assert sorted(n for n, a in mocks.resources.items() if a.typ == SLOT_TYPE) == ["big-0", "big-1", "big-2", "small-0"]
    assert "worker-image" in mocks.resources
