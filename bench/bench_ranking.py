"""Offer ranking over 50,000 offers: `ranking.rank_offers` for one pool, with measured history for 10,000
machines and 1,000 bad machines (what the slot provider does per create)."""

from __future__ import annotations

from bench.common import Figure, median_time
from bench.data import POOLS, machine_id_of, make_spec, offers
from reconciler.domain.marketplace import Offer
from reconciler.domain.ranking import rank_offers

OFFERS = 50_000
MACHINES = 20_000


def run(repeats: int = 5) -> list[Figure]:
    spec = make_spec()
    pool = spec.pool(POOLS[0][0])
    markets = {"mixed market": offers(OFFERS, MACHINES), "every offer fits": offers(OFFERS, MACHINES, all_fit=True)}
    measured = {machine_id_of(m): 30.0 + (m % 50) for m in range(0, MACHINES, 2)}  # half the machines known
    priors = {gpu: spec.prior_proofs_per_hour(gpu) or 0.0 for _, gpu, _ in POOLS}
    bad = frozenset(machine_id_of(m) for m in range(0, MACHINES, 20))
    figures = []
    for label, market in markets.items():
        ranked: list[object] = []

        def rank(market: list[Offer] = market, ranked: list[object] = ranked) -> None:
            ranked[:] = rank_offers(market, pool, measured, priors, bad)

        seconds = median_time(rank, repeats)
        figures.append(Figure(f"offer ranking, 50,000 offers ({label})", seconds * 1000, "ms",
                              f"median of {repeats}; {len(ranked):,} offers fit pool {pool.name}; "
                              f"{len(measured):,} machines with history, {len(bad):,} bad"))
    return figures
