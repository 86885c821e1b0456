"""Capacity that follows demand on a simulated bursty day (bench/capacity_day.py): idle GPU-hours and the 95th
percentile of proof wait of the autoscaled pool against fixed counts, on a day with a fleet-wide outage; the
same day with curio's Snark Market work at a price that changes. The issue's targets beside each figure."""

from __future__ import annotations

import time

from bench.capacity_day import run_day
from bench.common import Figure


def run() -> list[Figure]:
    started = time.perf_counter()
    report = run_day()
    seconds = time.perf_counter() - started
    auto, at_max, average, market = report.autoscaled, report.fixed_max, report.fixed_average, report.market
    idle_ratio = auto.idle_gpu_hours / at_max.idle_gpu_hours
    wait_ratio = auto.p95_wait_minutes / at_max.p95_wait_minutes if at_max.p95_wait_minutes else float("inf")
    flaps = auto.flaps(report.cooldown_minutes) + market.flaps(report.cooldown_minutes)
    outage_shrinks = [c for r in (auto, market) for c in r.outage_changes if c[1] == "down"]
    outage_changes = len(auto.outage_changes) + len(market.outage_changes)
    floor = 1 - report.min_margin
    detail = "; ".join(line.strip() for line in report.lines())
    return [
        Figure("capacity day (with an outage): idle GPU-hours, autoscaled / fixed at max", idle_ratio, "x",
               f"{auto.idle_gpu_hours:.1f} / {at_max.idle_gpu_hours:.1f} GPU-h; "
               f"{average.label}: {average.idle_gpu_hours:.1f} GPU-h", "<= 0.40x", idle_ratio <= 0.40),
        Figure("capacity day (with an outage): p95 proof wait, autoscaled / fixed at max", wait_ratio, "x",
               f"{auto.p95_wait_minutes:.2f} / {at_max.p95_wait_minutes:.2f} min; fixed at the average: "
               f"{average.p95_wait_minutes:.1f} min", "<= 1.20x", wait_ratio <= 1.2),
        Figure("capacity day: shrinks while the controller heard the fleet too little", len(outage_shrinks), "shrinks",
               f"{auto.outage_holds + market.outage_holds} passes held by fleet-unheard, {outage_changes} changes "
               f"in all (outage {report_outage()})", "0", not outage_shrinks and outage_changes == 0),
        Figure("capacity day: direction changes within a cooldown (flapping)", flaps, "flaps",
               f"{len(auto.decisions)} + {len(market.decisions)} decisions; {auto.drained + market.drained} machines "
               f"drained, {auto.mid_proof_stops + market.mid_proof_stops} stopped mid-proof", "0",
               flaps == 0 and auto.mid_proof_stops + market.mid_proof_stops == 0),
        Figure("market day: market revenue / cost of the market-driven GPU-hours", report.market_return, "x",
               f"${market.market_revenue_usd:.2f} for {market.market_proofs} market proofs; "
               f"{report.market_driven_gpu_hours:.1f} GPU-h beyond the day without the market "
               f"(${report.market_driven_gpu_hours * report.usd_per_hour:.2f})", f">= {floor:.2f}x",
               report.market_return >= floor),
        Figure("capacity days: 2 simulated days (2 x 288 passes + commits)", seconds, "s", detail),
    ]


def report_outage() -> str:
    from bench.capacity_day import OUTAGE, at

    return f"{at(OUTAGE[0]):%H:%M}-{at(OUTAGE[1]):%H:%M} UTC"
