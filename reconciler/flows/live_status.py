"""The live status: load (spec + records from the reconciler's clone, instance summaries from the controller
store, the last pass, recent commits) -> `triage` -> the shown page of reports -> `status_view` + surfaces'
extras. Read by the live page, its fragment, `/status.json` and `/metrics`, each request through one
short-lived cache (`ttl_s`), so a browser refreshing every few seconds plus a Prometheus scrape cost one load,
not one each; records are parsed through a `RecordCache` (only changed files re-parsed).

At 10,000 instances the page shows what `fleet status` shows: the instances that need the operator, a page at
a time, with the same filters (`snapshot(query)`); `/metrics` counts every instance from the triage (no full
report is loaded for it).

Observation failures never raise out of here: a broken spec or an unreadable store becomes a problem note on
the page (and `fleet_up 0` is only for a snapshot that could not be built at all).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from reconciler.adapters.capacity_files import capacity_entries
from reconciler.adapters.record_files import RecordCache, load_records
from reconciler.adapters.spec_files import load_spec_cached
from reconciler.domain.capacity import CapacityEntry
from reconciler.domain.observations import InstanceReport, InstanceSummary, format_time
from reconciler.domain.records import RecordedVerdict, RecordSet
from reconciler.domain.spec import FleetSpec, SpecError
from reconciler.domain.status import (
    PAGE_SIZE,
    FleetStatus,
    StatusQuery,
    autoscaled_instances,
    machine_standings,
    recorded_for,
    status_view,
    triage,
)
from reconciler.domain.surfaces import (
    CommitLine,
    LiveSnapshot,
    MarketView,
    MetricsState,
    PageExtras,
    recorded_verdict_counts,
    triage_economics,
)

log = logging.getLogger(__name__)


class StatusStore(Protocol):
    def instance_summaries(self) -> Sequence[InstanceSummary]: ...

    def reports_of(self, instance_ids: Sequence[str]) -> Sequence[InstanceReport]: ...

    def stats(self) -> Mapping[str, int]: ...


#: The page's default: the instances that need the operator, a page of them.
DEFAULT_QUERY = StatusQuery(per_page=PAGE_SIZE)


@dataclass(frozen=True)
class _Loaded:
    """One load of everything but the shown page: what each query's view is built from."""

    now: datetime
    spec: FleetSpec | None
    spec_error: str | None
    records: RecordSet
    summaries: Sequence[InstanceSummary]
    recorded: Mapping[str, RecordedVerdict]
    standings: Mapping[str, str]
    notes: tuple[str, ...]
    extras: PageExtras
    last_pass: Mapping[str, Any] | None
    ingested: Mapping[str, int]
    market: MarketView
    capacity_entries: Mapping[str, CapacityEntry]
    capacity_reports: Sequence[InstanceReport]  # the autoscaled pools' alive instances, in full


@dataclass(frozen=True)
class LiveState:
    snapshot: LiveSnapshot
    metrics: MetricsState
    loaded: _Loaded | None = None


