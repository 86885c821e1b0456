"""What a pool should deliver and cost once its slots are filled, from the machines' own benchmark history:
the PR comment's "expected proofs/h and $/h against the pool's minimum and price cap". Pure.

For each pool the slots go, like the provisioner's ranking, to the best known machines first: machines of
the pool's GPU model that are not recorded bad, whose measured median rate meets the pool's minimum and
whose last recorded price is within the cap, best proofs/h per $ first (unknown price: by rate). Slots the
history cannot fill are counted at the GPU model's prior (spec `gpu_priors`) and at the price cap (an upper
bound), and the forecast warns: the market as we have seen it cannot fill the pool with proven machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reconciler.domain.records import MachineRecord, RecordSet
from reconciler.domain.spec import FleetSpec, PoolSpec
from reconciler.domain.verdicts import RATE_VERDICTS


@dataclass(frozen=True)
class KnownMachine:
    machine_id: str
    proofs_per_hour: float  # median of its measured benchmarks
    usd_per_hour: float | None  # its latest recorded price

    @property
    def proofs_per_usd(self) -> float:
        return self.proofs_per_hour / self.usd_per_hour if self.usd_per_hour else 0.0


@dataclass(frozen=True)
class PoolForecast:
    pool: str
    gpu_name: str
    desired: int
    min_rate_proofs_per_hour: float
    max_price_usd_per_hour: float
    expected_proofs_per_hour: float | None  # None: some slot has neither history nor a prior
    expected_usd_per_hour: float  # measured prices, the cap for slots without one (upper bound)
    priced_by_cap: int  # slots counted at the cap because no price is known
    measured: int  # slots filled by machines with history that meets the pool
    from_prior: int  # slots counted at the GPU prior
    unknown: int  # slots with no history and no prior
    below_min_known: int  # good machines of this GPU measured below the minimum (will not be rented)
    warnings: tuple[str, ...] = ()

    @property
    def slo_proofs_per_hour(self) -> float:
        return self.desired * self.min_rate_proofs_per_hour

    @property
    def cap_usd_per_hour(self) -> float:
        return round(self.desired * self.max_price_usd_per_hour, 4)

    @property
    def meets_slo(self) -> bool | None:
        if self.expected_proofs_per_hour is None:
            return None
        return self.expected_proofs_per_hour >= self.slo_proofs_per_hour


def _known(record: MachineRecord, gpu_name: str) -> KnownMachine | None:
    """A good machine of `gpu_name` with measured benchmarks (its median), else None."""
    if record.is_bad or record.gpu_name != gpu_name:
        return None
    rates = sorted(b.proofs_per_hour for b in record.benchmarks
                   if b.proofs_per_hour is not None and b.verdict in RATE_VERDICTS)
    if not rates:
        return None
    mid = len(rates) // 2
    median = rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2
    price = next((b.price_usd_per_hour for b in reversed(record.benchmarks) if b.price_usd_per_hour is not None),
                 None)
    return KnownMachine(record.machine_id, median, price)


def known_machines(records: RecordSet, gpu_name: str, now: datetime | None = None) -> list[KnownMachine]:
    """What `_known` gives for every record, from the RecordSet's views (perf history, bad set, prices): the
    same machines and numbers without building each record (10,000 records: the index answers from columns)."""
    bad = records.bad_machine_ids(now)  # what the offer queries exclude at `now` (probation: rentable)
    prices = records.last_prices()
    return [KnownMachine(p.machine_id, p.median_proofs_per_hour, prices.get(p.machine_id))
            for p in records.perf_history().values() if p.gpu_name == gpu_name and p.machine_id not in bad]


def pool_forecast(spec: FleetSpec, pool: PoolSpec, records: RecordSet, now: datetime | None = None) -> PoolForecast:
    known = known_machines(records, pool.gpu_name, now)
    fits = [k for k in known if k.proofs_per_hour >= pool.min_rate_proofs_per_hour
            and (k.usd_per_hour is None or k.usd_per_hour <= pool.max_price_usd_per_hour)]
    fits.sort(key=lambda k: (-k.proofs_per_usd, -k.proofs_per_hour, k.machine_id))
    chosen = fits[:pool.count]
    missing = pool.count - len(chosen)
    prior = spec.gpu_priors.get(pool.gpu_name)
    prior_rate = prior * pool.gpus_per_instance if prior is not None else None
    rate: float | None = sum(k.proofs_per_hour for k in chosen)
    from_prior = unknown = 0
    if missing:
        if prior_rate is None:
            unknown, rate = missing, None
        else:
            from_prior = missing
            rate = (rate or 0.0) + missing * prior_rate
    priced = [k.usd_per_hour for k in chosen if k.usd_per_hour is not None]
    by_cap = pool.count - len(priced)
    usd = round(sum(priced) + by_cap * pool.max_price_usd_per_hour, 4)
    below = sum(1 for k in known if k.proofs_per_hour < pool.min_rate_proofs_per_hour)

    warnings = []
    if missing:
        basis = (f"counted at the {pool.gpu_name} prior of {prior_rate:g}/h" if prior_rate is not None
                 else "with no prior for this GPU in the spec: output unknown")
        warnings.append(f"the market cannot fill it from history: only {len(chosen)} of {pool.count} slots have a "
                        f"known {pool.gpu_name} machine that proved >= {pool.min_rate_proofs_per_hour:g}/h at <= "
                        f"${pool.max_price_usd_per_hour:.2f}/h; {missing} will rent unproven machines ({basis})")
    if prior_rate is not None and missing and prior_rate < pool.min_rate_proofs_per_hour:
        warnings.append(f"the {pool.gpu_name} prior ({prior_rate:g}/h) is below the minimum "
                        f"({pool.min_rate_proofs_per_hour:g}/h): unproven machines will likely be judged too slow")
    if rate is not None and rate < pool.count * pool.min_rate_proofs_per_hour:
        warnings.append(f"expected {rate:.1f} proofs/h is below the SLO of {pool.count} x "
                        f"{pool.min_rate_proofs_per_hour:g} = {pool.count * pool.min_rate_proofs_per_hour:g}/h")
    return PoolForecast(pool.name, pool.gpu_name, pool.count, pool.min_rate_proofs_per_hour,
                        pool.max_price_usd_per_hour, None if rate is None else round(rate, 3), usd, by_cap,
                        len(chosen), from_prior, unknown, below, tuple(warnings))


def fleet_forecast(spec: FleetSpec, records: RecordSet, now: datetime | None = None) -> tuple[PoolForecast, ...]:
    return tuple(pool_forecast(spec, pool, records, now) for pool in spec.pools)
