"""curio's Snark Market by its price (domain/snark_market.py, capacity's market demand) and the serving verdict
for machines that miss its deadlines (domain/serving.py judge_market_deadlines), pure.

MARKET_SPEC: pool rtx4090, max $0.50/h, min 40 proofs/h, `queue.market: {min_margin: 0.2, usd_per_fil: 4}`.
The serving machines of these tests prove 48/h at $0.50/h: $0.0104/proof, so a market proof must pay more
than $0.0125 (0.003125 FIL) to count.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from reconciler.domain.capacity import CapacityEntry, QueueSnapshot, apply_entries, decide_all
from reconciler.domain.judging import decide
from reconciler.domain.records import RecordSet
from reconciler.domain.serving import MARKET_DEADLINE, judge_market_deadlines
from reconciler.domain.snark_market import (
    ATTO_PER_FIL,
    MachineCost,
    MarketMiss,
    MarketSnapshot,
    market_economics,
    pool_cost_per_proof,
)
from reconciler.domain.status import status_view
from reconciler.domain.surfaces import MetricsState
from reconciler.render.html import render_html
from reconciler.render.metrics import fleet_metrics
from reconciler.render.text import render_text
from tests.capacity_support import MARKET_SPEC, at, autoscaled_spec, serving
from tests.scenarios import DIGEST

SPEC = autoscaled_spec(MARKET_SPEC)
MILLI = ATTO_PER_FIL // 1000  # 0.001 FIL in attoFIL
BUSY = [True] * 12
IDLE = [False] * 12


def entry(desired: int, changed_min: float = -120) -> dict[str, CapacityEntry]:
    return {"rtx4090": CapacityEntry("rtx4090", desired, tuple(range(desired)), (), at(changed_min), "up", "earlier")}


def one(entries, reports, queue, now, **kw):  # type: ignore[no-untyped-def]
    (d,) = decide_all(apply_entries(SPEC, entries), entries, reports, {"rtx4090": queue}, now, **kw)
    return d


def market_queue(pay_milli_fil: float | None, *, waiting: int = 8, running: int = 0, posted_min: float = 30,
                 error: str | None = None) -> QueueSnapshot:
    """Own queue empty; the market with `waiting` PSProve tasks since `posted_min`, 10 paid proofs at the pay."""
    market = MarketSnapshot(waiting, running, at(posted_min) if waiting else None,
                            10 if pay_milli_fil is not None else 0,
                            round(10 * (pay_milli_fil or 0) * MILLI), None, error=error)
    return QueueSnapshot({"PoRep": 0}, {"PoRep": 0}, market=market)


# --- economics -----------------------------------------------------------------------------------------


def test_revenue_is_the_mean_pay_of_the_paid_proofs_else_the_asked_price_and_cost_is_measured() -> None:
    cost, basis = pool_cost_per_proof([MachineCost(0.5, 48.0), MachineCost(0.4, 40.0)], 0.6, 40.0)
    assert cost == pytest.approx(0.9 / 88) and basis == "$0.90/h over 88 proofs/h measured on 2 machine(s)"
    assert pool_cost_per_proof([], 0.6, 40.0) == (0.015, "no machine measured: max price $0.6/h over min 40/h")
    paid = market_economics(MarketSnapshot(paid_proofs=4, paid_atto=20 * MILLI, asked_atto=3 * MILLI),
                            usd_per_fil=4.0, min_margin=0.2, window_hours=24, cost_usd_per_proof=0.015,
                            cost_basis="x")
    assert paid.revenue_usd_per_proof == pytest.approx(0.02) and paid.paying  # 0.005 FIL x $4 > 0.015 x 1.2
    assert paid.break_even_usd_per_proof == 0.015 and paid.threshold_usd_per_proof == pytest.approx(0.018)
    asked = market_economics(MarketSnapshot(asked_atto=4 * MILLI), usd_per_fil=4.0, min_margin=0.2, window_hours=24,
                             cost_usd_per_proof=0.015, cost_basis="x")
    assert asked.revenue_usd_per_proof == pytest.approx(0.016) and not asked.paying
    assert asked.revenue_basis == "no paid proof in 24 h: the asked price 0.004 FIL"
    unknown = market_economics(MarketSnapshot(), usd_per_fil=4.0, min_margin=0.2, window_hours=24,
                               cost_usd_per_proof=0.015, cost_basis="x")
    assert unknown.revenue_usd_per_proof is None and not unknown.paying
    unreadable = market_economics(MarketSnapshot(paid_proofs=4, paid_atto=40 * MILLI, error="InsufficientPrivilege"),
                                  usd_per_fil=4.0, min_margin=0.2, window_hours=24, cost_usd_per_proof=0.015,
                                  cost_basis="x")
    assert not unreadable.paying and "could not be read" in unreadable.sentence()


# --- demand by its price ---------------------------------------------------------------------------------


def test_market_work_that_pays_grows_the_pool() -> None:
    reports = [serving("i-0", "rtx4090-0", BUSY), serving("i-1", "rtx4090-1", BUSY)]
    d = one(entry(2), reports, market_queue(5.0, waiting=8, running=2), at(57))  # 0.005 FIL = $0.020/proof
    # 2 busy + 8 tasks / (40/h x 20 min = 13.3 a machine) = 2.6 machine-equivalents, over target 0.8 -> 4.
    assert d.after == 4 and d.entry.direction == "up"
    assert d.entry.reason.startswith(
        "the oldest of 8 waiting Snark Market tasks has waited 27 min (scale_up_after 20 min) and the Snark Market "
        "pays $0.020/proof (mean of 10 paid proof(s) in 24 h: 0.005 FIL at $4/FIL) against the pool's $0.010/proof "
        "($1.00/h over 96 proofs/h measured on 2 machine(s)); with the 20% margin it must pay more than $0.012: "
        "it pays: 2.0 busy + 0.6 to clear the waiting tasks need 4 machines at target 0.80")
    market = d.signals.to_json(at(57))["market"]
    assert (market["paying"], market["served"], market["revenue_usd_per_proof"]) == (True, 10, 0.02)
    assert market["usd_per_proof"] == pytest.approx(0.0104, abs=1e-4)


def test_market_work_that_does_not_pay_grows_nothing_and_its_busy_machines_count_as_idle() -> None:
    busy = [serving(f"i-{i}", f"rtx4090-{i}", BUSY) for i in range(4)]
    # Four machines busy, all on market work paying 0.003 FIL = $0.012 < $0.0125: not demand.
    d = one(entry(4), busy, market_queue(3.0, waiting=8, running=4), at(57))
    assert (d.after, d.entry.direction) == (1, "down") and d.drain
    assert d.entry.reason.startswith("utilization 0.00 over 30 min (not counting 4.0 machines on unpaid Snark "
                                     "Market work) with no task waiting")
    # The same paying: they are demand (4 busy over target 0.8 -> 5).
    assert one(entry(4), busy, market_queue(5.0, waiting=0, running=4), at(57)).after == 5
    # Market tables unreadable: market work counts as not paying (its running tasks still come from harmony_task).
    d = one(entry(2), busy[:2], market_queue(5.0, running=2, error="InsufficientPrivilege: proofshare_meta"), at(57))
    assert d.after == 1 and "unpaid Snark Market work" in d.entry.reason


def test_market_tasks_are_never_the_operators_own_demand() -> None:
    """An empty pool with waiting market tasks that do not pay stays empty; paying ones grow it (never its own
    queue's numbers: `waiting` in status shows the PoRep queue only)."""
    spec = autoscaled_spec(MARKET_SPEC.replace("min: 1, max: 8", "min: 0, max: 8"))
    unpaid = market_queue(2.0, waiting=8, posted_min=10)
    (d,) = decide_all(apply_entries(spec, entry(0)), entry(0), [], {"rtx4090": unpaid}, at(57))
    assert d.after == 0 and d.signals.to_json(at(57))["queue"]["waiting"] == {"PoRep": 0}
    paying = market_queue(5.0, waiting=8, posted_min=10)
    (d,) = decide_all(apply_entries(spec, entry(0)), entry(0), [], {"rtx4090": paying}, at(57))
    assert d.after == 1  # 8 tasks = 0.6 machine-equivalents over target 0.8 -> 1


# --- the serving verdict: missed market deadlines ---------------------------------------------------------


def _miss(task: int, machine: str, end_min: float, *, late: bool = False, error: str | None = None,
          overdue: bool = False) -> MarketMiss:
    posted = at(end_min) - timedelta(minutes=50 if late or overdue else 5)
    return MarketMiss(task, machine, "10.1.0.1:12300", posted, at(end_min), late, error, overdue)


def test_a_machine_that_misses_market_deadlines_gets_a_serving_verdict_with_that_evidence() -> None:
    pool = SPEC.pool("rtx4090")
    report = serving("i-0", "rtx4090-0", BUSY)
    assert judge_market_deadlines(report, pool, [_miss(1, "i-0", 40, late=True)], at(57)) is None  # 1 < 2
    assert judge_market_deadlines(report, pool, [_miss(1, "i-9", 40, late=True), _miss(2, "i-9", 45, late=True)],
                                  at(57)) is None  # another machine's
    late = judge_market_deadlines(report, pool, [_miss(1, "i-0", 40, late=True), _miss(2, "i-0", 50, overdue=True)],
                                  at(57))
    assert late is not None and (late.verdict, late.blame, late.marks_bad) == (MARKET_DEADLINE, "machine", True)
    assert late.reason == ("market-deadline: serving: missed the Snark Market's 45 min deadline 2 times in 24 h "
                           "(2 late, 0 failed; >= 2 make a verdict): task 1 ended 50 min after it was posted")
    assert [m["task_id"] for m in late.evidence["market"]["misses"]] == [1, 2]
    # Failures whose error has a signature: the signature blames (our software: image, never the machine).
    ours = judge_market_deadlines(report, pool, [
        _miss(1, "i-0", 40, error="failed to compute proof: sppark::Error #-700"),
        _miss(2, "i-0", 45, error="failed to compute proof: sppark::Error #-700")], at(57))
    assert ours is not None and (ours.blame, ours.marks_bad, ours.signature) == ("image", False,
                                                                                "cuda-illegal-address")
    # Failures nobody explains: unknown, held, never marks bad (the breaker counts it).
    odd = judge_market_deadlines(report, pool, [_miss(1, "i-0", 40, error="failed to compute proof: boom"),
                                                _miss(2, "i-0", 45, error="failed to compute proof: boom")], at(57))
    assert odd is not None and (odd.blame, odd.marks_bad) == ("unknown", False)
    assert odd.signature is not None and odd.signature.startswith("market-deadline-unrecognized-serve")


def test_missed_deadlines_go_through_the_judge_like_every_serving_verdict() -> None:
    report = serving("i-0", "rtx4090-0", BUSY)
    misses = {"i-0": (_miss(1, "i-0", 40, late=True), _miss(2, "i-0", 50, late=True))}
    records = RecordSet(machines={})
    first = decide(SPEC, [report], records, [], DIGEST, at(57))  # admission: passes (50/h >= 40/h)
    records = RecordSet(machines=first.machine_records)
    d = decide(SPEC, [report], records, {"i-0"}, DIGEST, at(58), market_misses=misses)
    (verdict,) = d.verdicts
    assert verdict.verdict == MARKET_DEADLINE and verdict.machine_id == "m-i-0"
    assert ("Fleet-Serving-Instance", "i-0") in d.trailers()


# --- the views -----------------------------------------------------------------------------------------


def test_status_page_metrics_and_pr_comment_show_revenue_cost_break_even_and_proofs_served() -> None:
    from reconciler.domain.capacity import capacity_json
    from reconciler.render.markdown import render_plan_markdown

    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY) for i in range(2)]
    d = one(entry(2), reports, market_queue(5.0, running=2), at(57))
    spec = apply_entries(SPEC, {"rtx4090": d.entry})
    last_pass = {"at": "x", "headline": "nothing new", "capacity": [capacity_json(d, at(57))]}
    view = status_view(spec, RecordSet(machines={}), reports, at(57), last_pass=last_pass,
                       capacity_entries={"rtx4090": d.entry})
    line = ("Snark Market: revenue $0.020/proof, cost $0.010/proof (break-even $0.010, with margin $0.013); 10 "
            "market proofs served in 24 h; pays: counted as demand")
    assert f"      {line}\n" in render_text(view)
    assert line in render_html(view) and 'data-market-paying="yes"' in render_html(view)
    metrics = fleet_metrics(lambda: MetricsState(view)).exposition().decode()
    assert 'fleet_pool_market_revenue_usd_per_proof{pool="rtx4090"} 0.02' in metrics
    assert 'fleet_pool_market_proofs_served{pool="rtx4090"} 10.0' in metrics
    assert 'fleet_pool_market_paying{pool="rtx4090"} 1.0' in metrics
    assert 'fleet_pool_usd_per_proof{pool="rtx4090"} 0.0104' in metrics
    figures = {"revenue_usd_per_proof": 0.02, "usd_per_proof": 0.0104, "break_even_usd_per_proof": 0.0104,
               "threshold_usd_per_proof": 0.0125, "served": 10, "paying": True, "error": None, "min_margin": 0.2,
               "as_of": "2026-12-02T18:57:00Z"}
    row = {"pool": "rtx4090", "gpu": "RTX 4090", "desired": 5, "running": None, "bad_machines_known": 0,
           "probation_known": 0, "paused": False, "actions": {},
           "autoscaled": {"min": 1, "max": 8, "desired": 5, "usd_per_hour_at_min": 0.5, "usd_per_hour_at_max": 4.0,
                          "target_utilization": 0.8, "queue": ["PoRep"], "market": figures}}
    text = render_plan_markdown(pools=[row], actions=None, forecasts=[], image_digest=None, notes=[])
    assert ("| **rtx4090** | $0.020 | $0.010 | $0.010 | $0.013 | 10 | **yes** (pays) | 2026-12-02T18:57:00Z |"
            in text)


