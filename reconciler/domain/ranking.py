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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from reconciler.domain.hosts import labels_match
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
        owned_hosts=pool.hosts is not None,
        host_labels=tuple(sorted(pool.hosts.labels.items())) if pool.hosts is not None else (),
    )


@dataclass(frozen=True)
class FitRule:
    """One constraint a pool puts on an offer. `FIT_RULES` is the only place deciding whether an offer fits.

    `fits(offer, query)`: whether the offer meets it (the hot path: a comparison, no text). `why(offer, query)`:
    the miss in words, built only for an offer that misses. `wants(query)`: the demand in words for "pool wants
    ..." (None: this query asks nothing of it). `shortfall(query)`: how a count of misses is labelled when no offer
    fits ("2 below reliability 0.98")."""

    name: str
    fits: Callable[[Offer, OfferQuery], bool]
    why: Callable[[Offer, OfferQuery], str]
    wants: Callable[[OfferQuery], str | None]
    shortfall: Callable[[OfferQuery], str]
    #: A marketplace's own statistic (reliability, verification, ...): owned hosts are not measured by it.
    markets_only: bool = False


#: Every constraint, in the order a miss is reported (the first one that fails is the reason). Backends may
#: pre-filter on their own raw fields (vast's search body, a host's free GPUs); fit is decided here, once, by the
#: slot provider (`rank_offers`), for every backend: a constraint added here binds them all.
FIT_RULES: tuple[FitRule, ...] = (
    FitRule("excluded", lambda o, q: o.machine_id not in q.exclude_machine_ids,
            lambda o, q: f"machine {o.machine_id} is recorded bad",
            lambda q: None, lambda q: "on machines recorded bad (excluded)"),
    FitRule("gpu", lambda o, q: o.gpu_name == q.gpu_name, lambda o, q: f"gpu {o.gpu_name!r} is not {q.gpu_name!r}",
            lambda q: f"gpu {q.gpu_name} x{q.num_gpus}", lambda q: f"not {q.gpu_name}"),
    FitRule("gpus", lambda o, q: o.num_gpus == q.num_gpus,
            lambda o, q: f"{o.num_gpus} GPU(s), pool wants {q.num_gpus}",
            lambda q: None, lambda q: f"not {q.num_gpus} GPU(s)"),
    FitRule("placement", lambda o, q: o.owned == q.owned_hosts,
            lambda o, q: "a GPU of an owned host, the pool rents" if o.owned
            else "a rented machine, the pool runs on owned hosts",
            lambda q: "owned hosts" if q.owned_hosts else None,
            lambda q: "rented machines (the pool runs on owned hosts)" if q.owned_hosts else "on owned hosts"),
    FitRule("host_labels", lambda o, q: not q.host_labels or labels_match(dict(o.labels), dict(q.host_labels)),
            lambda o, q: f"host labels {_labels(o.labels)} lack {_labels(q.host_labels)}",
            lambda q: f"host labels {_labels(q.host_labels)}" if q.host_labels else None,
            lambda q: f"on hosts without labels {_labels(q.host_labels)}"),
    FitRule("price", lambda o, q: o.price_usd_per_hour <= q.max_price_usd_per_hour,
            lambda o, q: f"price ${o.price_usd_per_hour}/h above cap ${q.max_price_usd_per_hour}/h",
            lambda q: f"<= ${q.max_price_usd_per_hour}/h",
            lambda q: f"above the price cap ${q.max_price_usd_per_hour}/h"),
    FitRule("reliability", lambda o, q: o.reliability >= q.min_reliability,
            lambda o, q: f"reliability {o.reliability} below {q.min_reliability}",
            lambda q: f"reliability >= {q.min_reliability}", lambda q: f"below reliability {q.min_reliability}",
            markets_only=True),
    FitRule("inet_down", lambda o, q: o.inet_down_mbps >= q.min_inet_down_mbps,
            lambda o, q: f"inet_down {o.inet_down_mbps} Mbps below {q.min_inet_down_mbps}",
            lambda q: f"inet_down >= {q.min_inet_down_mbps} Mbps",
            lambda q: f"below inet_down {q.min_inet_down_mbps} Mbps", markets_only=True),
    FitRule("disk", lambda o, q: o.disk_gb >= q.min_disk_gb, lambda o, q: f"disk {o.disk_gb} GB below {q.min_disk_gb}",
            lambda q: f"disk >= {q.min_disk_gb:g} GB", lambda q: f"below disk {q.min_disk_gb:g} GB"),
    FitRule("host_ram", lambda o, q: o.cpu_ram_gb >= q.min_cpu_ram_gb,
            lambda o, q: f"host RAM {o.cpu_ram_gb} GB below {q.min_cpu_ram_gb}",
            lambda q: f"host RAM >= {q.min_cpu_ram_gb:g} GB", lambda q: f"below host RAM {q.min_cpu_ram_gb:g} GB"),
    FitRule("cuda", lambda o, q: o.cuda_max_good >= q.min_cuda,
            lambda o, q: f"CUDA {o.cuda_max_good} below {q.min_cuda}",
            lambda q: f"CUDA >= {q.min_cuda}", lambda q: f"below CUDA {q.min_cuda}", markets_only=True),
    FitRule("verified", lambda o, q: o.verified or not q.verified_only, lambda o, q: "host not verified",
            lambda q: "verified hosts only" if q.verified_only else None, lambda q: "on unverified hosts",
            markets_only=True),
)


def misfit(offer: Offer, query: OfferQuery) -> tuple[FitRule, str] | None:
    """The first rule `offer` breaks and why, or None when it fits `query`."""
    for rule in FIT_RULES:
        if not (rule.markets_only and offer.owned) and not rule.fits(offer, query):
            return rule, rule.why(offer, query)
    return None


def fits(offer: Offer, query: OfferQuery) -> bool:
    """Whether `offer` meets every rule (the ranking's hot path: no text is built)."""
    owned = offer.owned
    for rule in FIT_RULES:  # noqa: SIM110 - a plain loop: all() over a generator is slower on 50,000 offers
        if not rule.fits(offer, query) and not (rule.markets_only and owned):
            return False
    return True


def mismatch(offer: Offer, query: OfferQuery) -> str | None:
    """Why `offer` does not satisfy `query`, or None when it does."""
    found = misfit(offer, query)
    return None if found is None else found[1]


def describe_wants(query: OfferQuery) -> str:
    """Everything `query` asks, in the rules' words: "gpu RTX 4090 x1, <= $0.6/h, reliability >= 0.98, ..."."""
    return ", ".join(w for rule in FIT_RULES if not (rule.markets_only and query.owned_hosts)
                     and (w := rule.wants(query)) is not None)


def _labels(labels: Iterable[tuple[str, str]]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels)) or "(none)"


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
        if offer.offer_id in seen or not fits(offer, query):
            continue
        seen.add(offer.offer_id)
        rate, basis = expected_rate(offer, measured, priors)
        price = max(offer.price_usd_per_hour, 1e-9)  # a free offer must not divide by zero
        ranked.append(RankedOffer(offer, rate, basis, 0.0 if rate is None else rate / price))
    ranked.sort(key=lambda r: (-r.score, r.offer.price_usd_per_hour, -r.offer.reliability,
                               r.offer.machine_id, r.offer.offer_id))
    return ranked
