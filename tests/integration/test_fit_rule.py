"""One fit rule for every backend: a constraint added to `ranking.FIT_RULES` binds them all.

Each backend pre-filters on its own raw fields (vast's search body, the local machines' GPU model, an owned host's
free GPUs); whether an offer fits a pool is decided once, by the slot provider's ranking. So this test adds one
constraint in one place - at least 200 GB of host RAM for the worker - and rents through the real adapters: the
local marketplace (a worker process), vast.ai (the strict fake on 127.0.0.1) and owned Docker hosts (the hosts
adapter over our fake of its Docker port). Each rents the big machine although a smaller one is cheaper, and with
the big one gone each says the new constraint is what was short.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from reconciler.adapters.marketplace.hosts import HostsMarketplace
from reconciler.adapters.marketplace.local import LocalMachine, LocalMarketplace
from reconciler.adapters.marketplace.vastai import RetryPolicy, VastAiMarketplace
from reconciler.adapters.slot_provider import SlotProvider
from reconciler.domain import ranking
from reconciler.domain.hosts import HostSelector, OwnedHost, gpu_machine_id
from reconciler.domain.marketplace import Marketplace, Offer, OfferQuery
from reconciler.domain.ranking import FitRule
from reconciler.domain.slots import NoOfferError, SlotInputs
from reconciler.domain.spec import BenchmarkSettings, ParamsSettings, PoolSpec
from tests.fakes import FakeDockerEngine
from tests.vast_fake import VastFake, VirtualClock, make_offer

SECRET = b"controller-secret-0123456789"
DIGEST = "sha256:" + "3" * 64
POOL = PoolSpec(name="rtx4090", gpu_name="RTX 4090", count=1, min_rate_proofs_per_hour=40,
                max_price_usd_per_hour=0.6, min_reliability=0.9, disk_gb=100, min_host_ram_gb=100,
                verified_only=False, benchmark=BenchmarkSettings(proofs=2, concurrency=1, after="exit"))

BIG_RAM = FitRule(
    "big_ram",
    lambda o, q: o.cpu_ram_gb >= 200,
    lambda o, q: f"{o.cpu_ram_gb:g} GB of host RAM for the worker",
    lambda q: "host RAM >= 200 GB (big boxes only)",
    lambda q: "below 200 GB of host RAM")

UUID_SMALL = "GPU-00000000-0000-0000-0000-000000000001"
UUID_BIG = "GPU-00000000-0000-0000-0000-000000000002"


@pytest.fixture
def big_boxes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one place a constraint is added."""
    monkeypatch.setattr(ranking, "FIT_RULES", (*ranking.FIT_RULES, BIG_RAM))


@dataclass
class Backend:
    market: Marketplace
    image: str
    pool: PoolSpec
    small: str  # machine id of the cheap machine with 128 GB
    big: str  # machine id of the dearer one with 256 GB

    def inputs(self, slot: str = "rtx4090-0", **kw: object) -> SlotInputs:
        base = SlotInputs(slot=slot, pool=self.pool, image=self.image, image_digest=DIGEST,
                          controller_url="http://127.0.0.1:9", params=ParamsSettings(), priors={"RTX 4090": 50.0})
        return replace(base, **kw)  # type: ignore[arg-type]


# --- the backends, each with a cheap 128 GB machine and a dearer 256 GB one ------------------------------------------


def _local(tmp_path: Path) -> Iterator[Backend]:
    machines = [LocalMachine("small", "h1", "RTX 4090", 0.30, cpu_ram_gb=128),
                LocalMachine("big", "h2", "RTX 4090", 0.50, cpu_ram_gb=256)]
    market = LocalMarketplace(tmp_path / "market", machines, worker_command=["sleep", "30"])
    yield Backend(market, str(tmp_path), POOL, "small", "big")
    for instance in market.list_instances():
        market.destroy_instance(instance.contract_id)


def _vast(_tmp_path: Path) -> Iterator[Backend]:
    offers = [make_offer(9301, 45001, 801, dph_total=0.30, cpu_ram=128_000),
              make_offer(9302, 45002, 802, dph_total=0.50, cpu_ram=256_000)]
    with VastFake(api_key="vk-fit-rule", offers=offers) as fake:
        clock = VirtualClock()
        market = VastAiMarketplace("vk-fit-rule", base_url=fake.base_url, clock=clock, sleep=clock.sleep,
                                   retry=RetryPolicy(max_attempts=2))
        yield Backend(market, f"registry.example/worker@{DIGEST}", POOL, "45001", "45002")


def _hosts(_tmp_path: Path) -> Iterator[Backend]:
    hosts = [OwnedHost("small", "ssh://fleet@10.0.0.1", "RTX 4090", (UUID_SMALL,), 1, ram_gb=128, disk_gb=500,
                       cost_usd_per_gpu_hour=0.30),
             OwnedHost("big", "ssh://fleet@10.0.0.2", "RTX 4090", (UUID_BIG,), 1, ram_gb=256, disk_gb=500,
                       cost_usd_per_gpu_hour=0.50)]
    engines = {h.name: FakeDockerEngine(h.name) for h in hosts}
    market = HostsMarketplace(hosts, lambda h: engines[h.name])
    yield Backend(market, f"registry.example/worker@{DIGEST}", replace(POOL, hosts=HostSelector()),
                  gpu_machine_id("small", UUID_SMALL), gpu_machine_id("big", UUID_BIG))


BACKENDS: dict[str, Callable[[Path], Iterator[Backend]]] = {"local": _local, "vastai": _vast, "hosts": _hosts}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from BACKENDS[request.param](tmp_path)


def test_a_constraint_added_in_one_place_binds_every_backend(big_boxes_only: None, backend: Backend) -> None:
    provider = SlotProvider(backend.market, SECRET, nonce=lambda: "f17f17", clock=lambda: 1700.0)
    out = provider.create(backend.inputs())
    assert out.machine_id == backend.big  # the cheaper, smaller machine does not fit
    # With the big machine taken (and here recorded bad), nothing fits, and the shortfall names the new constraint.
    with pytest.raises(NoOfferError, match=r"1 below 200 GB of host RAM") as err:
        provider.create(backend.inputs("rtx4090-1", bad_machine_ids=frozenset({out.machine_id})))
    assert "host RAM >= 200 GB (big boxes only)" in str(err.value)  # "pool wants ..." is the rules' words too


def test_without_the_constraint_the_cheaper_machine_wins(backend: Backend) -> None:
    out = SlotProvider(backend.market, SECRET, nonce=lambda: "0ff0ff", clock=lambda: 1700.0).create(backend.inputs())
    assert out.machine_id == backend.small


def test_the_rule_table_is_the_only_decider() -> None:
    offer = Offer(offer_id="o", machine_id="m", host_id="h", gpu_name="RTX 4090", num_gpus=1, price_usd_per_hour=0.1,
                  reliability=0.99, cpu_ram_gb=128)
    query = OfferQuery(gpu_name="RTX 4090", verified_only=False)
    assert ranking.mismatch(offer, query) is None
    assert not BIG_RAM.fits(offer, query) and BIG_RAM.why(offer, query) == "128 GB of host RAM for the worker"
