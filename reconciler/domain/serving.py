"""After admission, pure: heartbeats, rolling rate, the serving verdicts (degraded, lost), the early verdict
during a benchmark, directives for workers, and record expiry/probation.

Place in the flow: `domain.judging.decide` calls `judge_early` for benchmarks still running and
`judge_serving` for instances that passed and serve; `directives` tells each worker what the records say
(serve, stop, wait) and `flows.judge` hands them to the controller store; `entry_expiry` stamps a bad
verdict with its expiry by blame class. No I/O, no clock: `now` is an argument.

What the worker sends (worker-image/serve.sh, protocol v1 `serve` `progress` events):
`details.heartbeat = {seq, interval_s, completed, failed, busy, recent_proof_s, gpus: [...], ...}`; the
counts are deltas of the daemon's own counters (`cuzk-bench status`) since the previous heartbeat, `busy`
says work was queued or in progress at the heartbeat (an idle daemon says nothing about its speed).

Rolling rate: proofs completed over the busy time of the heartbeat intervals that end within the window (an
interval is busy when the daemon was busy at both of its ends). It is judged only when a machine at the
pool minimum would have done `min_proofs` proofs in that busy time, so one slow proof is never a verdict.
Degraded: at every heartbeat for `degraded_after_minutes`, the rolling rate was judged and below
min x (1 - margin). Lost: no heartbeat for `lost_after_minutes` while the controller heard from other
machines (silence everywhere is more likely our own outage: held, never a verdict; after such an outage the
clock starts when the controller hears the fleet again, as workers come back seconds apart); blamed on the
marketplace unless the worker's last words carry a signature (e.g. an Xid: machine).
"""

from __future__ import annotations

import heapq
import math
import re
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from reconciler.domain.observations import InstanceReport, format_time
from reconciler.domain.quick_init import quick_init
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordSet
from reconciler.domain.redact import redact_line, redact_lines
from reconciler.domain.signatures import classify
from reconciler.domain.snark_market import MarketMiss
from reconciler.domain.spec import EarlyVerdictSettings, PoolSpec, RecordExpirySettings, ServingSettings
from reconciler.domain.verdict import EVIDENCE_LOG_LINES, NOT_RECOGNISED, Verdict, unrecognized_signature

DEGRADED = "degraded"
LOST = "lost"
MARKET_DEADLINE = "market-deadline"
EARLY = "early-below-min-rate"
SERVING_VERDICTS = (DEGRADED, LOST, MARKET_DEADLINE)

#: Blames for which a serving/early verdict marks the machine bad (the rest are recorded only).
_MARKS_BAD = ("machine", "marketplace")


# --- heartbeats ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat:
    at: datetime
    seq: int | None
    interval_s: float | None
    completed: int | None
    failed: int | None
    busy: bool
    recent_proof_s: float | None = None
    status_error: str | None = None
    gpus: tuple[Mapping[str, Any], ...] = ()


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def heartbeats(report: InstanceReport, reach: timedelta | None = None) -> list[Heartbeat]:
    """The heartbeats of a serving worker, oldest first; malformed details are skipped, never fatal.

    `reach`: only those at most this long before the newest heartbeat (read from the end: the store keeps
    up to 1,000 progress events per instance and every pass looks at every serving instance)."""
    out = []
    newest: datetime | None = None
    for e in reversed(report.events):
        hb = e.details.get("heartbeat") if e.phase == "serve" else None
        if not isinstance(hb, Mapping):
            continue
        if reach is not None:
            newest = newest or e.at
            if e.at < newest - reach:
                break
        gpus = hb.get("gpus")
        out.append(Heartbeat(
            at=e.at, seq=_int(hb.get("seq")), interval_s=_num(hb.get("interval_s")),
            completed=_int(hb.get("completed")), failed=_int(hb.get("failed")), busy=hb.get("busy") is True,
            recent_proof_s=_num(hb.get("recent_proof_s")),
            status_error=hb.get("status_error") if isinstance(hb.get("status_error"), str) else None,
            gpus=tuple(g for g in gpus if isinstance(g, Mapping))[:16] if isinstance(gpus, list) else ()))
    out.sort(key=lambda h: h.at)
    return out


@dataclass(frozen=True)
class RollingRate:
    """Proofs over busy time in one window ending at `end`."""

    end: datetime
    completed: int
    failed: int
    busy_s: float
    judged: bool  # enough busy time for `min_proofs` at the pool minimum

    @property
    def proofs_per_hour(self) -> float | None:
        return self.completed * 3600.0 / self.busy_s if self.busy_s > 0 else None


def rolling_rate(beats: Sequence[Heartbeat], end: datetime, window: timedelta, min_rate: float,
                 min_proofs: int) -> RollingRate:
    completed = failed = 0
    busy_s = 0.0
    previous: Heartbeat | None = None
    for hb in beats:
        if hb.at > end:
            break
        if (end - hb.at) < window and previous is not None and previous.busy and hb.busy \
                and hb.interval_s and hb.completed is not None:
            completed += hb.completed
            failed += hb.failed or 0
            busy_s += hb.interval_s
        previous = hb
    needed_s = min_proofs * 3600.0 / min_rate if min_rate > 0 else math.inf
    return RollingRate(end, completed, failed, busy_s, busy_s >= needed_s)


