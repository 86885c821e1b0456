"""Wires the operator surfaces into a process that serves the controller (`fleet reconcile --listen`, the demo):
the live status page at `/` and `/metrics` as extra routes of the controller's app, the loop's metrics and the
webhooks fed after every pass.

Settings (environment, through reconciler.adapters.settings; tokens and URLs are secrets, never printed):
  FLEET_READ_TOKEN     read-only token for the page and /metrics (optional; the admin token works too)
  FLEET_WEBHOOK_URL, FLEET_WEBHOOK_<NAME>_URL (+ _FORMAT, _EVENTS): see reconciler/adapters/webhooks.py
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from starlette.routing import BaseRoute

from reconciler.adapters.settings import ADMIN_TOKEN_ENV, READ_TOKEN_ENV, named_secret, webhook_environment
from reconciler.adapters.webhooks import WebhookConfigError, WebhookNotifier, WebhookTarget, targets_from_env
from reconciler.domain.events import (
    EVENT_KINDS,
    FleetEvent,
    breaker_event,
    orphan_destroyed_event,
    spend_cap_event,
    verdict_event,
)
from reconciler.domain.marketplace import Marketplace, MarketplaceError
from reconciler.domain.spec import NotificationSettings
from reconciler.domain.surfaces import CommitLine, MarketView
from reconciler.flows.judge import PassResult
from reconciler.flows.live_status import LiveStatusSource, StatusStore
from reconciler.render.live import ReadAccess, SessionStore, StatusRoutes, install_access_log_redaction
from reconciler.render.metrics import FleetMetrics, fleet_metrics

#: The root of every fleet's marketplace labels (`domain.spec.fleet_label_prefix`: `gpu-fleet/<fleet>/<instance id>`).
LABEL_ROOT = "gpu-fleet/"


class SurfacesConfigError(ValueError):
    pass


@dataclass
class Surfaces:
    routes: list[BaseRoute]
    metrics: FleetMetrics
    source: LiveStatusSource
    notifier: WebhookNotifier | None = None
    notified: list[FleetEvent] = field(default_factory=list)  # what this process queued (tests, the demo)
    note: str | None = None  # why the page is off, when it is

    def on_pass(self, result: PassResult) -> None:
        """After every reconcile pass: count it, and tell the webhooks what reached origin."""
        self.metrics.loop.observe_pass(result, result.publish_seconds, len(result.breaker_trips))
        if not (result.commit and result.pushed):
            return  # nothing the audit trail shows yet: say nothing (the next pass recomputes it)
        events = [verdict_event(v) for v in result.verdicts if v.machine_id]
        events += [breaker_event(r, result.at) for r in result.breaker_trips]
        self.notify(events)

    def notify(self, events: Sequence[FleetEvent]) -> None:
        self.notified.extend(events)
        if self.notifier is not None:
            for event in events:
                self.notifier.notify(event)

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.stop()


def build_surfaces(*, spec_dir: Path, store: StatusStore, admin_token: str | None, read_token: str | None,
                   desired_image_digest: str | None, last_pass_file: Path | None,
                   commits: Callable[[], Sequence[CommitLine]] | None = None,
                   market: Callable[[], MarketView] | None = None,
                   prices: Callable[[], Mapping[str, float]] | None = None,
                   refresh_s: float = 5.0, metrics_open: bool = False, open_reads: bool = False,
                   webhook_targets: Sequence[WebhookTarget] = (), secure_cookie: bool = False,
                   sessions: SessionStore | None = None,
                   notifier_options: Mapping[str, Any] | None = None) -> Surfaces:
    if refresh_s <= 0:
        raise SurfacesConfigError(f"--status-refresh must be > 0 seconds, got {refresh_s:g}")
    tokens = tuple(t for t in (read_token, admin_token) if t)
    source = LiveStatusSource(spec_dir, store, desired_image_digest=desired_image_digest,
                              last_pass_file=last_pass_file, commits=commits, market=market,
                              prices=prices, refresh_in_background=True)
    metrics = fleet_metrics(source.metrics_state)
    routes: list[BaseRoute] = []
    note = None
    if tokens or open_reads:
        access = ReadAccess(tokens, open_reads=open_reads, secure_cookie=secure_cookie, sessions=sessions)
        routes = list(StatusRoutes(source.snapshot, access, metrics=metrics, refresh_s=refresh_s,
                                   metrics_open=metrics_open).routes())
        install_access_log_redaction()
    else:
        note = (f"status page and /metrics off: set ${READ_TOKEN_ENV} (read-only) or ${ADMIN_TOKEN_ENV} "
                "to let someone read them")
    notifier = None
    if webhook_targets:
        notifier = WebhookNotifier(webhook_targets, **dict(notifier_options or {})).start()
    return Surfaces(routes, metrics, source, notifier, note=note)


def webhook_targets(notifications: NotificationSettings | None = None,
                    environ: Mapping[str, str] | None = None) -> tuple[list[WebhookTarget], list[str]]:
    """Targets from the environment (FLEET_WEBHOOK_*) and from the spec's `notifications.webhooks` (each names
    the variable holding its URL), and notes for spec targets whose variable is not set (they stay off)."""
    targets = targets_from_env(webhook_environment(environ))
    notes = []
    for hook in notifications.webhooks if notifications is not None else ():
        url = named_secret(hook.url_env, environ)
        if url is None:
            notes.append(f"webhook {hook.name} (spec): ${hook.url_env} is not set; it stays off")
            continue
        kinds = frozenset(hook.events) if hook.events else frozenset(EVENT_KINDS)
        try:
            targets.append(WebhookTarget(hook.name, url.reveal(), hook.format, kinds))
        except WebhookConfigError as exc:
            raise WebhookConfigError(f"notifications.webhooks {hook.name} (${hook.url_env}): {exc}") from None
    return targets, notes


def slot_prices(state_dir: Path) -> Callable[[], Mapping[str, float]]:
    """Instance -> $/h from the provisioner's slot state (`fleet apply --state-dir`), read on each call."""
    from reconciler.adapters.slot_provider import SLOT_STATE_FILE, load_slot_state

    def read() -> Mapping[str, float]:
        path = state_dir / SLOT_STATE_FILE
        if not path.is_file():
            return {}
        return {o.instance_id: o.price_usd_per_hour for o in load_slot_state(path).values()}

    return read