# --- prices from the marketplace (a fleet Pulumi runs has no slot state) -----------------------------------


def test_prices_come_from_the_slot_state_else_the_marketplaces_list_read_at_most_every_ttl() -> None:
    from reconciler.cli.surfaces import marketplace_prices, merged_prices
    from reconciler.domain.marketplace import InstanceRequest, Offer, TemporaryMarketplaceError
    from tests.fakes import FakeMarket

    offers = [Offer(offer_id=f"o-{i}", machine_id=f"m-{i}", host_id="h", gpu_name="RTX 4090", num_gpus=1,
                    price_usd_per_hour=price, reliability=0.99, inet_down_mbps=1000, disk_gb=500, cpu_ram_gb=256,
                    cuda_max_good=12.4, verified=True) for i, price in enumerate((0.31, 0.45, 0.2))]
    market = FakeMarket(offers)
    for i, label in enumerate(("gpu-fleet/main/rtx4090-0-aaaaaa", "gpu-fleet/main/rtx4090-1-bbbbbb", "someone-else")):
        market.create_instance(f"o-{i}", InstanceRequest(image="i", disk_gb=100, label=label))
    clock = [0.0]
    calls = [0]
    listed = market.list_instances

    def list_instances():  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 3:
            raise TemporaryMarketplaceError("503 from the market")
        return listed()

    market.list_instances = list_instances  # type: ignore[method-assign]
    read = marketplace_prices(market, ttl_s=300, clock=lambda: clock[0])
    assert read() == {"rtx4090-0-aaaaaa": 0.31, "rtx4090-1-bbbbbb": 0.45}  # not another fleet's label
    clock[0] = 200
    assert read() == {"rtx4090-0-aaaaaa": 0.31, "rtx4090-1-bbbbbb": 0.45} and calls[0] == 1  # cached
    clock[0] = 300
    read()
    clock[0] = 600
    assert read() == {"rtx4090-0-aaaaaa": 0.31, "rtx4090-1-bbbbbb": 0.45} and calls[0] == 3  # a failure keeps them
    merged = merged_prices(lambda: {"rtx4090-0-aaaaaa": 0.29}, read)
    assert merged is not None and merged() == {"rtx4090-0-aaaaaa": 0.29, "rtx4090-1-bbbbbb": 0.45}
    assert merged_prices(None, None) is None


