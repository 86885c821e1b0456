"""One fit rule for every backend: a constraint added to `ranking.FIT_RULES` binds them all.

Each backend pre-filters on its own raw fields (vast's search body, the local machines' GPU model, an owned host's
free GPUs); whether an offer fits a pool is decided once, by the slot provider's ranking. So this test adds one
constraint in one place - offers outside Norway do not fit - and rents through the real adapters: the local
marketplace (a worker process), vast.ai (the strict fake on 127.0.0.1) and owned Docker hosts (the hosts adapter
over our fake of its Docker port). Each rents the Norwegian machine although another one is cheaper, and with
no Norwegian machine left each says the new constraint is what was short.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.adapters.marketplace.local import LocalMachine, LocalMarketplace
from reconciler.adapters.marketplace.vastai import RetryPolicy, VastAiMarketplace
from reconciler.adapters.slot_provider import SlotProvider
from reconciler.domain import ranking
from reconciler.domain.marketplace import Marketplace, Offer, OfferQuery
from reconciler.domain.ranking import FitRule
from reconciler.domain.slots import NoOfferError, SlotInputs
from reconciler.domain.spec import BenchmarkSettings, ParamsSettings, PoolSpec
from tests.vast_fake import VastFake, VirtualClock, make_offer

SECRET = b"controller-secret-0123456789"
DIGEST = "sha256:" + "3" * 64
POOL = PoolSpec(name="rtx4090", gpu_name="RTX 4090", count=1, min_rate_proofs_per_hour=40,
                max_price_usd_per_hour=0.6, min_reliability=0.9, disk_gb=100, min_host_ram_gb=128,
                verified_only=False, benchmark=BenchmarkSettings(proofs=2, concurrency=1, after="exit"))

IN_NORWAY = FitRule(
    "region",
    lambda o, q: None if (o.geolocation or "").endswith(", NO") else f"located in {o.geolocation or 'nowhere known'}",
    lambda q: "located in Norway",
    lambda q: "outside Norway")


def _inputs(image: str) -> SlotInputs:
    return SlotInputs(slot="rtx4090-0", pool=POOL, image=image, image_digest=DIGEST,
                      controller_url="http://127.0.0.1:9", params=ParamsSettings(), priors={"RTX 4090": 50.0})


@pytest.fixture
def norway_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one place a constraint is added."""
    monkeypatch.setattr(ranking, "FIT_RULES", (*ranking.FIT_RULES, IN_NORWAY))


# --- the backends, each with a cheap offer outside Norway and a dearer one inside ------------------------------------


def _local(tmp_path: Path) -> Iterator[tuple[Marketplace, str]]:
    machines = [LocalMachine("cheap-us", "h1", "RTX 4090", 0.30, geolocation="Texas, US"),
                LocalMachine("dear-no", "h2", "RTX 4090", 0.50, geolocation="Oslo, NO")]
    market = LocalMarketplace(tmp_path / "market", machines, worker_command=["sleep", "30"])
    yield market, str(tmp_path)
    for instance in market.list_instances():
        market.destroy_instance(instance.contract_id)


def _vast(_tmp_path: Path) -> Iterator[tuple[Marketplace, str]]:
    offers = [make_offer(9301, 45001, 801, dph_total=0.30, geolocation="Texas, US"),
              make_offer(9302, 45002, 802, dph_total=0.50, geolocation="Norway, NO")]
    with VastFake(api_key="vk-fit-rule", offers=offers) as fake:
        clock = VirtualClock()
        yield (VastAiMarketplace("vk-fit-rule", base_url=fake.base_url, clock=clock, sleep=clock.sleep,
                                 retry=RetryPolicy(max_attempts=2)), f"registry.example/worker@{DIGEST}")


BACKENDS: dict[str, Callable[[Path], Iterator[tuple[Marketplace, str]]]] = {"local": _local, "vastai": _vast}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Marketplace, str]]:
    yield from BACKENDS[request.param](tmp_path)


def test_a_constraint_added_in_one_place_binds_every_backend(norway_only: None,
                                                               backend: tuple[Marketplace, str]) -> None:
    market, image = backend
    provider = SlotProvider(market, SECRET, nonce=lambda: "f17f17", clock=lambda: 1700.0)
    out = provider.create(_inputs(image))
    assert out.machine_id in ("dear-no", "45002")  # the cheaper machine outside Norway does not fit
    # With the Norwegian machine taken (and here recorded bad), nothing fits, and the shortfall names the new
    # constraint.
    with pytest.raises(NoOfferError, match=r"1 outside Norway") as err:
        provider.create(replace(_inputs(image), slot="rtx4090-1", bad_machine_ids=frozenset({out.machine_id})))
    assert "located in Norway" in str(err.value)  # "pool wants ..." is the rules' words too


def test_without_the_constraint_the_cheaper_machine_wins(backend: tuple[Marketplace, str]) -> None:
    market, image = backend
    out = SlotProvider(market, SECRET, nonce=lambda: "0ff0ff", clock=lambda: 1700.0).create(_inputs(image))
    assert out.machine_id in ("cheap-us", "45001")


def test_the_rule_table_is_the_only_decider() -> None:
    offer = Offer(offer_id="o", machine_id="m", host_id="h", gpu_name="RTX 4090", num_gpus=1, price_usd_per_hour=0.1,
                  reliability=0.99, geolocation="Texas, US")
    query = OfferQuery(gpu_name="RTX 4090", verified_only=False)
    assert ranking.mismatch(offer, query) is None
    assert IN_NORWAY.misfit(offer, query) == "located in Texas, US"