@dataclass(frozen=True)
class ServingHealth:
    """What status shows for one serving instance."""

    instance_id: str
    last_heartbeat: datetime | None
    rate: RollingRate | None
    min_rate: float
    below_since: datetime | None  # start of the current run of judged-and-below heartbeats
    gpus: tuple[Mapping[str, Any], ...] = ()

    @property
    def proofs_per_hour(self) -> float | None:
        return self.rate.proofs_per_hour if self.rate and self.rate.judged else None

    def describe(self, now: datetime) -> str:
        beat = f"last heartbeat {_ago(now, self.last_heartbeat)}" if self.last_heartbeat else "no heartbeat yet"
        if self.rate is None or not self.rate.judged:
            rate = "rate not judged yet (too little busy time)"
        else:
            rate = f"{self.rate.proofs_per_hour:.1f}/h vs min {self.min_rate:g}/h"
        below = f", below since {format_time(self.below_since)}" if self.below_since else ""
        return f"{rate}{below}; {beat}"


def _ago(now: datetime, then: datetime) -> str:
    s = max(0, int((now - then).total_seconds()))
    return f"{s}s ago" if s < 120 else f"{s // 60} min ago" if s < 7200 else f"{s // 3600} h ago"


def health_reach(settings: ServingSettings) -> timedelta:
    """How far back from the newest heartbeat `serving_health` reads (the heartbeats that can matter)."""
    return timedelta(minutes=settings.degraded_after_minutes + 2 * settings.heartbeat_minutes + settings.window_minutes)


def serving_health(report: InstanceReport, pool: PoolSpec, settings: ServingSettings) -> ServingHealth:
    """Rolling rate at the newest heartbeat, and since when it has been below the threshold.

    Only the heartbeats that can matter are evaluated (the last `degraded_after` plus one heartbeat, each
    over its window): a store keeps up to 1,000 progress events per instance, and every pass judges every
    serving instance, so this stays O(heartbeats in a window x heartbeats in the period), not quadratic
    in the history. `below_since` therefore reaches back at most that far."""
    window = timedelta(minutes=settings.window_minutes)
    period = timedelta(minutes=settings.degraded_after_minutes + settings.heartbeat_minutes)
    beats = heartbeats(report, reach=health_reach(settings))
    threshold = pool.min_rate_proofs_per_hour * (1 - settings.degraded_margin)
    rate = None
    below_since: datetime | None = None
    if beats:
        first_point = beats[-1].at - period
    for hb in beats:
        if hb.at < first_point:
            continue
        r = rolling_rate(beats, hb.at, window, pool.min_rate_proofs_per_hour, settings.min_proofs)
        pph = r.proofs_per_hour
        below = r.judged and pph is not None and pph < threshold
        below_since = (below_since or hb.at) if below else None
        rate = r
    return ServingHealth(report.instance_id, beats[-1].at if beats else None, rate,
                         pool.min_rate_proofs_per_hour, below_since, beats[-1].gpus if beats else ())


def is_serving(report: InstanceReport) -> bool:
    """The worker entered serve and has not said it stopped."""
    return report.first("serve", "started") is not None and report.first("serve", "done") is None \
        and report.destroyed_at is None


def signal_times(report: InstanceReport) -> list[datetime]:
    """Every time the controller heard this worker (registration, events, result), unordered. The store stamps
    events with their arrival (its own clock), so heartbeats a worker queued during an outage and flushed
    afterwards all carry the time they arrived, not the time the worker wrote them."""
    times = [report.registered_at, *(e.at for e in report.events)]
    if report.result is not None:
        times.append(report.result.at)
    return times


def last_signal(report: InstanceReport) -> datetime:
    """The newest time the controller heard this worker (event or result)."""
    return max(signal_times(report))


def fleet_heard_again(reports: Iterable[InstanceReport], silence: timedelta, since: datetime) -> datetime | None:
    """When the controller heard the fleet again after its newest fleet-wide silence longer than `silence` that
    ended after `since` (nobody heard at all: most likely our own outage); None if there was none.

    After an outage the workers come back one by one, seconds apart, as each flushes its queue: a worker not
    yet back has been silent since the outage began, but its silence only says something about it once the
    controller has been hearing the fleet again for `lost_after_minutes`. `since`: the oldest last signal of a
    silent worker (older silences cannot matter); each report's signals are read from its newest back to the
    first one before `since` (events are in arrival order, as `heartbeats` reads them), so a pass costs the
    signals of the last few minutes, not the whole store."""
    gap = fleet_silence(_signals_since(reports, since), silence, since)
    return gap[1] if gap is not None else None


