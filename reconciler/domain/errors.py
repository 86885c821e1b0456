"""One error taxonomy for every flow: permanent (stall with a clear reason) vs temporary (retry, bounded).

Every error the package raises on purpose derives from `FleetError`, carries a `reason` constant (a
CamelCase word, as Kubernetes/Flux condition reasons are) and says whether trying again can help:
- temporary: the outside thing may answer next time (a 5xx, a timeout, a rejected push, a rate limit);
  callers retry with bounded backoff (`domain.backoff`), then report the condition and try next pass;
- permanent: only a human can fix it (a bad spec, a revoked key, an unpinned image); callers stall that
  piece of work with the reason and never retry it blindly.
Never destroy or mark a machine bad on an observation failure: an error here is about *us* seeing the
world, not about the world.

Status shows `Condition`s (type, status, reason, message, since), as Flux's controllers do, so an operator
reads "Ready=False MarketplaceAuth: vast.ai refused the API key from VAST_API_KEY" rather than free text.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# --- reasons (constants: status, tests and alerts match on these, never on message text) ----------------

SPEC_INVALID = "SpecInvalid"
RECORD_INVALID = "RecordInvalid"
STATE_INVALID = "StateInvalid"
CONFIG_MISSING = "ConfigMissing"
SECRET_INVALID = "SecretInvalid"  # noqa: S105 - a reason name, not a secret
IMAGE_NOT_PINNED = "ImageNotPinned"
NO_OFFER = "NoOffer"
POOL_PAUSED = "PoolPaused"
SPEND_CAP = "SpendCapReached"
MARKETPLACE_AUTH = "MarketplaceAuth"
MARKETPLACE_UNAVAILABLE = "MarketplaceUnavailable"
MARKETPLACE_REJECTED = "MarketplaceRejected"
RATE_LIMITED = "RateLimited"
GIT_PUSH_REJECTED = "GitPushRejected"
GIT_FAILED = "GitFailed"
STORE_FAILED = "StoreFailed"
OBSERVATION_FAILED = "ObservationFailed"
LEASE_LOST = "LeaseLost"  # another replica leads now (or the lease ran out): this one must not write
INTERNAL = "InternalError"

# --- condition types ----------------------------------------------------------------------------------------

READY = "Ready"          # the last pass did what it set out to do
STALLED = "Stalled"      # a permanent error: nothing changes until a human acts
RECONCILING = "Reconciling"  # a temporary error: retried with backoff / next pass
STANDBY = "Standby"      # reason of Ready on a replica that does not lead: another one runs the passes


class FleetError(Exception):
    """Base of every deliberate error. `temporary` decides retry vs stall; `reason` is a constant above."""

    temporary: bool = False
    reason: str = INTERNAL

    def __init__(self, message: str, *, reason: str | None = None, temporary: bool | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        if temporary is not None:
            self.temporary = temporary

    @property
    def permanent(self) -> bool:
        return not self.temporary


class TemporaryError(FleetError):
    """May succeed if tried again later: retry with bounded backoff, then report and try next pass."""

    temporary = True


class PermanentError(FleetError):
    """Needs a human: stall this piece of work with the reason; never retry it blindly."""

    temporary = False


def is_temporary(exc: BaseException) -> bool:
    """Retry or stall? Unknown exceptions (bugs) are permanent: retrying a bug only hides it."""
    return isinstance(exc, FleetError) and exc.temporary


def reason_of(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, FleetError) else INTERNAL


@dataclass(frozen=True)
class Condition:
    """One observed condition of a thing (a pass, a pool, a slot), shaped like a Kubernetes/Flux condition."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    since: datetime

    def __str__(self) -> str:
        return f"{self.type}={self.status} {self.reason}: {self.message}"


def condition_from(exc: BaseException | None, since: datetime, ok_message: str = "pass completed") -> Condition:
    """The pass's condition: Ready=True, or Stalled/Reconciling with the error's reason and message."""
    if exc is None:
        return Condition(READY, "True", "Succeeded", ok_message, since)
    kind = RECONCILING if is_temporary(exc) else STALLED
    return Condition(kind, "True", reason_of(exc), str(exc) or type(exc).__name__, since)
