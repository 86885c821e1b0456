"""The fleet status at fleet size: load (instance summaries from the store, recorded verdicts from the record
index) -> `triage` (pure: which instances need the operator, counts of the rest) -> load only the shown page
of reports in full -> `status_view`. Used by `fleet status` and the live page (and so `/metrics`), so both
show the same "needs attention" view with the same filters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from reconciler.domain.capacity import CapacityEntry
from reconciler.domain.observations import InstanceReport, InstanceSummary
from reconciler.domain.records import RecordSet
from reconciler.domain.spec import FleetSpec
from reconciler.domain.status import (
    FleetStatus,
    MarketStatus,
    StatusQuery,
    Triage,
    autoscaled_instances,
    machine_standings,
    recorded_for,
    status_view,
    triage,
)


class TriageStore(Protocol):
    """What the views read of the controller store: summaries of every instance, full reports of a few."""

    def instance_summaries(self) -> Sequence[InstanceSummary]: ...

    def reports_of(self, instance_ids: Sequence[str]) -> Sequence[InstanceReport]: ...


def triaged_view(spec: FleetSpec, records: RecordSet, summaries: Sequence[InstanceSummary],
                 reports_of: Callable[[list[str]], Sequence[InstanceReport]], now: datetime,
                 query: StatusQuery | None = None, *,
                 desired_image_digest: str | None = None, last_pass: Mapping[str, Any] | None = None,
                 notes: Sequence[str] = (), include_rates: bool = True,
                 market: MarketStatus | None = None,
                 capacity_entries: Mapping[str, CapacityEntry] | None = None) -> tuple[FleetStatus, Triage]:
    """`reports_of(instance_ids)`: the full reports of these instances (the store's `reports_of`): the shown
    page, and the autoscaled pools' alive instances (their utilization)."""
    standings = machine_standings(records, now)
    triaged = triage(spec, summaries, recorded_for(records, summaries), standings, now, query or StatusQuery())
    reports = reports_of(list(triaged.shown)) if triaged.shown else []
    autoscaled = autoscaled_instances(spec, summaries)
    view = status_view(spec, records, reports, now, desired_image_digest=desired_image_digest, last_pass=last_pass,
                       notes=notes, include_rates=include_rates, market=market, triaged=triaged, standings=standings,
                       capacity_entries=capacity_entries, capacity_reports=reports_of(autoscaled) if autoscaled else [])
    return view, triaged
