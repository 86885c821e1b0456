"""Slot provider CRUD, called directly: against a fake of our Marketplace port and the local marketplace,
and through the Pulumi dynamic-provider adapter (serialisable, secrets from stack config)."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import dill
import pytest
from pulumi.dynamic import Config, ConfigureRequest
from pulumi.dynamic.dynamic import serialize_provider

from reconciler.adapters.pulumi_provider import SlotResourceProvider
from reconciler.adapters.slot_provider import (
    SlotProvider,
    directory_digest,
    image_login_from,
    load_slot_state,
    save_slot_state,
)
from reconciler.domain.marketplace import Offer
from reconciler.domain.planner import REASON_IMAGE_CHANGED, REASON_INSTANCE_DEAD, REASON_MACHINE_BAD, STATUS_GONE
from reconciler.domain.slots import (
    PULUMI_UNKNOWN,
    NoOfferError,
    PoolPausedError,
    SlotInputError,
    SlotInputs,
    SlotOutputs,
    digest_of_image_ref,
)
from reconciler.domain.spec import BenchmarkSettings, ParamsSettings, PoolSpec
from reconciler.domain.tokens import instance_token, machine_claim
from tests.fakes import FakeMarket

SECRET = b"controller-secret-0123456789"
DIGEST = "sha256:" + "1" * 64
NEW_DIGEST = "sha256:" + "2" * 64
POOL = PoolSpec(name="rtx4090", gpu_name="RTX 4090", count=2, min_rate_proofs_per_hour=40,
                max_price_usd_per_hour=0.6, disk_gb=150,
                benchmark=BenchmarkSettings(proofs=4, concurrency=2, timeout_minutes=30, after="exit"))


def offer(machine_id: str, price: float) -> Offer:
    return Offer(offer_id=f"ask-{machine_id}", machine_id=machine_id, host_id=f"host-{machine_id}",
                 gpu_name="RTX 4090", num_gpus=1, price_usd_per_hour=price, reliability=0.99, inet_down_mbps=900,
                 disk_gb=500, cpu_ram_gb=256, cuda_max_good=12.8, verified=True)




def inputs(**kw: Any) -> SlotInputs:
    base = SlotInputs(slot="rtx4090-1", pool=POOL, image=f"ghcr.io/x/worker@{DIGEST}", image_digest=DIGEST,
                      controller_url="https://controller.example", params=ParamsSettings(base_url="http://mirror"),
                      bad_machine_ids=frozenset({"bad-1"}), measured={"slow": 5.0}, priors={"RTX 4090": 60.0})
    return replace(base, **kw)


def test_create_rents_best_ranked_offer_with_label_token_and_env() -> None:
    market = FakeMarket([offer("bad-1", 0.10), offer("slow", 0.20), offer("good", 0.45), offer("pricey", 0.9)])
    provider = SlotProvider(market, SECRET, nonce=lambda: "a1b2c3", clock=lambda: 1700.0)
    out = provider.create(inputs())
    assert market.queries[0].exclude_machine_ids == frozenset({"bad-1"})
    assert market.queries[0].gpu_name == "RTX 4090" and market.queries[0].max_price_usd_per_hour == 0.6
    assert out.instance_id == "rtx4090-1-a1b2c3" and out.machine_id == "good" and out.contract_id == "1000"
    assert (out.host_id, out.price_usd_per_hour, out.image_digest) == ("host-good", 0.45, DIGEST)
    assert out.ranking_basis == "prior" and out.created_at == 1700.0
    _, request = market.created["1000"]
    assert request.label == "gpu-fleet/main/rtx4090-1-a1b2c3" and request.disk_gb == 150  # the fleet's prefix
    assert request.image == f"ghcr.io/x/worker@{DIGEST}"
    env = request.env
    assert env["FLEET_TOKEN"] == instance_token(SECRET, "rtx4090-1-a1b2c3")
    assert env["FLEET_INSTANCE_ID"] == "rtx4090-1-a1b2c3"
    assert env["FLEET_MACHINE_CLAIM"] == machine_claim(SECRET, "rtx4090-1-a1b2c3", "good")  # vouches for the machine
    assert (env["FLEET_POOL"], env["FLEET_SLOT"], env["FLEET_MACHINE_ID"], env["FLEET_HOST_ID"]) == (
        "rtx4090", "rtx4090-1", "good", "host-good")
    assert env["FLEET_GPU_NAME"] == "RTX 4090" and env["FLEET_IMAGE_DIGEST"] == DIGEST
    assert env["FLEET_CONTROLLER_URL"] == "https://controller.example"
    assert (env["FLEET_BENCH_PROOF_TYPE"], env["FLEET_BENCH_PROOFS"], env["FLEET_BENCH_CONCURRENCY"]) == (
        "porep", "4", "2")
    assert env["FLEET_BENCH_TIMEOUT_S"] == "1800" and env["FLEET_AFTER_BENCH"] == "exit"
    assert env["FLEET_PARAMS_BASE_URL"] == "http://mirror" and env["FLEET_PARAMS_SECTOR_SIZE"] == "32GiB"
    assert env["FLEET_PARAMS_TIMEOUT_S"] == "3600"


def test_create_falls_back_when_best_offer_was_just_rented() -> None:
    market = FakeMarket([offer("a", 0.3), offer("b", 0.4)])
    market.refuse = {"ask-a"}
    out = SlotProvider(market, SECRET).create(inputs())
    assert out.machine_id == "b"


def test_no_matching_offer_is_a_clear_temporary_error() -> None:
    market = FakeMarket([offer("bad-1", 0.1), offer("pricey", 0.9)])
    with pytest.raises(NoOfferError) as err:
        SlotProvider(market, SECRET).create(inputs())
    text = str(err.value)
    assert "rtx4090-1" in text and "pool rtx4090" in text and "<= $0.6/h" in text and "1 bad machine" in text
    assert err.value.temporary
    assert market.created == {}


def test_paused_pool_refuses_to_create() -> None:
    market = FakeMarket([offer("good", 0.3)])
    with pytest.raises(PoolPausedError, match="image suspect"):
        SlotProvider(market, SECRET).create(inputs(paused_reason="pool rtx4090 paused: image suspect"))
    assert market.queries == []


def test_diff_replaces_bad_machine_dead_instance_or_new_digest_only() -> None:
    market = FakeMarket([offer("good", 0.3)])
    provider = SlotProvider(market, SECRET)
    out = provider.create(inputs())
    assert not provider.diff(out, inputs()).replace
    assert not provider.diff(out, inputs(measured={"good": 99.0}, bad_machine_ids=frozenset({"x"}))).replace
    d = provider.diff(out, inputs(bad_machine_ids=frozenset({"good"})))
    assert (d.replace, d.reason, d.replaces) == (True, REASON_MACHINE_BAD, ("bad_machine_ids",))
    d = provider.diff(out, inputs(image_digest=NEW_DIGEST, image=f"r@{NEW_DIGEST}"))
    assert (d.replace, d.reason, d.replaces) == (True, REASON_IMAGE_CHANGED, ("image_digest",))
    d = provider.diff(replace(out, status="exited"), inputs())
    assert (d.replace, d.reason) == (True, REASON_INSTANCE_DEAD)
    d = provider.diff(out, inputs(image_digest=NEW_DIGEST, paused_reason="paused"))
    assert not d.replace and "held: paused" in d.detail
    assert provider.diff(out, inputs(image_digest=PULUMI_UNKNOWN)).replace


def test_read_refreshes_and_reports_gone_and_delete_is_idempotent_with_hook() -> None:
    market = FakeMarket([offer("good", 0.3)])
    told: list[str] = []
    provider = SlotProvider(market, SECRET, on_destroyed=lambda o: told.append(o.instance_id))
    out = provider.create(inputs())
    market.statuses[out.contract_id] = "running"
    fresh = provider.read(out)
    assert fresh is not None and fresh.status == "running"
    assert provider.observe({out.slot: out})[out.slot].status == "running"
    provider.delete(out)
    provider.delete(out)
    assert market.destroyed == [out.contract_id, out.contract_id] and told == [out.instance_id] * 2
    assert provider.read(out) is None
    assert provider.observe({out.slot: out})[out.slot].status == STATUS_GONE


def test_failing_controller_hook_does_not_fail_delete() -> None:
    market = FakeMarket([offer("good", 0.3)])

    def hook(_: SlotOutputs) -> None:
        raise ConnectionError("controller down")

    provider = SlotProvider(market, SECRET, on_destroyed=hook)
    out = provider.create(inputs())
    provider.delete(out)
    assert market.get_instance(out.contract_id) is None


def test_props_round_trip_and_bad_props_are_named() -> None:
    i = inputs(paused_reason="p", params_dir="/params")
    assert SlotInputs.from_props(json.loads(json.dumps(i.to_props()))) == i
    with pytest.raises(SlotInputError, match="rtx4090-1"):
        SlotInputs.from_props({**i.to_props(), "pool": {"name": "x"}})


def test_slot_state_file_round_trip(tmp_path: Path) -> None:
    out = SlotProvider(FakeMarket([offer("good", 0.3)]), SECRET).create(inputs())
    path = tmp_path / "state" / "slots.json"
    assert load_slot_state(path) == {}
    save_slot_state(path, {out.slot: out})
    assert load_slot_state(path) == {out.slot: out}
    path.write_text("{oops")
    with pytest.raises(SlotInputError, match="unreadable slot state"):
        load_slot_state(path)


def test_directory_digest_follows_content_and_exec_bit(tmp_path: Path) -> None:
    (tmp_path / "img" / "standin").mkdir(parents=True)
    (tmp_path / "img" / "entrypoint.sh").write_text("echo hi\n")
    (tmp_path / "img" / "standin" / "cuzk-bench").write_text("#!/bin/sh\n")
    first = directory_digest(tmp_path / "img")
    assert first.startswith("sha256:") and len(first) == 71
    assert directory_digest(tmp_path / "img") == first
    (tmp_path / "img" / "__pycache__").mkdir()
    (tmp_path / "img" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert directory_digest(tmp_path / "img") == first
    (tmp_path / "img" / "standin" / "cuzk-bench").chmod(0o755)
    second = directory_digest(tmp_path / "img")
    assert second != first
    (tmp_path / "img" / "entrypoint.sh").write_text("echo changed\n")
    assert directory_digest(tmp_path / "img") not in (first, second)


def test_image_ref_must_be_pinned_by_digest() -> None:
    assert digest_of_image_ref(f"ghcr.io/x/w@{DIGEST}") == DIGEST
    with pytest.raises(SlotInputError, match="not pinned"):
        digest_of_image_ref("ghcr.io/x/w:latest")


# --- against the local marketplace, through the Pulumi adapter ---------------------------------------------

MACHINES = """
machines:
  - {machine_id: m-cheap, host_id: h1, gpu_name: RTX 4090, price_usd_per_hour: 0.30}
  - {machine_id: m-dear, host_id: h2, gpu_name: RTX 4090, price_usd_per_hour: 0.50}