def _signals_since(reports: Iterable[InstanceReport], since: datetime) -> list[datetime]:
    """Every report's registration and result, and its events from the newest back to the first one before
    `since` (the start of a silence that ends after `since`)."""
    times: list[datetime] = []
    for r in reports:
        times.append(r.registered_at)
        if r.result is not None:
            times.append(r.result.at)
        for e in reversed(r.events):
            times.append(e.at)
            if e.at < since:
                break
    return times


def fleet_silence(times: Iterable[datetime], silence: timedelta,
                  since: datetime) -> tuple[datetime, datetime] | None:
    """(start, end) of the newest gap longer than `silence` between signal `times` that ended after `since`."""
    found = None
    for older, newer in pairwise(sorted(set(times))):
        if newer > since and newer - older > silence:
            found = (older, newer)
    return found


#: What a worker's silence past `lost_after_minutes` means (`silence`): lost (the controller heard others since),
#: or unheard (nobody was heard since: most likely our own outage, never evidence against the machine):
#: `silent_state`.
SILENT_LOST = "lost"
SILENT_UNHEARD = "unheard"


def silent_state(last: datetime, now: datetime, lost_after: timedelta, *, fleet_back: datetime | None,
                 others_last: datetime | None) -> tuple[str, datetime] | None:
    """The one rule for a worker's silence, for the serving verdicts and capacity alike: None while it was heard
    within `lost_after` (counted from when the controller heard the fleet again after an outage, `fleet_back`,
    if that is later); else (SILENT_LOST, since) when someone else was heard at the end of that time, or
    (SILENT_UNHEARD, since) when nobody was."""
    since = max(last, fleet_back) if fleet_back is not None and fleet_back <= now else last
    if now - since <= lost_after:
        return None
    if others_last is None or others_last < since + lost_after:
        return SILENT_UNHEARD, since
    return SILENT_LOST, since


@dataclass(frozen=True)
class FleetHearing:
    """How well the controller hears the fleet at `now` (one pass's view, for capacity and status): the newest
    signals of the live workers, and when the fleet was heard again after its newest fleet-wide silence.

    Too little (`too_little`): live workers exist and none was heard for `lost_after` (silence everywhere: our
    own outage or a partition between the fleet and the controller), or the fleet was heard again less than
    `lost_after` ago (workers come back one by one as each flushes its queue). Either way silence says nothing
    about the machines, and a count must not move on it."""

    now: datetime
    lost_after: timedelta
    newest: tuple[tuple[datetime, str], ...] = ()  # the two newest (last signal, instance id) of live workers
    back: datetime | None = None  # `fleet_heard_again` within the look-back
    silent_for: timedelta | None = None  # length of that fleet-wide silence

    def others_last(self, instance_id: str) -> datetime | None:
        return next((t for t, i in self.newest if i != instance_id), None)

    def silent_state(self, instance_id: str, last: datetime) -> tuple[str, datetime] | None:
        return silent_state(last, self.now, self.lost_after, fleet_back=self.back,
                            others_last=self.others_last(instance_id))

    def too_little(self) -> str | None:
        """Why the controller hears the fleet too little to act on silence (a sentence), or None."""
        minutes = self.lost_after.total_seconds() / 60
        if self.newest and self.now - self.newest[0][0] > self.lost_after:
            quiet = (self.now - self.newest[0][0]).total_seconds() / 60
            return (f"the controller has heard no worker for {quiet:.0f} min (> lost_after {minutes:g} min): its "
                    "own outage or a partition, not idleness")
        if self.back is not None and self.now - self.back < self.lost_after:
            gap = f" after {self.silent_for.total_seconds() / 60:.0f} min of silence" if self.silent_for else ""
            return (f"the controller heard the fleet again at {format_time(self.back)}{gap}, "
                    f"{(self.now - self.back).total_seconds() / 60:.0f} min ago (< lost_after {minutes:g} min): "
                    "workers are still coming back")
        return None


def is_live(report: InstanceReport) -> bool:
    """A worker the controller expects to hear from: registered, not destroyed, not stopped or failed."""
    return report.destroyed_at is None and report.quarantine is None and report.failure() is None \
        and report.first("serve", "done") is None


def fleet_hearing(reports: Iterable[InstanceReport], now: datetime, lost_after: timedelta,
                  look_back: timedelta, last_heard: Mapping[str, datetime] | None = None) -> FleetHearing:
    """The fleet's hearing at `now`; fleet-wide silences are looked for back to `now - look_back` (a pass reads
    the signals of that span only, as `fleet_heard_again` does), in the signals of the live workers: a fleet
    that was empty and gets its first worker was not unheard. `last_heard`: each worker's last signal when the
    caller keeps them (`FleetSignals.last_heard`), else worked out from the reports."""
    live = [r for r in reports if is_live(r)]
    newest = (((last_heard[r.instance_id] if last_heard is not None and r.instance_id in last_heard
                else last_signal(r)), r.instance_id) for r in live)
    heard = heapq.nlargest(2, newest)
    gap = fleet_silence(_signals_since(live, now - look_back), lost_after, now - look_back)
    return FleetHearing(now, lost_after, tuple(heard), gap[1] if gap else None, gap[1] - gap[0] if gap else None)


