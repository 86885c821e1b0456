"""Offer ranking: which of the market's offers a pool slot should rent.

Pure. Called by the slot provider's create (both drivers: the Pulumi dynamic provider and `fleet apply`)
after `search_offers`. The market's own filtering is not trusted blindly (fakes and real APIs differ in
how strictly they apply a query), so every pool constraint is checked again here, and a machine in the
bad set is never returned whatever the market sent.

Expected throughput of an offer is the machine's own measured median proofs/hour when it has history
(a machine measured below the pool's rate therefore ranks by that low rate), otherwise the GPU model's
prior times the number of GPUs. Score = expected proofs/hour per $/hour; ties break by lower price, then
higher reliability, then machine id and offer id, so the same inputs always give the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from reconciler.domain.marketplace import Offer, OfferQuery
from reconciler.domain.spec import PoolSpec
from reconciler.domain.workload import ram_need

#: Where an offer's expected throughput came from.
BASIS_MEASURED = "measured"
BASIS_PRIOR = "prior"
BASIS_UNKNOWN = "unknown"


@dataclass(frozen=True)
class RankedOffer:
    offer: Offer
    expected_proofs_per_hour: float | None
    basis: str
    score: float

    def describe(self) -> str:
        rate = "?" if self.expected_proofs_per_hour is None else f"{self.expected_proofs_per_hour:.1f}"
        return (f"machine {self.offer.machine_id} ({self.offer.gpu_name} x{self.offer.num_gpus}, "
                f"${self.offer.price_usd_per_hour:.3f}/h, {rate} proofs/h {self.basis})")


def offer_query(pool: PoolSpec, bad_machine_ids: Iterable[str], limit: int = 64) -> OfferQuery:
    """The market query for one slot of `pool`: its constraints, minus every machine recorded bad."""
    return OfferQuery(
        gpu_name=pool.gpu_name,
        num_gpus=pool.gpus_per_instance,
        max_price_usd_per_hour=pool.max_price_usd_per_hour,
        min_reliability=pool.min_reliability,
        min_inet_down_mbps=pool.min_inet_down_mbps,
        min_disk_gb=float(pool.disk_gb),
        # Never below what the pool's own benchmark needs (spec validation refuses such pools already).
        min_cpu_ram_gb=float(max(pool.min_host_ram_gb,
                                 ram_need(pool.benchmark.proof_type, pool.benchmark.concurrency).total_gb)),
        min_cuda=pool.min_cuda,
        verified_only=pool.verified_only,
        exclude_machine_ids=frozenset(str(m) for m in bad_machine_ids),
        limit=limit,
    )


def mismatch(offer: Offer, query: OfferQuery) -> str | None:
    """Why `offer` does not satisfy `query`, or None when it does."""
    if offer.machine_id in query.exclude_machine_ids:
        return f"machine {offer.machine_id} is recorded bad"
    if offer.gpu_name != query.gpu_name:
        return f"gpu {offer.gpu_name!r} is not {query.gpu_name!r}"
    if offer.num_gpus != query.num_gpus:
        return f"{offer.num_gpus} GPU(s), pool wants {query.num_gpus}"
    if offer.price_usd_per_hour > query.max_price_usd_per_hour:
        return f"price ${offer.price_usd_per_hour}/h above cap ${query.max_price_usd_per_hour}/h"
    if offer.reliability < query.min_reliability:
        return f"reliability {offer.reliability} below {query.min_reliability}"
    if offer.inet_down_mbps < query.min_inet_down_mbps:
        return f"inet_down {offer.inet_down_mbps} Mbps below {query.min_inet_down_mbps}"
    if offer.disk_gb < query.min_disk_gb:
        return f"disk {offer.disk_gb} GB below {query.min_disk_gb}"
    if offer.cpu_ram_gb < query.min_cpu_ram_gb:
        return f"host RAM {offer.cpu_ram_gb} GB below {query.min_cpu_ram_gb}"
    if offer.cuda_max_good < query.min_cuda:
        return f"CUDA {offer.cuda_max_good} below {query.min_cuda}"
    if query.verified_only and not offer.verified:
        return "host not verified"
    return None


def expected_rate(offer: Offer, measured: Mapping[str, float], priors: Mapping[str, float]) -> tuple[float | None, str]:
    """Expected proofs/hour of the whole instance, and where the number came from."""
    if offer.machine_id in measured:
        return measured[offer.machine_id], BASIS_MEASURED
    prior = priors.get(offer.gpu_name)
    if prior is None:
        return None, BASIS_UNKNOWN
    return prior * max(offer.num_gpus, 1), BASIS_PRIOR


def rank_offers(offers: Iterable[Offer], pool: PoolSpec, measured: Mapping[str, float],
                priors: Mapping[str, float], bad_machine_ids: Iterable[str]) -> list[RankedOffer]:
    """Offers that fit `pool` and are not on bad machines, best first.

    `measured`: machine_id -> median proofs/hour from that machine's own benchmark history
    (RecordSet.perf_history()). `priors`: GPU model -> proofs/hour per GPU for machines with no history.
    An offer whose throughput cannot be estimated at all ranks after every estimated one (score 0).
    """
    query = offer_query(pool, bad_machine_ids)
    ranked: list[RankedOffer] = []
    seen: set[str] = set()
    for offer in offers:
        if offer.offer_id in seen or mismatch(offer, query) is not None:
            continue
        seen.add(offer.offer_id)
        rate, basis = expected_rate(offer, measured, priors)
        price = max(offer.price_usd_per_hour, 1e-9)  # a free offer must not divide by zero
        ranked.append(RankedOffer(offer, rate, basis, 0.0 if rate is None else rate / price))
    ranked.sort(key=lambda r: (-r.score, r.offer.price_usd_per_hour, -r.offer.reliability,
                               r.offer.machine_id, r.offer.offer_id))
    return ranked
