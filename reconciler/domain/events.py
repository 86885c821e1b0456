"""Fleet events worth telling a human about at once: a verdict, a circuit-breaker trip, the spend cap reached,
an orphan destroyed. Pure: built from what a pass or the provisioner concluded; delivered by the webhooks
adapter (reconciler/adapters/webhooks.py).

Every event has a stable `key`: the same fact gives the same key however often it is derived (a verdict is
about one instance, judged once; a trip is one image digest + signature tripping at one time), which is what
makes delivery once-only (the notifier skips keys it delivered; receivers get it as `Idempotency-Key`).
Texts are redacted here, before they leave the process: reasons carry log lines from workers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconciler.domain.observations import format_time
from reconciler.domain.redact import redact_line

VERDICT = "verdict"
BREAKER_TRIP = "breaker-trip"
SPEND_CAP = "spend-cap"
ORPHAN_DESTROYED = "orphan-destroyed"
EVENT_KINDS = (VERDICT, BREAKER_TRIP, SPEND_CAP, ORPHAN_DESTROYED)


@dataclass(frozen=True)
class FleetEvent:
    kind: str
    key: str  # stable identity of the fact (see module docstring)
    at: str  # RFC 3339
    title: str  # one line, root cause first where there is one
    severity: str = "info"  # info / warning / critical
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        """What receivers see: a digest of the key (the key names machines; a digest names nothing)."""
        return hashlib.sha256(f"{self.kind}\n{self.key}".encode()).hexdigest()[:32]


def _clean(value: Any) -> Any:
    return redact_line(value) if isinstance(value, str) else value


def _event(kind: str, key: str, at: datetime, title: str, severity: str, **fields: Any) -> FleetEvent:
    return FleetEvent(kind, key, format_time(at), redact_line(title), severity,
                      {k: _clean(v) for k, v in fields.items() if v is not None})


def verdict_event(v: Any) -> FleetEvent:
    """From a `Verdict` (duck-typed: this module stays below verdict.py's imports)."""
    if v.verdict == "ok":
        severity = "info"
    elif v.marks_bad or v.blame == "image":
        severity = "warning"
    else:
        severity = "info"
    bad = "marked bad" if v.marks_bad else (f"held by {v.held_by}" if v.held_by else "not marked bad")
    title = f"{v.root_cause()} - machine {v.machine_id or '?'} (pool {v.pool or '?'}) {bad}"
    return _event(VERDICT, f"instance:{v.instance_id}", v.at, title, severity, verdict=v.verdict, blame=v.blame,
                  marks_bad=v.marks_bad, held_by=v.held_by, machine_id=v.machine_id, host_id=v.host_id,
                  pool=v.pool, instance_id=v.instance_id, image_digest=v.image_digest,
                  proofs_per_hour=v.proofs_per_hour, min_rate_proofs_per_hour=v.min_rate_proofs_per_hour)


def breaker_event(record: Any, at: datetime) -> FleetEvent:
    """From an `ImageSuspectRecord` that this pass created (status suspect)."""
    pools = ", ".join(record.pools) or "every pool"
    title = (f"circuit breaker tripped: image {record.image_digest[:19]} fails with {record.signature} on "
             f"{len(record.machines)} machines; {pools} paused, no machine recorded bad for it")
    return _event(BREAKER_TRIP, f"image:{record.image_digest}:{record.signature}:{record.tripped_at}", at, title,
                  "critical", image_digest=record.image_digest, signature=record.signature,
                  pools=list(record.pools), machines=list(record.machines), reason=record.reason)


def spend_cap_event(total_usd_per_hour: float, cap_usd_per_hour: float, at: datetime, *,
                    since: str | None = None) -> FleetEvent:
    """The fleet's $/h reached its cap. `since`: when it first reached it (one event per episode)."""
    title = (f"spend cap reached: fleet at ${total_usd_per_hour:.2f}/h of ${cap_usd_per_hour:.2f}/h; "
             "no new instances are rented until it drops")
    episode = since or format_time(at)
    return _event(SPEND_CAP, f"spend-cap:{episode}", at, title, "critical", total_usd_per_hour=total_usd_per_hour,
                  cap_usd_per_hour=cap_usd_per_hour)


def orphan_destroyed_event(instance_id: str, at: datetime, *, label: str | None = None,
                           usd_per_hour: float | None = None, reason: str | None = None) -> FleetEvent:
    title = f"orphan destroyed: instance {instance_id}" + (f" ({label})" if label else "") + \
        (f": {reason}" if reason else "")
    return _event(ORPHAN_DESTROYED, f"orphan:{instance_id}", at, title, "warning", instance_id=instance_id,
                  label=label, usd_per_hour=usd_per_hour)