class FleetSignals:
    """When the controller last heard each worker of the fleet: what `judge_serving` needs to know of the others
    ("anyone heard from since?", "when was the fleet heard again after an outage?").

    Built from every report (`decide` builds it from the reports it judges when given none); the leader's warm
    pass keeps each worker's last signal between passes and builds it from those (`last_heard`), so judging the
    few instances that changed does not walk every report's events. Each answer is worked out on first use."""

    def __init__(self, reports: Sequence[InstanceReport], last_heard: Mapping[str, datetime] | None = None) -> None:
        self.reports = reports
        self._heard = dict(last_heard) if last_heard is not None else None
        self._newest: list[tuple[datetime, str]] | None = None
        self._back: dict[tuple[datetime, timedelta], datetime | None] = {}

    def last_heard(self) -> Mapping[str, datetime]:
        """Every worker's newest signal (`last_signal`), by instance id."""
        if self._heard is None:
            self._heard = {r.instance_id: last_signal(r) for r in self.reports}
        return self._heard

    def heard(self, instance_id: str) -> datetime:
        return self.last_heard()[instance_id]

    def newest_except(self, instance_id: str) -> datetime | None:
        """The newest signal of any OTHER worker (`judge_serving`'s `fleet_last_signal`)."""
        if self._newest is None:
            self._newest = heapq.nlargest(2, ((t, i) for i, t in self.last_heard().items()))
        return next((t for t, i in self._newest if i != instance_id), None)

    def heard_again(self, instance_id: str, now: datetime, silence: timedelta,
                    judged_serving: Collection[str]) -> datetime | None:
        """`fleet_heard_again` from the oldest silence of a serving worker not judged yet (this one's when none is
        silent that long): worked out once per pass, at the first silent worker judged."""
        key = (now, silence)
        if key not in self._back:
            silent = [self.heard(r.instance_id) for r in self.reports if is_serving(r)
                      and r.instance_id not in judged_serving and now - self.heard(r.instance_id) > silence]
            self._back[key] = fleet_heard_again(self.reports, silence, min(silent, default=self.heard(instance_id)))
        return self._back[key]


def judge_serving(report: InstanceReport, pool: PoolSpec, settings: ServingSettings, now: datetime, *,
                  fleet_last_signal: datetime | None, fleet_back: datetime | None = None) -> Verdict | None:
    """degraded or lost for an instance that passed admission and serves; None while it is fine.

    `fleet_last_signal`: the newest signal from any OTHER instance; `fleet_back`: when the controller heard the
    fleet again after its newest fleet-wide silence (`fleet_heard_again`). Lost needs this instance to have
    been silent for `lost_after_minutes` since it was last heard or since the fleet was heard again, whichever
    is later, and the controller to have heard someone else at the end of that time."""
    failed = report.first("serve", "failed")
    if report.first("serve", "started") is None or report.destroyed_at is not None:
        return None
    if failed is not None:
        return _lost(report, pool, settings, now, failed.at, failure_message=failed.message,
                     tail=failed.log_tail or report.log_tail, exit_code=failed.exit_code)
    if report.first("serve", "done") is not None:
        return None  # stopped cleanly (TERM, or our own stop directive)
    health = serving_health(report, pool, settings)
    last = min(health.last_heartbeat or report.first("serve", "started").at, now)  # type: ignore[union-attr]
    # Silence during our own outage says nothing about the machine: counted from when the fleet was heard again.
    silent = silent_state(last, now, timedelta(minutes=settings.lost_after_minutes), fleet_back=fleet_back,
                          others_last=fleet_last_signal)
    if silent is not None:
        state, since = silent
        if state == SILENT_UNHEARD:
            return None  # nobody was heard from since: maybe our own outage, never a verdict
        return _lost(report, pool, settings, now, last, failure_message=None, tail=report.log_tail,
                     fleet_back=since if since > last else None)
    if health.below_since is not None and health.last_heartbeat is not None and health.rate is not None and \
            health.last_heartbeat - health.below_since >= timedelta(minutes=settings.degraded_after_minutes):
        return _degraded(report, pool, settings, now, health)
    return None


