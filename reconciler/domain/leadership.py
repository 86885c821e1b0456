"""Which replica leads: the lease as data, and the one rule every write of a leader obeys.

Several `fleet reconcile --listen` replicas may share one PostgreSQL store; exactly one of them (the holder of
the lease) runs passes, commits and pushes. The lease carries an epoch that grows by one whenever the lease
changes hands or lapses, so "may I still write?" is one comparison against the database: the epoch a pass
started with must still be the lease's epoch, held by this replica and not expired
(reconciler/adapters/lease.py asks the database; this module only holds the data and the words).

The epoch travels with every record commit as a trailer (`Fleet-Leader-Epoch: 7`): the audit trail says which
leadership term wrote what, and a commit that a stale leader could still have pushed is recognisable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reconciler.domain import errors
from reconciler.domain.observations import format_time

LEADER_EPOCH_TRAILER = "Fleet-Leader-Epoch"


class LeaseLost(errors.TemporaryError):
    """This replica no longer holds the lease with the epoch its pass started with: it must not write.
    Temporary: the replica goes on serving workers and takes the lease again when it is free."""

    reason = errors.LEASE_LOST


@dataclass(frozen=True)
class Leadership:
    """The lease as last read from the store: who holds it, in which term (epoch), since when, until when."""

    holder: str
    epoch: int
    since: datetime  # when this holder's term began (unchanged by renewals)
    expires_at: datetime

    def live(self, now: datetime) -> bool:
        return now < self.expires_at

    def to_json(self, me: str | None = None, now: datetime | None = None) -> dict[str, object]:
        """What /healthz, the page and `fleet status` show about the leader."""
        doc: dict[str, object] = {"holder": self.holder, "epoch": self.epoch, "since": format_time(self.since),
                                  "expires_at": format_time(self.expires_at)}
        if now is not None:
            doc["expired"] = not self.live(now)
        if me is not None:
            doc["this_replica"] = self.holder == me
        return doc


def leader_trailer(epoch: int | None) -> tuple[tuple[str, str], ...]:
    """The commit trailer naming the leadership term that wrote a commit; none for the embedded store."""
    return () if epoch is None else ((LEADER_EPOCH_TRAILER, str(epoch)),)


def describe(leader: Leadership | None, me: str, now: datetime) -> str:
    """One line for status surfaces, stable for a whole term (renewals do not change it): who leads, in which
    epoch, since when; or that the lease lapsed; or that nobody ever held it."""
    if leader is None:
        return "no replica holds the lease yet"
    who = "this replica" if leader.holder == me else f"replica {leader.holder}"
    if not leader.live(now):
        return f"the lease of {who} (epoch {leader.epoch}) expired at {format_time(leader.expires_at)}; " \
               "the next replica to renew takes over"
    return f"{who} leads (epoch {leader.epoch}) since {format_time(leader.since)}"
