"""After a pass: the loop's metrics count it, and the events the webhooks get are the verdicts and the breaker
trip that reached origin (the seed incident: two machines, one image, the breaker trips once)."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families

from reconciler.cli.surfaces import Surfaces
from reconciler.domain.errors import LEASE_LOST
from reconciler.domain.judging import decide
from reconciler.domain.records import RecordSet
from reconciler.flows.judge import PassResult
from reconciler.render.metrics import fleet_metrics
from tests.html_support import FIRST, NOW, SECOND
from tests.scenarios import DIGEST, SPEC


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def seed_pass(pushed: bool = True) -> PassResult:
    decision = decide(SPEC, [FIRST, SECOND], RecordSet(), set(), DIGEST, NOW)
    return PassResult(at=NOW, verdicts=decision.verdicts, commit="c0ffee" if pushed else None, pushed=pushed,
                      attempts=2, image_records=tuple(decision.image_records.values()), publish_seconds=0.4)


def test_a_pass_is_counted_with_its_verdicts_trip_push_retries_and_latencies() -> None:
    result = seed_pass()
    assert [r.signature for r in result.breaker_trips] == ["daemon-connection-refused"]
    metrics = fleet_metrics(lambda: None)
    surfaces = Surfaces(routes=[], metrics=metrics, source=cast(Any, None))
    surfaces.on_pass(result)
    got = samples(metrics.exposition().decode())
    assert got[("fleet_up", ())] == 0  # no state snapshot in this test: said so, not a 500
    assert got[("fleet_reconcile_passes_total", (("outcome", "ok"),))] == 1
    assert got[("fleet_verdicts_total", (("blame", "image"), ("verdict", "benchmark-error")))] == 2
    assert got[("fleet_breaker_trips_total", ())] == 1
    assert got[("fleet_push_attempts_total", ())] == 2 and got[("fleet_push_retries_total", ())] == 1
    assert got[("fleet_commit_push_seconds_count", ())] == 1 and got[("fleet_commit_push_seconds_sum", ())] == 0.4
    assert got[("fleet_report_to_verdict_seconds_count", ())] == 2

    kinds = [(e.kind, e.fields.get("machine_id")) for e in surfaces.notified]
    assert kinds == [("verdict", "40213"), ("verdict", "51877"), ("breaker-trip", None)]
    trip = surfaces.notified[-1]
    assert trip.title.startswith("circuit breaker tripped: image sha256:a1a1a1a1a1a1 fails with "
                                 "daemon-connection-refused on 2 machines")
    held = surfaces.notified[1]
    assert held.title.startswith("benchmark-error") and "Error: connection refused" in held.title
    assert held.title.endswith("machine 51877 (pool rtx-pro-4000) held by circuit-breaker")


def test_nothing_is_announced_before_it_reached_origin() -> None:
    surfaces = Surfaces(routes=[], metrics=fleet_metrics(lambda: None), source=cast(Any, None))
    surfaces.on_pass(seed_pass(pushed=False))
    assert surfaces.notified == []


def test_a_provisioner_run_announces_destroyed_orphans_and_the_spend_cap() -> None:
    from types import SimpleNamespace

    from reconciler.cli.surfaces import provisioner_events

    orphan = SimpleNamespace(contract_id="7781234", label="gpu-fleet/rtx4090-3", price_usd_per_hour=0.33,
                             kind="orphan", why="no slot owns it")
    report = SimpleNamespace(destroyed=(orphan,), plan=SimpleNamespace(capped=("rtx4090-2",)),
                             slots={"a": SimpleNamespace(price_usd_per_hour=0.5), "b": SimpleNamespace(
                                 price_usd_per_hour=0.45)})
    events = provisioner_events(report, SimpleNamespace(max_total_dph=1.0), NOW)
    assert [e.kind for e in events] == ["orphan-destroyed", "spend-cap"]
    assert events[0].title == "orphan destroyed: instance 7781234 (gpu-fleet/rtx4090-3): orphan: no slot owns it"
    assert events[1].title.startswith("spend cap reached: fleet at $0.95/h of $1.00/h")
    # The same cap on the same day is one event, whichever run sees it.
    again = provisioner_events(report, SimpleNamespace(max_total_dph=1.0), NOW)
    assert again[1].idempotency_key == events[1].idempotency_key
    quiet = SimpleNamespace(destroyed=(), plan=SimpleNamespace(capped=()), slots={})
    assert provisioner_events(quiet, SimpleNamespace(max_total_dph=1.0), NOW) == []


def test_a_pass_that_lost_its_term_is_counted_as_not_leader() -> None:
    metrics = fleet_metrics(lambda: None)
    surfaces = Surfaces(routes=[], metrics=metrics, source=cast(Any, None))
    surfaces.on_pass(PassResult(at=NOW, attempts=2, reason=LEASE_LOST,
                                error="not-leader: push refused; nothing left to publish: lease epoch 2 is no longer "
                                      "held by r1; not writing"))
    got = samples(metrics.exposition().decode())
    assert got[("fleet_reconcile_passes_total", (("outcome", "not_leader"),))] == 1
    assert got[("fleet_reconcile_passes_total", (("outcome", "ok"),))] == 0
    assert got[("fleet_reconcile_passes_total", (("outcome", "error"),))] == 0