def judge_market_deadlines(report: InstanceReport, pool: PoolSpec, misses: Sequence[MarketMiss],
                           now: datetime) -> Verdict | None:
    """market-deadline for a serving machine that missed the Snark Market's deadline `deadline_misses` times
    within the window (curio's PSProve runs on the curio node named after the instance: failed, ended past the
    deadline, or still running past it); None otherwise. The market's rules make each miss cost real proofs
    (documentation/en/experimental-features/Snark-Market.md: 50 challenge proofs and the work slot).

    Blame follows the evidence, as for every verdict: a failed run's error with a signature decides (our
    software -> image, so the circuit breaker correlates it across machines); runs that ended late or are still
    running past the deadline are the machine's (too slow or hung); failures without a signature are unknown
    (held, never marks bad, counted by the breaker)."""
    market = pool.queue.market if pool.queue is not None else None
    if market is None or report.first("serve", "started") is None or report.destroyed_at is not None:
        return None
    mine = {m.task_id: m for m in sorted(misses, key=lambda m: m.work_end)
            if m.machine_name == report.instance_id and m.work_end <= now}
    if len(mine) < market.deadline_misses:
        return None
    runs = sorted(mine.values(), key=lambda m: m.work_end)
    late = [m for m in runs if m.succeeded or m.overdue]
    errors = [redact_line(m.error) for m in runs if m.error and not m.succeeded]
    match = classify(errors) if errors else None
    if match is not None:
        blame, signature, cause = match.blame, match.name, redact_line(match.line)
    elif late:
        blame, signature = "machine", "market-deadline-missed"
        worst = max(late, key=lambda m: m.minutes)
        cause = (f"task {worst.task_id} {'still running' if worst.overdue else 'ended'} {worst.minutes:.0f} min after "
                 "it was posted")
    else:
        blame, signature, cause = "unknown", unrecognized_signature(MARKET_DEADLINE, "serve", None, errors[-1]), \
            errors[-1]
    failed = sum(1 for m in runs if not m.succeeded and not m.overdue)
    reason = (f"{MARKET_DEADLINE}: serving: missed the Snark Market's {market.deadline_minutes:g} min deadline "
              f"{len(runs)} times in {market.window_hours:g} h ({len(late)} late, {failed} failed; "
              f">= {market.deadline_misses} make a verdict): {cause}")
    evidence = {"stage": "serving", "market": {
        "deadline_minutes": market.deadline_minutes, "window_hours": market.window_hours,
        "misses": [m.to_json() for m in runs[-EVIDENCE_LOG_LINES:]]},
        "log_tail": redact_lines(list(report.log_tail)[-EVIDENCE_LOG_LINES:])}
    if match is not None:
        evidence["signature"] = {"name": match.name, "blame": match.blame, "line": redact_line(match.line)}
    return _verdict(report, pool, now, MARKET_DEADLINE, blame, reason, evidence, None, signature=signature)


def _degraded(report: InstanceReport, pool: PoolSpec, settings: ServingSettings, now: datetime,
              health: ServingHealth) -> Verdict:
    rate = health.rate
    assert rate is not None and rate.proofs_per_hour is not None and health.below_since is not None
    pph = rate.proofs_per_hour
    threshold = pool.min_rate_proofs_per_hour * (1 - settings.degraded_margin)
    minutes = (rate.end - health.below_since).total_seconds() / 60
    temps = [g.get("temperature_c") for g in health.gpus if _num(g.get("temperature_c")) is not None]
    clocks = [(g.get("sm_clock_mhz"), g.get("max_sm_clock_mhz")) for g in health.gpus]
    gpu = ""
    if temps:
        gpu = f"; GPU {max(temps):g} C"  # type: ignore[type-var]
        if clocks and all(_num(c) is not None for c in clocks[0]):
            gpu += f", SM clock {clocks[0][0]:g}/{clocks[0][1]:g} MHz"
    reason = (f"degraded: serving: {pph:.1f}/h < {threshold:.1f}/h (min {pool.min_rate_proofs_per_hour:g}/h - "
              f"{settings.degraded_margin:.0%}) for {minutes:.0f} min: {rate.completed} proofs in "
              f"{rate.busy_s / 60:.1f} busy min{gpu}")
    evidence = {
        "stage": "serving", "proofs_per_hour": round(pph, 2), "threshold_proofs_per_hour": round(threshold, 2),
        "window_minutes": settings.window_minutes, "below_since": format_time(health.below_since),
        "window": {"completed": rate.completed, "failed": rate.failed, "busy_s": round(rate.busy_s, 1)},
        "last_heartbeat": format_time(health.last_heartbeat) if health.last_heartbeat else None,
        "gpus": [dict(g) for g in health.gpus],
    }
    return _verdict(report, pool, now, DEGRADED, "machine", reason, evidence, pph, signature="serving-rate-below-min")