def test_fleet_validate_says_what_a_market_proof_must_pay(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from reconciler.cli import main

    (tmp_path / "fleet.yaml").write_text(MARKET_SPEC)
    assert main(["validate", str(tmp_path / "fleet.yaml")]) == 0
    assert ("  pool rtx4090: Snark Market work counts as demand while a proof pays more than its measured $/proof + "
            "20% (at most $0.0150 = 0.00375 FIL at $4/FIL: max price over min rate)") in capsys.readouterr().out



def test_the_pr_comment_rows_carry_the_market_figures_of_the_leaders_last_decision() -> None:
    from reconciler.cli.plan import pool_rows
    from reconciler.render.markdown import render_plan_markdown

    reports = [serving(f"i-{i}", f"rtx4090-{i}", BUSY) for i in range(2)]
    d = one(entry(2), reports, market_queue(5.0, running=2), at(57))
    spec = apply_entries(SPEC, {"rtx4090": d.entry})
    (row,) = pool_rows(spec, RecordSet(machines={}), None, None, None, at(58), {"rtx4090": d.entry})
    market = row["autoscaled"]["market"]
    assert (market["revenue_usd_per_proof"], market["served"], market["paying"]) == (0.02, 10, True)
    assert market["as_of"] == "2026-12-02T18:57:00Z" and market["min_margin"] == 0.2
    text = render_plan_markdown(pools=[row], actions=None, forecasts=[], image_digest=None, notes=[])
    assert "| **rtx4090** | $0.020 | $0.010 | $0.010 | $0.013 | 10 | **yes** (pays) | 2026-12-02T18:57:00Z |" in text