#: How long the marketplace's prices are reused between reads (a list of every instance: once per pass would be
#: a read every 30 s for a number that changes when an instance is rented).
MARKET_PRICES_TTL_S = 300.0


def marketplace_prices(market: Marketplace, *, ttl_s: float = MARKET_PRICES_TTL_S,
                       clock: Callable[[], float] = time.monotonic) -> Callable[[], Mapping[str, float]]:
    """Instance -> $/h from the marketplace's own list of instances (each carries this fleet's label
    `gpu-fleet/<fleet>/<instance id>` and its price), read at most every `ttl_s`. A failed read keeps the last
    prices: an unknown price only makes the pool's max price stand in, never a decision of its own."""
    cache: dict[str, Any] = {"at": None, "prices": {}}

    def read() -> Mapping[str, float]:
        if cache["at"] is None or clock() - cache["at"] >= ttl_s:
            cache["at"] = clock()
            try:
                instances = market.list_instances()
            except MarketplaceError:
                return dict(cache["prices"])
            cache["prices"] = {i.label.rsplit("/", 1)[1]: i.price_usd_per_hour for i in instances
                               if i.label and i.label.startswith(LABEL_ROOT) and i.price_usd_per_hour is not None}
        return dict(cache["prices"])

    return read


def merged_prices(*sources: Callable[[], Mapping[str, float]] | None) -> Callable[[], Mapping[str, float]] | None:
    """One price source from several, the first that prices an instance winning (the slot state, then the
    marketplace); None without any."""
    given = [s for s in sources if s is not None]
    if not given:
        return None

    def read() -> Mapping[str, float]:
        out: dict[str, float] = {}
        for source in reversed(given):
            out.update(source())
        return out

    return read


def market_view(state_dir: Path) -> Callable[[], MarketView]:
    """The provisioner's last view of the market in `state_dir` (orphans, spend cap), read on each call."""
    from reconciler.adapters.market_view import read_market_view

    return lambda: read_market_view(state_dir)


def provisioner_events(report: Any, spec: Any, now: datetime) -> list[FleetEvent]:
    """What one provisioner run (`fleet apply`, the demo) tells the webhooks: every orphan or duplicate it
    destroyed, and the fleet spend cap holding slots empty (one event per cap and day: receivers drop the
    repeats of later runs by the Idempotency-Key)."""
    events = [orphan_destroyed_event(o.contract_id, now, label=o.label, usd_per_hour=o.price_usd_per_hour,
                                     reason=f"{o.kind}: {o.why}") for o in report.destroyed]
    cap = getattr(spec, "max_total_dph", None)
    if report.plan.capped and cap is not None:
        planned = sum(o.price_usd_per_hour for o in report.slots.values())
        events.append(spend_cap_event(planned, cap, now, since=f"{cap:g}@{now:%Y-%m-%d}"))
    return events


def notify_once(events: Sequence[FleetEvent], targets: Sequence[WebhookTarget], *, timeout_s: float = 30.0) -> int:
    """Deliver from a one-shot command: retries until `timeout_s`, then gives up; returns what is left."""
    if not events or not targets:
        return 0
    notifier = WebhookNotifier(targets)
    try:
        for event in events:
            notifier.notify(event)
        return notifier.flush(timeout_s)
    finally:
        notifier.stop()