def _lost(report: InstanceReport, pool: PoolSpec, settings: ServingSettings, now: datetime, last: datetime, *,
          failure_message: str | None, tail: Sequence[str], fleet_back: datetime | None = None,
          exit_code: int | None = None) -> Verdict:
    match = classify(tail) if tail else None
    generic = None
    if match is not None and not match.decisive:  # a wrapper's "failed" never decides blame (issue 29)
        generic, match = match, None
    if match is not None:
        blame, cause = match.blame, redact_line(match.line)
    elif failure_message is not None:
        # The worker stopped itself: maybe our software; the best line it left is shown, not recognised.
        blame = "unknown"
        cause = redact_line(f"{NOT_RECOGNISED}: {generic.line if generic is not None else failure_message}")
    else:
        blame, cause = "marketplace", None
    silent_min = (now - last).total_seconds() / 60
    if failure_message is not None:
        reason = f"lost: serving: {cause}"
    else:
        outage = "" if fleet_back is None else (
            f"; {(now - fleet_back).total_seconds() / 60:.0f} min since the controller heard the fleet again at "
            f"{format_time(fleet_back)} after its outage")
        reason = (f"lost: serving: no heartbeat for {silent_min:.0f} min (> {settings.lost_after_minutes:g} min"
                  f"{outage})" + (f": {cause}" if cause else "; the marketplace's host went silent"))
    evidence = {"stage": "serving", "last_signal": format_time(last), "silent_minutes": round(silent_min, 1),
                "lost_after_minutes": settings.lost_after_minutes,
                "log_tail": redact_lines(list(tail)[-EVIDENCE_LOG_LINES:])}
    if fleet_back is not None:
        evidence["fleet_heard_again"] = format_time(fleet_back)
    if match is not None:
        evidence["signature"] = {"name": match.key, "blame": match.blame, "line": redact_line(match.line)}
    if match is not None:
        signature = match.key
    elif failure_message is not None:
        # The worker stopped itself and no signature says why: keyed like any unexplained failure, so the same
        # message from distinct machines with one image trips the breaker and different ones do not.
        signature = unrecognized_signature(LOST, "serve", exit_code, failure_message)
    else:
        signature = "heartbeats-stopped"
    return _verdict(report, pool, now, LOST, blame, reason, evidence, None, signature=signature)


def _verdict(report: InstanceReport, pool: PoolSpec, now: datetime, verdict: str, blame: str, reason: str,
             evidence: Mapping[str, Any], rate: float | None, *, signature: str | None,
             spp: float | None = None) -> Verdict:
    full = {"phase": "serve" if verdict in SERVING_VERDICTS else "benchmark", "gpu_name": report.gpu_name,
            "host_id": report.host_id, "machine_id": report.machine_id, "instance_id": report.instance_id,
            "contract_id": report.contract_id, "image_digest": report.image_digest,
            "phases": {name: format_time(at) for name, at in report.phase_times().items()}, **evidence}
    return Verdict(
        instance_id=report.instance_id, verdict=verdict, blame=blame, marks_bad=blame in _MARKS_BAD,
        reason=reason, at=now, pool=pool.name, machine_id=report.machine_id, host_id=report.host_id,
        gpu_name=report.gpu_name, contract_id=report.contract_id, image_digest=report.image_digest,
        signature=signature, phase=str(full["phase"]), proofs_per_hour=None if rate is None else round(rate, 2),
        seconds_per_proof=None if spp is None else round(spp, 2),
        min_rate_proofs_per_hour=pool.min_rate_proofs_per_hour,
        evidence={k: v for k, v in full.items() if v is not None})


# --- early verdict ---------------------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True)
class ProofSample:
    index: int
    ok: bool
    seconds: float | None


#: cuzk-bench's per-proof line (curio extern/cuzk/cuzk-bench/src/main.rs, batch): `  [3/10] COMPLETED — 41.2s
#: (prove=... ms, queue=... ms)`; the worker's log sink prefixes a timestamp.
_PROOF_LINE = re.compile(r"\[(\d+)/(\d+)\]\s+([A-Za-z]+)\s+\S+\s+(\d+(?:\.\d+)?)s\b")


def proof_samples(report: InstanceReport) -> list[ProofSample]:
    """Per-proof results the worker streamed during the benchmark, by proof index (last word wins).

    Accepts `benchmark` `progress` events with `details.proof = {index, label|status, seconds}` or
    `details.proofs = [...]` of the same; labels COMPLETED/ok are good proofs, anything else failed. The
    per-proof lines of cuzk-bench in the shipped log (the instance's log tail) count too, so a worker that
    streams only its log still gets an early verdict."""
    found: dict[int, ProofSample] = {}
    for line in report.log_tail:
        m = _PROOF_LINE.search(line)
        if m:
            found[int(m[1])] = ProofSample(int(m[1]), m[3].upper() in ("COMPLETED", "OK"), float(m[4]))
    for e in report.events:
        if e.phase != "benchmark" or e.status != "progress":
            continue
        items: list[Any] = []
        if isinstance(e.details.get("proof"), Mapping):
            items.append(e.details["proof"])
        if isinstance(e.details.get("proofs"), list):
            items += [p for p in e.details["proofs"] if isinstance(p, Mapping)]
        for p in items:
            index = _int(p.get("index"))
            if index is None:
                continue
            label = p.get("label", p.get("status"))
            ok = isinstance(label, str) and label.upper() in ("COMPLETED", "OK")
            found[index] = ProofSample(index, ok, _num(p.get("seconds")))
    return [found[i] for i in sorted(found)]


@dataclass(frozen=True)
class EarlyCheck:
    """The best case of a running benchmark after its warm-up."""

    requested: int
    measured: tuple[float, ...]  # seconds of the good proofs after the warm-up
    remaining: int
    concurrency: int
    best_case_proofs_per_hour: float
    saved_minutes: float
    saved_usd_at_most: float
    #: The fastest proof the machine has shown (measured or warm-up), which bounds the best case, and which it was.
    best_seconds: float = 0.0
    bounded_by: str = ""


