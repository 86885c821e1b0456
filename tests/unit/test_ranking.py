"""Offer ranking: constraints re-checked, bad machines never returned, own history beats the GPU prior."""

from __future__ import annotations

import random
from dataclasses import replace

from reconciler.domain.marketplace import Offer
from reconciler.domain.ranking import BASIS_MEASURED, BASIS_PRIOR, BASIS_UNKNOWN, offer_query, rank_offers
from reconciler.domain.spec import PoolSpec

POOL = PoolSpec(name="rtx4090", gpu_name="RTX 4090", count=2, min_rate_proofs_per_hour=40,
                max_price_usd_per_hour=0.6, min_reliability=0.95, min_inet_down_mbps=200, disk_gb=200,
                min_host_ram_gb=128, min_cuda=12.0)
PRIORS = {"RTX 4090": 60.0}


def offer(machine_id: str, price: float = 0.4, **kw: object) -> Offer:
    base = Offer(offer_id=f"o-{machine_id}", machine_id=machine_id, host_id=f"h-{machine_id}", gpu_name="RTX 4090",
                 num_gpus=1, price_usd_per_hour=price, reliability=0.99, inet_down_mbps=1000, disk_gb=500,
                 cpu_ram_gb=256, cuda_max_good=12.4, verified=True)
    return replace(base, **kw)  # type: ignore[arg-type]


def ids(ranked: list) -> list[str]:
    return [r.offer.machine_id for r in ranked]


def test_bad_machines_are_never_returned_even_when_the_market_sends_them() -> None:
    offers = [offer("good", 0.5), offer("bad", 0.1)]
    ranked = rank_offers(offers, POOL, {}, PRIORS, bad_machine_ids={"bad"})
    assert ids(ranked) == ["good"]


def test_every_pool_constraint_is_rechecked() -> None:
    offers = [
        offer("ok"),
        offer("wrong-gpu", gpu_name="RTX 3090"),
        offer("two-gpus", num_gpus=2),
        offer("pricey", 0.61),
        offer("flaky", reliability=0.9),
        offer("slow-net", inet_down_mbps=100),
        offer("small-disk", disk_gb=100),
        offer("small-ram", cpu_ram_gb=64),
        offer("old-cuda", cuda_max_good=11.8),
        offer("unverified", verified=False),
    ]
    assert ids(rank_offers(offers, POOL, {}, PRIORS, ())) == ["ok"]
    unverified_ok = replace(POOL, verified_only=False)
    assert set(ids(rank_offers(offers, unverified_ok, {}, PRIORS, ()))) == {"ok", "unverified"}


def test_own_history_beats_prior_and_below_rate_machine_ranks_by_its_measured_rate() -> None:
    offers = [offer("unknown", 0.40), offer("fast-known", 0.50), offer("slow-known", 0.20)]
    measured = {"fast-known": 120.0, "slow-known": 5.0}
    ranked = rank_offers(offers, POOL, measured, PRIORS, ())
    # fast-known 240/$, unknown 60/0.4 = 150/$, slow-known 5/0.2 = 25/$ (cheap but measured slow)
    assert ids(ranked) == ["fast-known", "unknown", "slow-known"]
    assert [r.basis for r in ranked] == [BASIS_MEASURED, BASIS_PRIOR, BASIS_MEASURED]
    assert ranked[1].expected_proofs_per_hour == 60.0
    assert ranked[0].score == 240.0


def test_prior_scales_with_gpu_count() -> None:
    pool = replace(POOL, gpus_per_instance=2, max_price_usd_per_hour=2.0)
    ranked = rank_offers([offer("dual", 1.0, num_gpus=2)], pool, {}, PRIORS, ())
    assert ranked[0].expected_proofs_per_hour == 120.0


def test_unknown_gpu_without_history_ranks_last_but_is_still_usable() -> None:
    offers = [offer("a", 0.1), offer("b", 0.5)]
    ranked = rank_offers(offers, POOL, {"b": 10.0}, {}, ())
    assert ids(ranked) == ["b", "a"]
    assert ranked[1].basis == BASIS_UNKNOWN and ranked[1].score == 0.0


def test_ties_break_deterministically_whatever_the_input_order() -> None:
    offers = [offer("m3", 0.4), offer("m1", 0.4), offer("m2", 0.4, reliability=0.999), offer("m0", 0.3)]
    expected = ids(rank_offers(offers, POOL, {"m0": 45.0}, PRIORS, ()))
    # m0: 45/0.3 = 150 = 60/0.4: tie on score, lower price first; then higher reliability; then id
    assert expected == ["m0", "m2", "m1", "m3"]
    rng = random.Random(7)
    for _ in range(20):
        shuffled = offers[:]
        rng.shuffle(shuffled)
        assert ids(rank_offers(shuffled, POOL, {"m0": 45.0}, PRIORS, ())) == expected


def test_duplicate_offers_are_returned_once() -> None:
    assert ids(rank_offers([offer("a"), offer("a")], POOL, {}, PRIORS, ())) == ["a"]


def test_query_carries_pool_constraints_and_bad_set() -> None:
    q = offer_query(POOL, ["x", "y"])
    assert q.gpu_name == "RTX 4090" and q.max_price_usd_per_hour == 0.6 and q.min_cpu_ram_gb == 128
    assert q.exclude_machine_ids == frozenset({"x", "y"})
