"""The live status: load (spec + records from the reconciler's clone, reports from the controller store, the
last pass, recent commits) -> `status_view` + surfaces' extras. Read by the live page, its fragment,
`/status.json` and `/metrics`, each request through one short-lived cache (`ttl_s`), so a browser refreshing
every few seconds plus a Prometheus scrape cost one load, not one each; records are parsed through a
`RecordCache` (only changed files re-parsed).

Observation failures never raise out of here: a broken spec or an unreadable store becomes a problem note on
the page (and `fleet_up 0` is only for a snapshot that could not be built at all).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from reconciler.adapters.capacity_files import capacity_entries
from reconciler.adapters.record_files import RecordCache, load_records
from reconciler.adapters.spec_files import load_spec
from reconciler.domain.observations import InstanceReport, format_time
from reconciler.domain.spec import SpecError
from reconciler.domain.status import FleetStatus, status_view
from reconciler.domain.surfaces import (
    CommitLine,
    LiveSnapshot,
    MarketView,
    MetricsState,
    PageExtras,
    pool_economics,
    recorded_verdict_counts,
)


class StatusStore(Protocol):
    def reports(self) -> Sequence[InstanceReport]: ...

    def stats(self) -> Mapping[str, int]: ...


@dataclass(frozen=True)
class LiveState:
    snapshot: LiveSnapshot
    metrics: MetricsState


class LiveStatusSource:
    def __init__(self, spec_dir: Path, store: StatusStore, *, desired_image_digest: str | None = None,
                 last_pass_file: Path | None = None,
                 commits: Callable[[], Sequence[CommitLine]] | None = None,
                 market: Callable[[], MarketView] | None = None,
                 prices: Callable[[], Mapping[str, float]] | None = None,
                 ttl_s: float = 2.0, now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 monotonic: Callable[[], float] = time.monotonic):
        self._spec_dir = spec_dir
        self._store = store
        self._digest = desired_image_digest
        self._last_pass_file = last_pass_file
        self._commits = commits
        self._market = market
        self._prices = prices
        self._ttl = ttl_s
        self._now = now
        self._monotonic = monotonic
        self._cache = RecordCache()
        self._lock = threading.Lock()
        self._state: tuple[float, LiveState] | None = None

    def set_desired_image_digest(self, digest: str | None) -> None:
        """A new image was rolled out (the demo): stale-image and pause checks follow it from the next load."""
        with self._lock:
            self._digest = digest
            self._state = None

    def state(self) -> LiveState:
        with self._lock:  # one load at a time; concurrent readers wait for and share it
            if self._state is not None and self._monotonic() - self._state[0] < self._ttl:
                return self._state[1]
            state = self._load()
            self._state = (self._monotonic(), state)
            return state

    def snapshot(self) -> LiveSnapshot:
        return self.state().snapshot

    def metrics_state(self) -> MetricsState:
        return self.state().metrics

    def _last_pass(self) -> Mapping[str, Any] | None:
        if self._last_pass_file is None:
            return None
        try:
            doc = json.loads(self._last_pass_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def _load(self) -> LiveState:
        now = self._now()
        notes: list[str] = []
        spec_file = self._spec_dir / "fleet.yaml"
        self._cache.begin()
        try:
            records = load_records(self._spec_dir, self._cache)
        finally:
            self._cache.end()
        reports: Sequence[InstanceReport] = ()
        ingested: Mapping[str, int] = {}
        try:
            reports = self._store.reports()
            stats = self._store.stats()
            ingested = {"registrations": stats.get("instances", 0), "events": stats.get("events", 0),
                        "results": stats.get("results", 0)}
        except Exception as exc:  # never a 500 and never a verdict: show it
            notes.append(f"observation failed, instances not shown: {type(exc).__name__}: {exc}")
        commits: tuple[CommitLine, ...] = ()
        if self._commits is not None:
            try:
                commits = tuple(self._commits())
            except Exception as exc:
                notes.append(f"git log unreadable: {type(exc).__name__}: {exc}")
        market = MarketView()
        if self._market is not None:
            try:
                market = self._market()
            except Exception as exc:
                notes.append(f"market view unreadable: {type(exc).__name__}: {exc}")
        orphans = market.orphans
        try:
            spec = load_spec(spec_file)
        except SpecError as exc:
            view = FleetStatus(at=format_time(now), pools=(), instances=(), suspects=(),
                               record_problems=records.problems, last_pass=self._last_pass(),
                               notes=(f"spec stalled: {exc}", *notes), desired_image_digest=self._digest)
            return LiveState(LiveSnapshot(view, PageExtras(commits=commits, orphans=orphans), str(spec_file)),
                             MetricsState(view, ingested=ingested))
        view = status_view(spec, records, reports, now, desired_image_digest=self._digest,
                           last_pass=self._last_pass(), notes=notes, capacity_entries=capacity_entries(spec, spec_file))
        prices = self._prices() if self._prices is not None else None
        economics = pool_economics(spec, records, view, prices)
        extras = PageExtras(economics=economics, commits=commits, orphans=orphans,
                            spend_cap_usd_per_hour=market.spend_cap_usd_per_hour)
        return LiveState(LiveSnapshot(view, extras, str(spec_file)),
                         MetricsState(view, economics, recorded_verdict_counts(records), ingested, market))
