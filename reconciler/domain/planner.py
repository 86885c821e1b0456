"""Slot planner: desired pools + observed slots + records -> the slot actions that converge them.

Pure. The one place that decides what happens to a slot; both drivers use it (one planner, two drivers):
- `fleet apply` calls `plan()` with slots observed from its state file and the marketplace, then carries the
  actions out through `provider.SlotProvider`;
- the Pulumi program declares one resource per `desired_slots()` entry, and the dynamic provider's diff
  asks `replace_reason()` / `pool_pause()` the same questions `plan()` asks.

A slot is `<pool>-<i>`. Decisions, in order for each desired slot:
- pool paused by an active image-suspect record for the desired digest (circuit breaker): create nothing
  and replace nothing there (the running instances are not the suspect's fault); dead ones are deleted so
  we stop paying for them; say why in the notes;
- no instance (never created, or the market no longer knows it) -> Create;
- instance exited/offline -> Replace (it will never run again);
- machine now in the bad set -> Replace;
- instance runs another image digest than the desired one -> Replace;
- otherwise Keep.
Observed slots that are not desired (count lowered, pool removed) -> Delete.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from reconciler.domain.observations import parse_time
from reconciler.domain.records import ImageSuspectRecord, RecordSet
from reconciler.domain.spec import FleetSpec, PoolSpec

# Reasons, as constants: they appear in output, JSON and tests.
REASON_MISSING = "missing"
REASON_INSTANCE_GONE = "instance-gone"
REASON_INSTANCE_DEAD = "instance-dead"
REASON_MACHINE_BAD = "machine-bad"
REASON_IMAGE_CHANGED = "image-changed"
REASON_SCALED_DOWN = "scaled-down"
REASON_POOL_REMOVED = "pool-removed"
REASON_POOL_PAUSED = "pool-paused"

#: Instance statuses after which an instance never runs again (base.Instance.is_dead), plus our own "gone".
DEAD_STATUSES = frozenset({"exited", "offline"})
STATUS_GONE = "gone"


@dataclass(frozen=True)
class ObservedSlot:
    """What a driver knows about one slot's current instance."""

    slot: str
    pool: str
    instance_id: str
    machine_id: str
    image_digest: str | None
    status: str  # base.INSTANCE_STATUSES, or STATUS_GONE when the market no longer knows the instance
    contract_id: str | None = None


@dataclass(frozen=True)
class Create:
    slot: str
    pool: str
    reason: str = REASON_MISSING
    detail: str = ""
    kind: str = "create"


@dataclass(frozen=True)
class Replace:
    slot: str
    pool: str
    reason: str
    detail: str = ""
    kind: str = "replace"


@dataclass(frozen=True)
class Delete:
    slot: str
    pool: str
    reason: str
    detail: str = ""
    kind: str = "delete"


@dataclass(frozen=True)
class Keep:
    slot: str
    pool: str
    reason: str = ""
    detail: str = ""
    kind: str = "keep"


@dataclass(frozen=True)
class Hold:
    """A desired slot deliberately left without an instance (its pool is paused)."""

    slot: str
    pool: str
    reason: str = REASON_POOL_PAUSED
    detail: str = ""
    kind: str = "hold"


SlotAction = Create | Replace | Delete | Keep | Hold


@dataclass(frozen=True)
class PoolPause:
    pool: str
    image_digest: str
    signature: str
    tripped_at: str
    machines: tuple[str, ...]

    def describe(self, now: datetime | None = None) -> str:
        age = ""
        if now is not None:
            try:
                hours = (now - parse_time(self.tripped_at)).total_seconds() / 3600
                age = f", {hours:.1f}h ago"
            except ValueError:
                pass
        return (f"pool {self.pool} paused: image {self.image_digest[:19]} is suspect (signature "
                f"{self.signature!r} on {len(self.machines)} machine(s), tripped {self.tripped_at}{age}); "
                "not creating or replacing instances there until the image record is cleared")


@dataclass(frozen=True)
class SlotPlan:
    actions: tuple[SlotAction, ...]
    notes: tuple[str, ...] = ()
    paused: Mapping[str, PoolPause] = field(default_factory=dict)

    @property
    def changes(self) -> tuple[Create | Replace | Delete, ...]:
        """The actions a driver must carry out."""
        return tuple(a for a in self.actions if isinstance(a, Create | Replace | Delete))

    @property
    def held(self) -> tuple[SlotAction, ...]:
        """Slots a paused pool keeps from matching the spec (empty, or not replaced although they should be)."""
        return tuple(a for a in self.actions if a.reason == REASON_POOL_PAUSED and isinstance(a, Hold | Keep))

    @property
    def converged(self) -> bool:
        """Nothing to do and nothing held back by a paused pool."""
        return not self.changes and not self.held


