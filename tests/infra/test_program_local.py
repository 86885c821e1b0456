"""The program with `backend: local` (under pulumi's mocks: the program's shape only; the real host drives the
same slots in tests/pulumi_engine): no image build, slots run the worker-image directory pinned by its digest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi

from infra import program
from reconciler.adapters.pulumi_provider import SlotResourceProvider
from reconciler.adapters.slot_provider import directory_digest

SLOT_TYPE = "pulumi-python:dynamic/fleet:Slot"
REPO = Path(__file__).resolve().parents[2]


class Recorder(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: dict[str, pulumi.runtime.MockResourceArgs] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        self.resources[args.name] = args
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        return {}, None


def test_local_backend_needs_no_registry_and_pins_the_directory(tmp_path: Path) -> None:
    spec_dir = tmp_path / "fleet-spec"
    spec_dir.mkdir()
    (spec_dir / "fleet.yaml").write_text(
        "version: 1\nimage: {repository: registry.local/w, context: " + str(REPO / "worker-image") + "}\n"
        "controller: {url: http://127.0.0.1:8080}\npools:\n  - {name: p, gpu_name: RTX 4090, count: 2, "
        "min_rate_proofs_per_hour: 40, max_price_usd_per_hour: 0.6}\n")
    config: dict[str, Any] = {
        "gpu-fleet:specPath": str(spec_dir / "fleet.yaml"), "gpu-fleet:backend": "local",
        "gpu-fleet:localMachinesFile": str(REPO / "reconciler" / "demo_assets" / "local-machines.yaml"),
        "gpu-fleet:localStateDir": str(tmp_path / "state"), "gpu-fleet:poolDataDir": str(tmp_path / "pool-data")}
    mocks = Recorder()

    @pulumi.runtime.test
    def go() -> None:
        pulumi.runtime.set_mocks(mocks, project="gpu-fleet", stack="local", preview=False)
        pulumi.runtime.set_all_config(config)
        program.main()

    go()
    assert not [a for a in mocks.resources.values() if a.typ == "docker:index/image:Image"]
    slots = {n: a.inputs for n, a in mocks.resources.items() if a.typ == SLOT_TYPE}
    assert sorted(slots) == ["p-0", "p-1"]
    digest = directory_digest(REPO / "worker-image")
    provider = SlotResourceProvider({"pool_data_dir": str(tmp_path / "pool-data")})
    for inputs in slots.values():
        decoded = provider.decode_inputs(inputs)
        assert decoded.image == str(REPO / "worker-image") and decoded.image_digest == digest
        assert decoded.params_dir == str(tmp_path / "state" / "params")
