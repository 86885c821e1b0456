"""The typed provider boundary (domain/slots.py): one decode for what crossed Pulumi's gRPC boundary, and
the shortfall a slot error reports when a pool cannot be filled."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler.domain.marketplace import Offer
from reconciler.domain.slots import (
    PULUMI_UNKNOWN,
    UNKNOWN,
    PoolData,
    SlotInputError,
    decode_slot_inputs,
    decode_slot_outputs,
    describe_shortfall,
    slot_diff,
    worker_env,
)
from reconciler.domain.spec import PoolSpec

POOL = {"name": "p", "gpu_name": "RTX 4090", "count": 2.0, "min_rate_proofs_per_hour": 40.0,
        "max_price_usd_per_hour": 0.6, "disk_gb": 150.0, "verified_only": True,
        "benchmark": {"proofs": 10.0, "concurrency": 2.0, "timeout_minutes": 30.0, "after": "exit"}}


def props(**extra: Any) -> dict[str, Any]:
    return {"slot": "p-0", "pool": json.loads(json.dumps(POOL)), "image": "r@sha256:1", "image_digest": "sha256:1",
            "controller_url": "https://c.example", "params": {"fetch_timeout_minutes": 60.0}, **extra}


def test_doubles_from_the_wire_become_the_declared_types() -> None:
    inputs = decode_slot_inputs(props(bad_machine_ids=["m1"], measured={"m2": 50}))
    assert (inputs.pool.count, inputs.pool.disk_gb, inputs.pool.benchmark.proofs) == (2, 150, 10)
    assert all(type(v) is int for v in (inputs.pool.count, inputs.pool.disk_gb, inputs.pool.benchmark.proofs,
                                        inputs.pool.benchmark.concurrency))
    assert inputs.measured == {"m2": 50.0} and type(inputs.measured["m2"]) is float
    assert inputs.bad_machine_ids == {"m1"}


@pytest.mark.parametrize(("path", "value", "message"), [
    (("pool", "count"), 2.5, "slot p-0: input pool.count: expected an integer, got 2.5"),
    (("pool", "benchmark", "proofs"), "10.0", "input pool.benchmark.proofs: expected an integer, got '10.0'"),
    (("pool", "benchmark", "proofs"), float("nan"), "input pool.benchmark.proofs: expected an integer"),
    (("pool", "verified_only"), 1.0, "input pool.verified_only: expected true or false, got 1.0"),
    (("pool", "max_price_usd_per_hour"), "0.6", "input pool.max_price_usd_per_hour: expected a number"),
    (("pool", "gpu_name"), 4090.0, "input pool.gpu_name: expected text, got 4090.0"),
    (("pool", "colour"), "red", "input pool.colour: unknown field"),
    (("controller_url",), None, "input controller_url: expected text, got None"),
])
def test_a_bad_value_is_refused_naming_slot_and_field(path: tuple[str, ...], value: Any, message: str) -> None:
    doc = props()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SlotInputError) as caught:
        decode_slot_inputs(doc)
    assert message in str(caught.value)
    assert caught.value.field == ".".join(path)


def test_no_float_text_reaches_the_worker_environment() -> None:
    from reconciler.domain.ranking import RankedOffer

    inputs = decode_slot_inputs(props())
    offer = Offer(offer_id="a", machine_id="m", host_id="h", gpu_name="RTX 4090", num_gpus=1, price_usd_per_hour=0.3,
                  reliability=0.99, inet_down_mbps=900, disk_gb=500, cpu_ram_gb=256, cuda_max_good=12.8)
    env = worker_env(inputs, "p-0-abc", "tok", RankedOffer(offer, 50.0, "prior", 100.0), "claim")
    assert env["FLEET_BENCH_PROOFS"] == "10" and env["FLEET_BENCH_CONCURRENCY"] == "2"
    assert env["FLEET_BENCH_TIMEOUT_S"] == "1800" and env["FLEET_PARAMS_TIMEOUT_S"] == "3600"
    assert not any(v.endswith(".0") for v in env.values())


def test_unknowns_only_in_preview_and_never_truthy() -> None:
    for unknown in (UNKNOWN, PULUMI_UNKNOWN):
        doc = props(image=unknown, image_digest=unknown, paused_reason=unknown)
        with pytest.raises(SlotInputError, match="unknown outside a preview"):
            decode_slot_inputs(doc)
        inputs = decode_slot_inputs(doc, allow_unknown=True)
        assert inputs.image_digest is UNKNOWN and inputs.paused_reason is UNKNOWN
        with pytest.raises(TypeError):
            bool(inputs.paused_reason)
    with pytest.raises(SlotInputError, match=r"pool\.count: value is unknown"):
        decode_slot_inputs(props(pool={**POOL, "count": UNKNOWN}), allow_unknown=True)


def test_preview_diff_of_a_rebuild_replaces_even_with_an_unknown_hold() -> None:
    old = decode_slot_outputs({"slot": "p-0", "pool_name": "p", "instance_id": "p-0-a", "contract_id": "1",
                               "machine_id": "m", "host_id": "h", "gpu_name": "RTX 4090",
                               "price_usd_per_hour": 0.3, "image": "r@sha256:1", "image_digest": "sha256:1",
                               "status": "running", "created_at": 1.0})
    new = decode_slot_inputs(props(image=UNKNOWN, image_digest=UNKNOWN, paused_reason=UNKNOWN), allow_unknown=True)
    d = slot_diff(old, new)
    assert d.replace and d.replaces == ("image_digest",)
    assert not slot_diff(old, decode_slot_inputs(props())).replace


def test_pool_data_by_digest_and_a_tampered_file_is_refused() -> None:
    data = PoolData(bad_machine_ids=frozenset({"m1", "m2"}), measured={"m3": 41.5})
    store = {data.digest: data}
    inputs = decode_slot_inputs(props(pool_data=data.ref()), resolve_pool_data=store.__getitem__)
    assert inputs.bad_machine_ids == {"m1", "m2"} and inputs.measured == {"m3": 41.5}
    other = PoolData(bad_machine_ids=frozenset({"m1"}))
    with pytest.raises(SlotInputError, match=r"pool_data\.digest"):
        decode_slot_inputs(props(pool_data=data.ref()), resolve_pool_data=lambda _d: other)


def offer(mid: str, price: float, **kw: Any) -> Offer:
    base = {"offer_id": f"a{mid}", "machine_id": mid, "host_id": "h", "gpu_name": "RTX 4090", "num_gpus": 1,
            "price_usd_per_hour": price, "reliability": 0.99, "inet_down_mbps": 900.0, "disk_gb": 500.0,
            "cpu_ram_gb": 256.0, "cuda_max_good": 12.8, "verified": True}
    return Offer(**{**base, **kw})


def test_shortfall_says_what_was_short() -> None:
    pool = PoolSpec(name="p", gpu_name="RTX 4090", count=2, min_rate_proofs_per_hour=40, max_price_usd_per_hour=0.4,
                    min_reliability=0.98)
    text = describe_shortfall(pool, frozenset({"bad1", "bad2"}), [
        offer("bad1", 0.3), offer("bad2", 0.35), offer("dear", 0.72), offer("dearer", 0.9),
        offer("flaky", 0.3, reliability=0.8), offer("x", 0.1, gpu_name="RTX 3090")])
    assert text == ("the market lists 5 RTX 4090 x1 offer(s): 2 on machines recorded bad (excluded), "
                    "2 above the price cap $0.4/h (cheapest of them $0.72/h), 1 below reliability 0.98")
    assert "no RTX 4090 x1 offer" in describe_shortfall(pool, frozenset(), [offer("x", 0.1, gpu_name="RTX 3090")])