def desired_slots(spec: FleetSpec) -> dict[str, PoolSpec]:
    """Every slot the spec asks for, in spec order: `<pool>-<i>` -> pool."""
    return {slot: pool for pool in spec.pools for slot in pool.slot_names()}


def pool_pause(pool: str, records: RecordSet, desired_digest: str | None) -> PoolPause | None:
    """The active image-suspect record that pauses `pool` for `desired_digest`, if any.

    A suspect record that names no pools pauses every pool: when in doubt, stop provisioning."""
    if desired_digest is None:
        return None
    suspect: ImageSuspectRecord | None = records.suspect_images().get(desired_digest)
    if suspect is None or (suspect.pools and pool not in suspect.pools):
        return None
    return PoolPause(pool, suspect.image_digest, suspect.signature, suspect.tripped_at, suspect.machines)


def replace_reason(machine_id: str, image_digest: str | None, status: str, bad_machine_ids: Iterable[str],
                   desired_digest: str | None) -> tuple[str, str] | None:
    """Why the instance of a slot must be replaced (reason, detail), or None to keep it.

    `desired_digest` None means "not known yet" (e.g. a Pulumi preview before the image is built): no
    replacement on the image then."""
    if status in DEAD_STATUSES:
        return REASON_INSTANCE_DEAD, f"instance is {status}: it will never run again"
    if machine_id in set(bad_machine_ids):
        return REASON_MACHINE_BAD, f"machine {machine_id} is recorded bad"
    if desired_digest is not None and image_digest != desired_digest:
        return REASON_IMAGE_CHANGED, f"image {short_digest(image_digest)} -> {short_digest(desired_digest)}"
    return None


def short_digest(digest: str | None) -> str:
    if not digest:
        return "(none)"
    algo, _, hexpart = digest.partition(":")
    return f"{algo}:{hexpart[:12]}" if hexpart else digest[:19]


def plan(spec: FleetSpec, observed: Mapping[str, ObservedSlot], records: RecordSet, desired_digest: str | None,
         now: datetime) -> SlotPlan:
    """The actions that make `observed` match `spec`, given the records and the desired image digest."""
    bad = records.bad_machine_ids(now)  # expired records are on probation: their machines may be rented
    wanted = desired_slots(spec)
    pauses = {p.name: pause for p in spec.pools if (pause := pool_pause(p.name, records, desired_digest))}
    actions: list[SlotAction] = []
    notes: list[str] = [pause.describe(now) for pause in pauses.values()]

    for slot, pool in wanted.items():
        seen = observed.get(slot)
        paused = pool.name in pauses
        if seen is None or seen.status == STATUS_GONE:
            if paused:
                actions.append(Hold(slot, pool.name, REASON_POOL_PAUSED, "no instance; pool is paused"))
                continue
            detail = (f"instance {seen.instance_id} is gone from the market" if seen is not None
                      else "no instance yet")
            actions.append(Create(slot, pool.name, REASON_INSTANCE_GONE if seen else REASON_MISSING, detail))
            continue
        why = replace_reason(seen.machine_id, seen.image_digest, seen.status, bad, desired_digest)
        if why is None:
            actions.append(Keep(slot, pool.name))
        elif paused and why[0] == REASON_INSTANCE_DEAD:
            actions.append(Delete(slot, pool.name, REASON_INSTANCE_DEAD, why[1] + "; pool paused: not replaced"))
        elif paused:
            actions.append(Keep(slot, pool.name, REASON_POOL_PAUSED, f"would replace ({why[1]}) but pool is paused"))
        else:
            actions.append(Replace(slot, pool.name, why[0], why[1]))

    # Extra slots: highest index first, so a later partial run leaves the lowest slots standing.
    extra = [s for s in observed.values() if s.slot not in wanted]
    for seen in sorted(extra, key=lambda s: (s.pool, -_slot_index(s.slot), s.slot)):
        try:
            count = spec.pool(seen.pool).count
            reason, detail = REASON_SCALED_DOWN, f"pool {seen.pool} count is {count}"
        except KeyError:
            reason, detail = REASON_POOL_REMOVED, f"pool {seen.pool} is no longer in the spec"
        actions.append(Delete(seen.slot, seen.pool, reason, detail))

    if records.problems:
        notes.append(f"{len(records.problems)} record file(s) unreadable; their machines are treated as bad")
    return SlotPlan(tuple(actions), tuple(notes), pauses)


def _slot_index(slot: str) -> int:
    tail = slot.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1
