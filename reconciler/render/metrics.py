"""`/metrics`: the fleet in Prometheus text format (prometheus-client, its own CollectorRegistry).

Two kinds of figures:
- state, read at scrape time by `FleetCollector` from a snapshot callable (the same snapshot the live page
  renders; cached by its source, so a scrape at 10,000 machines does not re-parse the records): instances by
  pool and state, recorded verdicts by kind and blame, proofs/h and $/h per pool against the SLO and the cap,
  bad machines, kill budget, active image suspects, controller store ingest counters;
- events of this process, counted by `LoopMetrics.observe_pass` after every reconcile pass: passes by
  outcome, verdicts by kind and blame, circuit-breaker trips, commit+push latency and attempts, report-to-
  verdict latency.

Metric names are the contract with dashboards (docs/grafana/gpu-fleet.json) and are listed in METRIC_NAMES;
a test checks both against each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reconciler.domain import errors
from reconciler.domain.capacity import PoolCapacityStatus
from reconciler.domain.observations import parse_time
from reconciler.domain.surfaces import MetricsState, total_usd_per_hour

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "fleet"

#: Every metric family this module exposes (without the _total/_bucket/... suffixes the format adds).
METRIC_NAMES = (
    "fleet_up",
    "fleet_pool_desired_instances",
    "fleet_instances",
    "fleet_pool_proofs_per_hour",
    "fleet_pool_serving_instances",
    "fleet_pool_slo_proofs_per_hour",
    "fleet_pool_usd_per_hour",
    "fleet_pool_cap_usd_per_hour",
    "fleet_usd_per_hour",
    "fleet_spend_cap_usd_per_hour",
    "fleet_orphans",
    "fleet_orphans_usd_per_hour",
    "fleet_bad_machines",
    "fleet_kill_budget_used",
    "fleet_kill_budget_allowed",
    "fleet_image_suspects",
    "fleet_recorded_verdicts",
    "fleet_controller_ingested",
    "fleet_reconcile_passes",
    "fleet_verdicts",
    "fleet_breaker_trips",
    "fleet_commit_push_seconds",
    "fleet_push_attempts",
    "fleet_push_retries",
    "fleet_report_to_verdict_seconds",
    "fleet_pool_capacity_desired",
    "fleet_pool_capacity_min",
    "fleet_pool_capacity_max",
    "fleet_pool_draining_instances",
    "fleet_pool_utilization",
    "fleet_pool_waiting_tasks",
    "fleet_pool_queue_up",
    "fleet_pool_capacity_held",
    "fleet_pool_market_revenue_usd_per_proof",
    "fleet_pool_usd_per_proof",
    "fleet_pool_market_proofs_served",
    "fleet_pool_market_paying",
)


class FleetCollector(Collector):
    """Reads the fleet's current state on every scrape (a custom collector: no gauges to keep in sync)."""

    def __init__(self, snapshot: Callable[[], MetricsState | None]):
        self._snapshot = snapshot

    def describe(self) -> Iterable[Metric]:
        return []  # state-dependent label sets: let the registry call collect() lazily

    def collect(self) -> Iterable[Metric]:
        try:
            state = self._snapshot()
        except Exception:  # a scrape must answer: say the state is unreadable instead of a 500
            state = None
        up = GaugeMetricFamily("fleet_up", "1 if the fleet state could be read for this scrape, else 0")
        up.add_metric([], 0.0 if state is None else 1.0)
        yield up
        if state is None:
            return
        view = state.view
        desired = GaugeMetricFamily("fleet_pool_desired_instances", "instances the spec asks for", labels=["pool"])
        instances = GaugeMetricFamily("fleet_instances", "instances reported to the controller, by pool and state",
                                      labels=["pool", "state"])
        bad = GaugeMetricFamily("fleet_bad_machines",
                                "machines of the pool no offer query may return now (bad, permanent, banned)",
                                labels=["pool"])
        used = GaugeMetricFamily("fleet_kill_budget_used", "machines newly marked bad in the kill-budget window",
                                 labels=["pool"])
        allowed = GaugeMetricFamily("fleet_kill_budget_allowed", "machines the kill budget allows in its window",
                                    labels=["pool"])
        states: Mapping[tuple[str, str], int] = (
            state.instance_states if state.instance_states is not None
            else Counter((i.pool or "unknown", i.state) for i in view.instances))
        for pool in view.pools:
            desired.add_metric([pool.name], pool.desired)
            bad.add_metric([pool.name], pool.bad)
            used.add_metric([pool.name], pool.kill_budget_used)
            allowed.add_metric([pool.name], pool.kill_budget_allowed)
        for (pool_name, state_name), n in sorted(states.items()):
            instances.add_metric([pool_name, state_name], n)
        yield from (desired, instances, bad, used, allowed)

        rate = GaugeMetricFamily("fleet_pool_proofs_per_hour", "measured proofs/h of the pool's passing instances",
                                 labels=["pool"])
        slo = GaugeMetricFamily("fleet_pool_slo_proofs_per_hour", "desired count x min rate", labels=["pool"])
        usd = GaugeMetricFamily("fleet_pool_usd_per_hour", "$/h of the pool's alive instances", labels=["pool"])
        cap = GaugeMetricFamily("fleet_pool_cap_usd_per_hour", "desired count x max price", labels=["pool"])
        serving = GaugeMetricFamily("fleet_pool_serving_instances", "instances admitted and serving",
                                    labels=["pool"])
        for e in state.economics:
            serving.add_metric([e.pool], e.serving)
            rate.add_metric([e.pool], e.proofs_per_hour)
            slo.add_metric([e.pool], e.slo_proofs_per_hour)
            usd.add_metric([e.pool], e.usd_per_hour)
            cap.add_metric([e.pool], e.cap_usd_per_hour)
        total = GaugeMetricFamily("fleet_usd_per_hour", "$/h of every alive instance of the fleet")
        total.add_metric([], total_usd_per_hour(state.economics))
        yield from (rate, slo, usd, cap, total, serving)
        market = state.market
        if market.spend_cap_usd_per_hour is not None:
            spend_cap = GaugeMetricFamily("fleet_spend_cap_usd_per_hour", "the fleet's spend cap (max_total_dph)")
            spend_cap.add_metric([], market.spend_cap_usd_per_hour)
            yield spend_cap
        orphans = GaugeMetricFamily("fleet_orphans", "instances with the fleet's label that no slot owns (last sweep)")
        orphans.add_metric([], len(market.orphans))
        orphan_usd = GaugeMetricFamily("fleet_orphans_usd_per_hour", "$/h the orphans cost (last sweep)")
        orphan_usd.add_metric([], market.orphans_usd_per_hour)
        yield from (orphans, orphan_usd)

        yield from _capacity_metrics(view.capacity)
        suspects = GaugeMetricFamily("fleet_image_suspects", "active image suspects (circuit breaker tripped)")
        suspects.add_metric([], len(view.suspects))
        verdicts = GaugeMetricFamily("fleet_recorded_verdicts", "benchmark verdicts in the machine records",
                                     labels=["verdict", "blame"])
        for (verdict, blame), n in sorted(state.recorded_verdicts.items()):
            verdicts.add_metric([verdict, blame], n)
        ingested = CounterMetricFamily("fleet_controller_ingested", "worker reports the controller store holds "
                                       "(registrations, events, results): rate() is the ingest rate",
                                       labels=["kind"])
        for kind, n in sorted(state.ingested.items()):
            ingested.add_metric([kind], n)
        yield from (suspects, verdicts, ingested)


