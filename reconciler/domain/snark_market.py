"""curio's Snark Market ("proofshare") as capacity and the serving verdicts see it, pure: what the market pays
per proof against what a pool's proofs cost, and the market deadlines a machine missed.

Place in the flow: `adapters.curio_queue` reads curio's tables (read-only) into a `MarketSnapshot` beside the
pool's queue; `domain.capacity` prices the pool's market demand with `market_economics` (market tasks count as
demand only while they pay by the pool's margin; never as the operator's own demand); `domain.serving.
judge_market_deadlines` turns a machine's missed deadlines into a serving verdict. No I/O, no clock.

How curio runs it (filecoin-project/curio at e0294b0f948132d41e8f42f59fa949495d5fd3af):
- With `EnableProofShare`, tasks/proofshare/task_request.go asks the market service for work while the
  cluster's own queue is idle (`ShouldHoldProofShare`), up to `RequestQueueHighWaterMark` = 8 queued requests,
  into `proofshare_queue`; tasks/proofshare/task_prove.go runs each as a `PSProve` harmony task.
- Each paid proof adds a row to `proofshare_provider_payments (provider_id, request_cid, payment_nonce,
  payment_cumulative_amount TEXT, ...)` (harmony/harmonydb/sql/20250115-proofshare.sql): the amount is
  cumulative per provider wallet in attoFIL, so one proof's pay is the difference from the previous nonce,
  as curio's UI computes it (web/api/webrpcporep/proofshare.go PSListQueue). Challenge proofs
  (`proofshare_queue.was_pow`, 20250620-proofshare-pow.sql) are unpaid.
- The provider's asked price is `proofshare_meta.pprice`, attoFIL per proof (PSSetMeta stores
  `abi.TokenAmount(types.ParseFIL(price)).String()`); the market may pay more, never less.
- documentation/en/experimental-features/Snark-Market.md: "Proofs must complete within 45 minutes, or your
  node will lose its active slot and need to re-earn trust"; a missed deadline costs 50 challenge proofs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconciler.domain.json_numbers import json_number
from reconciler.domain.observations import format_time

ATTO_PER_FIL = 10**18


@dataclass(frozen=True)
class MarketMiss:
    """One PSProve run that missed the market's deadline: it failed, or it ended later than the deadline after
    it was posted (curio's harmony_task_history row, with the curio node that ran it)."""

    task_id: int
    machine_name: str | None  # harmony_machine_details.machine_name: the worker's CURIO_NODE_NAME (instance id)
    host_and_port: str
    posted: datetime
    work_end: datetime
    succeeded: bool  # True: it ended, but late
    error: str | None  # curio's err text of a failed run
    overdue: bool = False  # still running past the deadline (harmony_task), not ended yet

    @property
    def minutes(self) -> float:
        return (self.work_end - self.posted).total_seconds() / 60

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "machine_name": self.machine_name, "host_and_port": self.host_and_port,
                "posted": format_time(self.posted), "work_end": format_time(self.work_end),
                "minutes": round(self.minutes, 1), "succeeded": self.succeeded, "error": self.error,
                "overdue": self.overdue}


@dataclass(frozen=True)
class MarketSnapshot:
    """The cluster's Snark Market work and pay, read from curio's tables in one pass."""

    waiting: int = 0  # PSProve harmony tasks without an owner
    running: int = 0  # PSProve harmony tasks claimed by a curio node
    oldest_waiting_at: datetime | None = None
    paid_proofs: int = 0  # paid proofs (payment rows) within the window
    paid_atto: int = 0  # what they paid together (sum of the per-nonce differences), attoFIL
    asked_atto: int | None = None  # proofshare_meta.pprice (None: not set or not readable)
    misses: tuple[MarketMiss, ...] = ()
    #: The market tables could not be read (no grant, no proofshare tables): the market counts as not paying.
    error: str | None = None

    def misses_of(self, machine_name: str) -> tuple[MarketMiss, ...]:
        return tuple(m for m in self.misses if m.machine_name == machine_name)