def early_check(report: InstanceReport, pool: PoolSpec, settings: EarlyVerdictSettings) -> EarlyCheck | None:
    """None while there is not enough evidence (or the benchmark already ended, or early verdicts are off).

    Enough evidence: `settings.min_measured_proofs` good proofs after the warm-up. Best case: the remaining proofs
    all at the fastest speed the machine has shown so far - a measured proof, or a warm-up proof (the worker's
    warm-up phase, the batch's first `warmup_proofs`) when that was faster - with perfect overlap of the `-j`
    concurrent proofs: an upper bound, so the verdict errs towards keeping the machine."""
    if not settings.enabled or report.result is not None or report.failure() is not None:
        return None
    started = report.first("benchmark", "started")
    if started is None:
        return None
    requested = _int(started.details.get("requested")) or pool.benchmark.proofs
    concurrency = _int(started.details.get("concurrency")) or pool.benchmark.concurrency or 1
    samples = proof_samples(report)
    after = [s for s in samples if s.index > settings.warmup_proofs]
    good = [s for s in after if s.ok and s.seconds and s.seconds > 0]
    measured = tuple(s.seconds for s in good if s.seconds)
    if len(measured) < max(settings.min_measured_proofs, 1):
        return None
    total = max(requested - settings.warmup_proofs, 1)
    done = len(after)
    remaining = max(total - done, 0)
    if remaining == 0:
        return None  # nothing left to save: the result decides
    best, bounded_by = min(_shown_speeds(report, samples, settings, good))
    elapsed = sum(s.seconds or 0.0 for s in after) / concurrency
    best_case_s = elapsed + remaining * best / concurrency
    good_at_best = len(measured) + remaining
    best_rate = good_at_best * 3600.0 / best_case_s if best_case_s > 0 else math.inf
    saved_min = remaining * statistics.fmean(measured) / concurrency / 60.0
    return EarlyCheck(requested, measured, remaining, concurrency, best_rate, saved_min,
                      saved_min / 60.0 * pool.max_price_usd_per_hour, best, bounded_by)


def _shown_speeds(report: InstanceReport, samples: Sequence[ProofSample], settings: EarlyVerdictSettings,
                  good: Sequence[ProofSample]) -> list[tuple[float, str]]:
    """(seconds, which proof) of every good proof the machine has shown: measured, the batch's warm-up proofs, the
    worker's warm-up phase (its `warmup done` event: `details.seconds`, the one discarded proof)."""
    shown = [(float(s.seconds), f"measured proof {s.index}") for s in good if s.seconds]
    shown += [(float(s.seconds), f"warm-up proof {s.index} of the batch") for s in samples
              if s.index <= settings.warmup_proofs and s.ok and s.seconds and s.seconds > 0]
    warm = report.first("warmup", "done")
    seconds = _num(warm.details.get("seconds")) if warm is not None else None
    label = warm.details.get("label") if warm is not None else None
    if seconds is not None and seconds > 0 and (label is None or str(label).upper() == "COMPLETED"):
        shown.append((seconds, "the warm-up proof"))
    return shown


def judge_early(report: InstanceReport, pool: PoolSpec, settings: EarlyVerdictSettings,
                now: datetime) -> Verdict | None:
    check = early_check(report, pool, settings)
    if check is None or check.best_case_proofs_per_hour >= pool.min_rate_proofs_per_hour:
        return None
    count = len(check.measured)
    reason = (f"{EARLY}: benchmark after {count} measured {'proof' if count == 1 else 'proofs'} of {check.requested}: "
              f"best case {check.best_case_proofs_per_hour:.1f}/h < {pool.min_rate_proofs_per_hour:g}/h even at the "
              f"fastest proof it showed ({check.best_seconds:.1f} s/proof, {check.bounded_by}; -j {check.concurrency})"
              f"; ended early: saved ~{check.saved_minutes:.1f} min, <= ${check.saved_usd_at_most:.2f}")
    evidence = {
        "stage": "admission", "early": {
            "measured_seconds": [round(s, 2) for s in check.measured], "remaining": check.remaining,
            "requested": check.requested, "concurrency": check.concurrency,
            "best_seconds": round(check.best_seconds, 2), "bounded_by": check.bounded_by,
            "min_measured_proofs": settings.min_measured_proofs,
            "best_case_proofs_per_hour": round(check.best_case_proofs_per_hour, 2),
            # Every proof seen (index, ok, seconds), warm-up included: a replay under other early-verdict
            # settings or another minimum judges them again (`fleet plan --what-if`).
            "samples": [[p.index, p.ok, p.seconds] for p in proof_samples(report)]},
        "saved": {"minutes": round(check.saved_minutes, 1), "usd_at_most": round(check.saved_usd_at_most, 2),
                  "price_basis": f"pool max ${pool.max_price_usd_per_hour:g}/h"},
        "log_tail": redact_lines(list(report.log_tail)[-EVIDENCE_LOG_LINES:]),
    }
    mean = statistics.fmean(check.measured) / check.concurrency
    return _verdict(report, pool, now, EARLY, "machine", reason, evidence, 3600.0 / mean if mean else None,
                    signature="early-best-case-below-min", spp=mean)