class LiveStatusSource:
    def __init__(self, spec_dir: Path, store: StatusStore, *, desired_image_digest: str | None = None,
                 last_pass_file: Path | None = None,
                 commits: Callable[[], Sequence[CommitLine]] | None = None,
                 market: Callable[[], MarketView] | None = None,
                 prices: Callable[[], Mapping[str, float]] | None = None,
                 ttl_s: float = 2.0, now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 monotonic: Callable[[], float] = time.monotonic, refresh_in_background: bool = False):
        """`refresh_in_background`: a request that finds the state older than `ttl_s` is answered from it at once
        while one background thread loads the next (the served process's setting: at 10,000 instances a load
        takes longer than a page may). Without it (tests, one-shot callers) the request waits for the load."""
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
        self._queried: dict[StatusQuery, LiveSnapshot] = {}  # other queries' snapshots of the current state
        self._background = refresh_in_background
        self._refreshing = False
        self._generation = 0  # bumped when what a load depends on changes: a load begun before is dropped

    def set_desired_image_digest(self, digest: str | None) -> None:
        """A new image was rolled out (the demo): stale-image and pause checks follow it from the next load."""
        with self._lock:
            self._digest = digest
            self._state = None
            self._generation += 1

    def state(self) -> LiveState:
        with self._lock:  # one load at a time; concurrent readers wait for and share it
            return self._current()

    def _current(self) -> LiveState:
        """The state (under self._lock): fresh, or stale while a background load runs, or loaded now."""
        if self._state is not None and self._monotonic() - self._state[0] < self._ttl:
            return self._state[1]
        if self._state is not None and self._background:
            if not self._refreshing:
                self._refreshing = True
                threading.Thread(target=self._refresh, name="live-status-refresh", daemon=True).start()
            return self._state[1]
        state = self._load()
        self._state = (self._monotonic(), state)
        self._queried = {}
        return state

    def _refresh(self) -> None:
        with self._lock:
            generation = self._generation
        try:
            state = self._load()  # outside the lock: requests keep being answered from the current state
        except Exception:  # _load turns observation failures into notes; anything else: keep the old state
            log.exception("live status: loading the fleet state failed; the page keeps the previous one")
            state = None
        with self._lock:
            if state is not None and generation == self._generation:
                self._state = (self._monotonic(), state)
                self._queried = {}
            self._refreshing = False

    def snapshot(self, query: StatusQuery | None = None) -> LiveSnapshot:
        """The default view (what needs the operator, first page), or the view of `query` (filters, a page,
        --all) built from the same load: only the shown page of reports is read for it."""
        with self._lock:
            state = self._current()
            if query is None or query == DEFAULT_QUERY or state.loaded is None:
                return state.snapshot
            snap = self._queried.get(query)
            if snap is None:
                if len(self._queried) >= 32:  # a bounded memo: one entry per filter/page someone looked at
                    self._queried.pop(next(iter(self._queried)))
                snap = self._queried[query] = self._view(state.loaded, query)[0]
            return snap

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
        summaries: Sequence[InstanceSummary] = ()
        ingested: Mapping[str, int] = {}
        try:
            summaries = self._store.instance_summaries()
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
        extras = PageExtras(commits=commits, orphans=market.orphans,
                            spend_cap_usd_per_hour=market.spend_cap_usd_per_hour)
        try:
            spec, spec_error = load_spec_cached(spec_file), None
        except SpecError as exc:
            spec, spec_error = None, str(exc)
        standings = machine_standings(records, now)
        entries: Mapping[str, CapacityEntry] = {}
        capacity_reports: Sequence[InstanceReport] = ()
        if spec is not None:
            entries = capacity_entries(spec, spec_file)
            autoscaled = autoscaled_instances(spec, summaries)
            if autoscaled:  # utilization needs their heartbeats: full reports of those pools only
                try:
                    capacity_reports = self._store.reports_of(autoscaled)
                except Exception as exc:
                    notes.append(f"observation failed, capacity not shown: {type(exc).__name__}: {exc}")
        loaded = _Loaded(now, spec, spec_error, records, summaries, recorded_for(records, summaries), standings,
                         tuple(notes), extras, self._last_pass(), ingested, market, entries, capacity_reports)
        snapshot, metrics = self._view(loaded, DEFAULT_QUERY)
        assert metrics is not None
        return LiveState(snapshot, metrics, loaded)

    def _view(self, loaded: _Loaded, query: StatusQuery) -> tuple[LiveSnapshot, MetricsState | None]:
        spec_file = str(self._spec_dir / "fleet.yaml")
        if loaded.spec is None:
            view = FleetStatus(at=format_time(loaded.now), pools=(), instances=(), suspects=(),
                               record_problems=loaded.records.problems, last_pass=loaded.last_pass,
                               notes=(f"spec stalled: {loaded.spec_error}", *loaded.notes),
                               desired_image_digest=self._digest)
            return LiveSnapshot(view, loaded.extras, spec_file), MetricsState(view, ingested=loaded.ingested)
        triaged = triage(loaded.spec, loaded.summaries, loaded.recorded, loaded.standings, loaded.now, query)
        reports: Sequence[InstanceReport] = ()
        notes = loaded.notes
        if triaged.shown:
            try:
                reports = self._store.reports_of(list(triaged.shown))
            except Exception as exc:  # the summaries were read; the page of reports was not
                notes = (*notes, f"observation failed, instances not shown: {type(exc).__name__}: {exc}")
        view = status_view(loaded.spec, loaded.records, reports, loaded.now, desired_image_digest=self._digest,
                           last_pass=loaded.last_pass, notes=notes, triaged=triaged, standings=loaded.standings,
                           capacity_entries=loaded.capacity_entries, capacity_reports=loaded.capacity_reports)
        prices = self._prices() if self._prices is not None else None
        economics = triage_economics(loaded.spec, loaded.summaries, loaded.recorded, triaged, prices,
                                     loaded.records.last_prices())
        extras = replace(loaded.extras, economics=economics)
        metrics = None
        if query == DEFAULT_QUERY:
            metrics = MetricsState(view, economics, recorded_verdict_counts(loaded.records), loaded.ingested,
                                   loaded.market, instance_states=triaged.state_counts)
        return LiveSnapshot(view, extras, spec_file), metrics