@dataclass(frozen=True)
class MarketEconomics:
    """What one pool's market proofs earn and cost, and whether market demand counts for it now."""

    revenue_usd_per_proof: float | None
    revenue_basis: str
    cost_usd_per_proof: float
    cost_basis: str
    min_margin: float
    served: int  # paid proofs within the window
    window_hours: float
    waiting: int
    running: int
    oldest_waiting_at: datetime | None
    error: str | None = None

    @property
    def break_even_usd_per_proof(self) -> float:
        """What a proof must pay to cover the pool's cost."""
        return self.cost_usd_per_proof

    @property
    def threshold_usd_per_proof(self) -> float:
        """What a proof must pay to count as demand: the cost plus the margin."""
        return self.cost_usd_per_proof * (1 + self.min_margin)

    @property
    def paying(self) -> bool:
        return self.error is None and self.revenue_usd_per_proof is not None and \
            self.revenue_usd_per_proof > self.threshold_usd_per_proof

    def sentence(self) -> str:
        """`the Snark Market pays $0.210/proof (...) against the pool's $0.110/proof (...); with the 20% margin
        it must pay more than $0.132: it pays`."""
        if self.error is not None:
            return f"the Snark Market's tables could not be read ({self.error}): market work does not count"
        cost = (f"the pool's ${self.cost_usd_per_proof:.3f}/proof ({self.cost_basis}); with the "
                f"{self.min_margin:.0%} margin it must pay more than ${self.threshold_usd_per_proof:.3f}")
        if self.revenue_usd_per_proof is None:
            return (f"the Snark Market's pay is unknown ({self.revenue_basis}) against {cost}: market work does not "
                    "count")
        verdict = "it pays" if self.paying else "it does not pay: market work does not count"
        return (f"the Snark Market pays ${self.revenue_usd_per_proof:.3f}/proof ({self.revenue_basis}) against "
                f"{cost}: {verdict}")

    def to_json(self, now: datetime) -> dict[str, Any]:
        return {"revenue_usd_per_proof": _round(self.revenue_usd_per_proof), "revenue_basis": self.revenue_basis,
                "usd_per_proof": _round(self.cost_usd_per_proof), "cost_basis": self.cost_basis,
                "break_even_usd_per_proof": _round(self.break_even_usd_per_proof),
                "threshold_usd_per_proof": _round(self.threshold_usd_per_proof), "min_margin": self.min_margin,
                "paying": self.paying, "served": self.served, "window_hours": self.window_hours,
                "waiting": self.waiting, "running": self.running, "error": self.error,
                "oldest_wait_min": None if self.oldest_waiting_at is None
                else round((now - self.oldest_waiting_at).total_seconds() / 60, 1)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass(frozen=True)
class MachineCost:
    """A serving machine's price and measured rate (the pool's cost per proof is made of them)."""

    usd_per_hour: float
    proofs_per_hour: float


def pool_cost_per_proof(machines: Sequence[MachineCost], max_price_usd_per_hour: float,
                        min_rate_proofs_per_hour: float) -> tuple[float, str]:
    """The pool's $/proof: what its serving machines cost per hour over what they prove per hour (measured);
    without a measured machine, its max price over its min rate (an upper bound)."""
    measured = [m for m in machines if m.proofs_per_hour > 0]
    if measured:
        usd = sum(m.usd_per_hour for m in measured)
        rate = sum(m.proofs_per_hour for m in measured)
        return usd / rate, f"${usd:.2f}/h over {rate:.0f} proofs/h measured on {len(measured)} machine(s)"
    if min_rate_proofs_per_hour <= 0:
        return float("inf"), "no machine measured and no minimum rate"
    return (max_price_usd_per_hour / min_rate_proofs_per_hour,
            f"no machine measured: max price ${max_price_usd_per_hour:g}/h over min {min_rate_proofs_per_hour:g}/h")


def market_economics(snapshot: MarketSnapshot, *, usd_per_fil: float, min_margin: float, window_hours: float,
                     cost_usd_per_proof: float, cost_basis: str) -> MarketEconomics:
    """Revenue per proof: the mean pay of the paid proofs within the window; without any, the asked price (the
    market pays at least that); converted at the operator's `usd_per_fil`."""
    if snapshot.paid_proofs > 0:
        fil = snapshot.paid_atto / snapshot.paid_proofs / ATTO_PER_FIL
        revenue: float | None = fil * usd_per_fil
        basis = (f"mean of {snapshot.paid_proofs} paid proof(s) in {window_hours:g} h: {fil:.6g} FIL at "
                 f"${usd_per_fil:g}/FIL")
    elif snapshot.asked_atto:
        fil = snapshot.asked_atto / ATTO_PER_FIL
        revenue, basis = fil * usd_per_fil, f"no paid proof in {window_hours:g} h: the asked price {fil:.6g} FIL"
    else:
        revenue, basis = None, f"no paid proof in {window_hours:g} h and no asked price"
    return MarketEconomics(revenue, basis, cost_usd_per_proof, cost_basis, min_margin, snapshot.paid_proofs,
                           window_hours, snapshot.waiting, snapshot.running, snapshot.oldest_waiting_at,
                           snapshot.error)


def economics_from_json(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The figures a view shows from a pass's (or capacity.yaml's) market JSON, unknown ones as None."""
    def num(key: str) -> float | None:
        return json_number(doc.get(key))

    return {"revenue_usd_per_proof": num("revenue_usd_per_proof"), "usd_per_proof": num("usd_per_proof"),
            "break_even_usd_per_proof": num("break_even_usd_per_proof"),
            "threshold_usd_per_proof": num("threshold_usd_per_proof"),
            "served": int(doc["served"]) if isinstance(doc.get("served"), int) else None,
            "paying": doc.get("paying") is True, "error": doc.get("error") if isinstance(doc.get("error"), str)
            else None, "window_hours": num("window_hours")}