def _capacity_metrics(pools: Sequence[PoolCapacityStatus]) -> Iterable[Metric]:
    """Autoscaled pools: desired vs bounds, draining, utilization and curio's waiting proof tasks."""
    desired = GaugeMetricFamily("fleet_pool_capacity_desired", "the leader's desired count (capacity.yaml)",
                                labels=["pool"])
    low = GaugeMetricFamily("fleet_pool_capacity_min", "count.min of the autoscaled pool", labels=["pool"])
    high = GaugeMetricFamily("fleet_pool_capacity_max", "count.max of the autoscaled pool", labels=["pool"])
    draining = GaugeMetricFamily("fleet_pool_draining_instances", "slots draining (finishing their proofs)",
                                 labels=["pool"])
    utilization = GaugeMetricFamily("fleet_pool_utilization", "busy time / wall time of the pool's serving "
                                    "machines over the scale-up window", labels=["pool"])
    waiting = GaugeMetricFamily("fleet_pool_waiting_tasks", "curio proof tasks without an owner (last pass)",
                                labels=["pool", "task_type"])
    queue_up = GaugeMetricFamily("fleet_pool_queue_up", "1 if the pool's queue source was read by the last pass",
                                 labels=["pool"])
    held = GaugeMetricFamily("fleet_pool_capacity_held", "1 while the last pass held the pool's count, by why "
                             "(fleet-unheard, missing-data, cooldown, at-bound, ...; the page says it in a sentence)",
                             labels=["pool", "held_by"])
    revenue = GaugeMetricFamily("fleet_pool_market_revenue_usd_per_proof", "Snark Market: what a proof paid "
                                "(mean over the window, else the asked price), in $", labels=["pool"])
    cost = GaugeMetricFamily("fleet_pool_usd_per_proof", "the pool's measured cost per proof, in $ (its break-even "
                             "for market work)", labels=["pool"])
    served = GaugeMetricFamily("fleet_pool_market_proofs_served", "Snark Market proofs paid within the window",
                               labels=["pool"])
    paying = GaugeMetricFamily("fleet_pool_market_paying", "1 while market work pays by the pool's margin (and "
                               "counts as demand)", labels=["pool"])
    for c in pools:
        if c.held_by:
            held.add_metric([c.pool, c.held_by], 1.0)
        if c.market is not None:
            paying.add_metric([c.pool], 1.0 if c.market.paying else 0.0)
            if c.market.revenue_usd_per_proof is not None:
                revenue.add_metric([c.pool], c.market.revenue_usd_per_proof)
            if c.market.usd_per_proof is not None:
                cost.add_metric([c.pool], c.market.usd_per_proof)
            if c.market.served is not None:
                served.add_metric([c.pool], c.market.served)
        desired.add_metric([c.pool], c.desired)
        low.add_metric([c.pool], c.min)
        high.add_metric([c.pool], c.max)
        draining.add_metric([c.pool], len(c.draining))
        if c.utilization is not None:
            utilization.add_metric([c.pool], c.utilization)
        if c.queue_configured:
            queue_up.add_metric([c.pool], 0.0 if c.queue_error is not None else 1.0)
            for kind, n in sorted(c.waiting.items()):
                waiting.add_metric([c.pool, kind], n)
    return (desired, low, high, draining, utilization, waiting, queue_up, held, revenue, cost, served, paying)