def saved(entries: Iterable[BenchmarkEntry]) -> tuple[float, float]:
    """Minutes and dollars (upper bound) early verdicts saved, from record entries."""
    minutes = usd = 0.0
    for e in entries:
        s = e.evidence.get("saved") if e.verdict == EARLY else None
        if isinstance(s, Mapping):
            minutes += _num(s.get("minutes")) or 0.0
            usd += _num(s.get("usd_at_most")) or 0.0
    return minutes, usd


# --- directives ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Directive:
    """What a worker is told when it asks (GET /api/v1/instances/{id}/directive)."""

    instance_id: str
    action: str  # wait | serve | stop
    reason: str
    verdict: str | None = None
    heartbeat_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"protocol": 1, "action": self.action, "reason": self.reason}
        if self.verdict is not None:
            out["verdict"] = self.verdict
        if self.heartbeat_s is not None:
            out["heartbeat_s"] = self.heartbeat_s
        return out


def directives(reports: Iterable[InstanceReport], records: RecordSet, settings: ServingSettings,
               now: datetime) -> dict[str, Directive]:
    """Per live instance: stop once any verdict on it failed (or its machine is excluded), serve once its
    admission passed, else wait. A banned machine's instance stops whatever its benchmark says, judged or
    not (its machine id is the provisioner's claim, checked at registration). Recomputed from the records
    every pass (crash-safe, idempotent); the warm pass recomputes only the instances it must (domain/due.py)."""
    entries: dict[str, list[BenchmarkEntry]] = {}
    machine_of: dict[str, MachineRecord] = {}
    for rec in records.machines.values():
        for b in rec.benchmarks:
            entries.setdefault(b.instance_id, []).append(b)
            machine_of[b.instance_id] = rec
    out: dict[str, Directive] = {}
    for report in reports:
        if report.destroyed_at is not None:
            continue
        machine = machine_of.get(report.instance_id) or (
            records.machines.get(report.machine_id) if report.machine_id is not None else None)
        out[report.instance_id] = directive_for(report, entries.get(report.instance_id, []), machine, settings, now)
    return out


def directive_for(report: InstanceReport, mine: Sequence[BenchmarkEntry], machine: MachineRecord | None,
                  settings: ServingSettings, now: datetime) -> Directive:
    """One live instance's directive: `mine`, the record entries naming it (in the records' order); `machine`, the
    last record naming it, else its own machine's record."""
    hb = settings.heartbeat_minutes * 60.0
    # A serving verdict held by a guard (kill budget) keeps the machine serving: stopping it would leave
    # the slot idle without a replacement. A failed admission never serves.
    failing = next((b for b in reversed(mine) if b.verdict != "ok" and (b.stage != "serving" or b.marks_bad)), None)
    standing = machine.standing(now) if machine is not None else None
    if machine is not None and standing is not None and standing.state == "banned":
        return Directive(report.instance_id, "stop", f"machine {machine.machine_id}: {standing.detail}",
                         machine.status, hb)
    if failing is not None:
        return Directive(report.instance_id, "stop", failing.reason, failing.verdict, hb)
    if machine is not None and standing is not None and standing.excluded and mine:
        return Directive(report.instance_id, "stop", f"machine {machine.machine_id}: {standing.detail}",
                         machine.status, hb)
    if mine:
        return Directive(report.instance_id, "serve", mine[-1].reason, mine[-1].verdict, hb)
    return Directive(report.instance_id, "wait", "benchmark not judged yet", None, hb)


# --- expiry and probation --------------------------------------------------------------------------------


def with_expiry(verdict: Verdict, record: MachineRecord | None, settings: RecordExpirySettings,
                now: datetime) -> tuple[BenchmarkEntry, str | None]:
    """The record entry of `verdict`, stamped with its expiry; a bad verdict on probation is permanent.

    Returns (entry, note) where note says what probation did (for the commit body)."""
    # (stamped with its stage as it is made: a replace of an entry's ~20 fields costs as much again)
    entry = verdict.to_entry("serving" if verdict.verdict in SERVING_VERDICTS else "admission")
    if not entry.marks_bad:
        return entry, None
    if record is not None and record.standing(now).state == "probation":
        return (replace(entry, probation=True, reason=entry.reason + " [on probation: permanent]"),
                f"machine {record.machine_id} failed again on probation: its record is permanent")
    hours = settings.hours_for(verdict.blame, verdict.signature)
    if hours is None:
        return entry, None
    expires = now + timedelta(hours=hours)
    until = expires + timedelta(hours=settings.probation_hours)
    return replace(entry, expires_at=format_time(expires), probation_until=format_time(until)), None