"""


@pytest.fixture
def local_backend(tmp_path: Path) -> Iterator[dict[str, Any]]:
    (tmp_path / "machines.yaml").write_text(MACHINES)
    backend = {"kind": "local", "state_dir": str(tmp_path / "market"), "machines_file": str(tmp_path / "machines.yaml"),
               "worker_command": [sys.executable, "-c", "import time; time.sleep(600)"]}
    yield backend
    from reconciler.adapters.marketplace.local import LocalMarketplace, load_local_machines
    market = LocalMarketplace(backend["state_dir"], load_local_machines(backend["machines_file"]))
    for inst in market.list_instances():
        market.destroy_instance(inst.contract_id)


def configured(backend: dict[str, Any]) -> SlotResourceProvider:
    provider = SlotResourceProvider(backend)
    provider.configure(ConfigureRequest(Config({"fleet:controllerSecret": SECRET.decode()}, "fleet")))
    return provider


def test_dynamic_provider_crud_against_local_marketplace(local_backend: dict[str, Any]) -> None:
    provider = configured(local_backend)
    props = inputs(image=str(Path.cwd()), bad_machine_ids=frozenset({"m-cheap"})).to_props()
    assert provider.check({}, props).failures == []
    created = provider.create(props)
    assert created.outs is not None
    assert created.id == created.outs["instance_id"] and created.outs["machine_id"] == "m-dear"
    state = created.outs

    read = provider.read(created.id, state)
    assert read.id == created.id and read.outs is not None and read.outs["status"] == "running"

    same = provider.diff(created.id, state, props)
    assert not same.replaces and not same.changes
    ranking_only = provider.diff(created.id, state, {**props, "measured": {"m-dear": 80.0}})
    # Ranking data only steers the next create: the instance stays, and the preview says "no change".
    assert not ranking_only.changes and not ranking_only.replaces
    # A retest to rent first (the program sets it on the slot whose instance failed `unknown`): the next create's.
    retest = provider.diff(created.id, state, {**props, "retest_machine_ids": ["m-cheap"]})
    assert not retest.changes and not retest.replaces
    constraint = provider.diff(created.id, state, {**props, "pool": {**props["pool"], "max_price_usd_per_hour": 0.7}})
    assert constraint.changes and not constraint.replaces
    updated = provider.update(created.id, state, {**props, "measured": {"m-dear": 80.0}})
    assert updated.outs is not None and updated.outs["instance_id"] == created.id
    assert updated.outs["measured"] == {"m-dear": 80.0}

    newly_bad = {**props, "bad_machine_ids": ["m-cheap", "m-dear"]}
    diff = provider.diff(created.id, state, newly_bad)
    assert diff.replaces == ["bad_machine_ids"] and diff.delete_before_replace

    preview = provider.diff(created.id, state, {**props, "image_digest": PULUMI_UNKNOWN, "image": PULUMI_UNKNOWN})
    assert preview.replaces == ["image_digest"]

    provider.delete(created.id, state)
    gone = provider.read(created.id, state)
    assert gone.id is None
    provider.delete(created.id, state)  # idempotent


def test_registry_credentials_become_the_pull_login() -> None:
    creds = {"registry_username": "bot", "registry_password": "pw", "registry_server": "ghcr.io"}
    assert image_login_from(creds) == "-u bot -p pw ghcr.io"
    assert image_login_from({"registry_server": "ghcr.io"}) is None  # public image: no login
    market = FakeMarket([offer("good", 0.3)])
    SlotProvider(market, SECRET, image_login=image_login_from(creds)).create(inputs())
    assert market.created["1000"][1].image_login == "-u bot -p pw ghcr.io"
    # the Pulumi adapter takes them from the stack config (the same keys the image push uses)
    provider = SlotResourceProvider({"kind": "vastai", "base_url": "http://127.0.0.1:9/api/v0"})
    provider.configure(ConfigureRequest(Config({
        "fleet:controllerSecret": SECRET.decode(), "fleet:vastaiApiKey": "k", "fleet:registryServer": "ghcr.io",
        "fleet:registryUsername": "bot", "fleet:registryPassword": "pw"}, "fleet")))
    assert provider.slot_provider()._image_login == "-u bot -p pw ghcr.io"


def test_dynamic_provider_check_reports_bad_inputs() -> None:
    result = SlotResourceProvider({"kind": "local"}).check({}, {"slot": "x"})
    assert result.failures and "x" in result.failures[0].reason


def test_dynamic_provider_pickles_without_secrets_and_works_after(local_backend: dict[str, Any]) -> None:
    provider = configured(local_backend)
    provider.slot_provider()  # a live client and a secret now sit on the object
    blob = serialize_provider(provider)
    raw = base64.b64decode(blob)
    assert SECRET not in raw
    clone = dill.loads(raw)  # noqa: S301 - our own blob, as Pulumi's provider process loads it
    assert clone.backend == local_backend and clone._secrets == {}
    with pytest.raises(SlotInputError, match="controllerSecret"):
        clone.create(inputs(image=str(Path.cwd())).to_props())
    clone.configure(ConfigureRequest(Config({"fleet:controllerSecret": SECRET.decode()}, "fleet")))
    out = clone.create(inputs(image=str(Path.cwd())).to_props())
    assert out.outs is not None and out.outs["machine_id"] == "m-cheap"
    clone.delete(out.id, out.outs)