#: Seconds buckets for commit+push (git over the network: ~0.1 s to a minute with retries).
PUSH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
#: Seconds from a worker's last report to the verdict on it (one pass interval, plus queueing).
VERDICT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)


#: `fleet_reconcile_passes{outcome}`: not_leader = the pass found its leadership term over (lease lost before or
#: after its push, or its push refused with nothing left to publish): it did not do its work, never "ok".
PASS_OUTCOMES = ("ok", "stalled", "observation_error", "error", "not_leader")


class LoopMetrics:
    """Counters and histograms of this process's reconcile passes, fed by `observe_pass` after each pass."""

    def __init__(self, registry: CollectorRegistry):
        self.passes = PromCounter("fleet_reconcile_passes", "reconcile passes by outcome", ["outcome"],
                                  registry=registry)
        self.verdicts = PromCounter("fleet_verdicts", "verdicts recorded by this process, by kind and blame",
                                    ["verdict", "blame"], registry=registry)
        self.breaker_trips = PromCounter("fleet_breaker_trips", "circuit breaker trips (image suspect records "
                                         "committed)", registry=registry)
        self.push_seconds = Histogram("fleet_commit_push_seconds", "time to commit and push one pass's records",
                                      buckets=PUSH_BUCKETS, registry=registry)
        self.push_attempts = PromCounter("fleet_push_attempts", "push attempts", registry=registry)
        self.push_retries = PromCounter("fleet_push_retries", "push attempts beyond the first (rejected or "
                                        "failed pushes retried)", registry=registry)
        self.report_to_verdict = Histogram("fleet_report_to_verdict_seconds", "from a worker's last report to "
                                           "the verdict on it", buckets=VERDICT_BUCKETS, registry=registry)
        for outcome in PASS_OUTCOMES:
            self.passes.labels(outcome)

    def observe_pass(self, result: Any, publish_seconds: float | None = None,
                     breaker_trips: int = 0) -> None:
        """`result`: a reconcile PassResult; `publish_seconds`: how long commit+push took, when it committed."""
        outcome = ("stalled" if result.stalled else "observation_error" if result.observation_error
                   else "not_leader" if result.reason == errors.LEASE_LOST
                   else "error" if result.error else "ok")
        self.passes.labels(outcome).inc()
        if result.attempts:
            self.push_attempts.inc(result.attempts)
            if result.attempts > 1:
                self.push_retries.inc(result.attempts - 1)
        if result.commit and publish_seconds is not None:
            self.push_seconds.observe(publish_seconds)
        if result.commit and result.pushed:
            for v in result.verdicts:
                if v.machine_id:
                    self.verdicts.labels(v.verdict, v.blame).inc()
                latency = report_to_verdict_seconds(v.evidence, v.at)
                if latency is not None:
                    self.report_to_verdict.observe(latency)
        if breaker_trips:
            self.breaker_trips.inc(breaker_trips)


def report_to_verdict_seconds(evidence: Mapping[str, Any], verdict_at: datetime) -> float | None:
    """Seconds from the newest phase time in a verdict's evidence (the last report) to the verdict."""
    phases = evidence.get("phases") if isinstance(evidence, Mapping) else None
    if not isinstance(phases, Mapping):
        return None
    times = []
    for value in phases.values():
        try:
            times.append(parse_time(str(value)))
        except (ValueError, TypeError):
            continue
    if not times:
        return None
    return max((verdict_at - max(times)).total_seconds(), 0.0)


@dataclass
class FleetMetrics:
    """The registry `/metrics` serves: the state collector plus this process's loop metrics."""

    registry: CollectorRegistry
    loop: LoopMetrics

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def fleet_metrics(snapshot: Callable[[], MetricsState | None]) -> FleetMetrics:
    # `*_created` series (process start times per counter) only double the exposition; dashboards use rate().
    disable_created_metrics()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(snapshot))
    return FleetMetrics(registry, LoopMetrics(registry))


def metric_names_in(exposition: str) -> set[str]:
    """The metric family names in an exposition (for tests and the dashboard check)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
    return names


def families(names: Sequence[str]) -> set[str]:
    return {n.removesuffix("_total") for n in names}
