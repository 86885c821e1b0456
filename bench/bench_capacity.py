"""Capacity that follows demand on a simulated bursty day (bench/capacity_day.py): idle GPU-hours and the 95th
percentile of proof wait of the autoscaled pool against fixed counts, with the issue's targets."""

from __future__ import annotations

import time

from bench.capacity_day import run_day
from bench.common import Figure


def run() -> list[Figure]:
    started = time.perf_counter()
    report = run_day()
    seconds = time.perf_counter() - started
    auto, at_max, average = report.autoscaled, report.fixed_max, report.fixed_average
    idle_ratio = auto.idle_gpu_hours / at_max.idle_gpu_hours
    wait_ratio = auto.p95_wait_minutes / at_max.p95_wait_minutes if at_max.p95_wait_minutes else float("inf")
    flaps = auto.flaps(report.cooldown_minutes)
    detail = "; ".join(line.strip() for line in report.lines())
    return [
        Figure("capacity day: idle GPU-hours, autoscaled / fixed at max", idle_ratio, "x",
               f"{auto.idle_gpu_hours:.1f} / {at_max.idle_gpu_hours:.1f} GPU-h; "
               f"{average.label}: {average.idle_gpu_hours:.1f} GPU-h", "<= 0.40x", idle_ratio <= 0.40),
        Figure("capacity day: p95 proof wait, autoscaled / fixed at max", wait_ratio, "x",
               f"{auto.p95_wait_minutes:.2f} / {at_max.p95_wait_minutes:.2f} min; fixed at the average: "
               f"{average.p95_wait_minutes:.1f} min", "<= 1.20x", wait_ratio <= 1.2),
        Figure("capacity day: direction changes within a cooldown (flapping)", flaps, "flaps",
               f"{len(auto.decisions)} decisions in {auto.commits} commits; {auto.drained} machines drained, "
               f"{auto.mid_proof_stops} stopped mid-proof", "0", flaps == 0),
        Figure("capacity day: simulated day (288 passes + commits)", seconds, "s", detail),
    ]
