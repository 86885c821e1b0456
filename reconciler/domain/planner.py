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
- the instance's status calls for it (STATUS_RULES: stopped/exited/offline at once, loading, scheduling,
  rebooting, frozen and unknown after their deadline) -> Replace; a marketplace fault, never the machine's;
- machine now in the bad set -> Replace;
- instance runs another image digest than the desired one -> Replace;
- otherwise Keep.
Observed slots that are not desired (count lowered, pool removed) -> Delete.
A slot whose machine has a retest pending (an unknown failure no correlation decided, domain/correlation.py)
creates or replaces with `retest_machine` set: the driver rents that machine first while the market offers it.
A draining slot (an autoscaled pool shrinking: fleet-spec/capacity.yaml) keeps its instance while the worker
finishes its proofs, is never created or replaced, and is deleted once the leader releases it.
Fleet spend cap (`max_total_dph`): planned spend = the $/h of every instance kept + the pool's price cap for
every slot to create (the worst an offer may cost); a create that would take it over the cap is held
(REASON_SPEND_CAP), in slot order, and said in the notes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from reconciler.domain.hosts import excluded_by_hosts, host_of_machine
from reconciler.domain.observations import format_time, parse_time
from reconciler.domain.records import ImageSuspectRecord, RecordSet
from reconciler.domain.retests import retests_pending
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
REASON_INSTANCE_STUCK = "instance-stuck"
REASON_SPEND_CAP = "spend-cap"
REASON_DRAINING = "draining"

STATUS_GONE = "gone"

ACTION_KEEP = "keep"
ACTION_REPLACE = "replace"  # destroy the instance (it may be billing) and rent another for the slot


@dataclass(frozen=True)
class StatusRule:
    """What a slot does about its instance's marketplace status. Every status is a marketplace condition:
    replacing on it never marks the machine bad (only a benchmark verdict with evidence does)."""

    status: str
    meaning: str
    billing: str
    action: str
    #: Seconds in this status before acting (0: at once; None: never). Loading counts from creation.
    deadline_s: float | None

    def describe(self) -> str:
        if self.action == ACTION_KEEP:
            return "keep"
        return "destroy and replace at once" if not self.deadline_s else \
            f"replace after {self.deadline_s / 60:g} min"


#: THE status table (docs/vastai.md shows the same). Statuses are
#: the marketplace port's (vast `actual_status` normalised: null/created -> loading); sources: docs.vast.ai
#: show-instance and vast-ai/vast-cli, as tests/vast_fake.py `STATUSES` cites them.
STATUS_RULES: Mapping[str, StatusRule] = {r.status: r for r in (
    StatusRule("running", "the worker's container runs", "GPU + storage", ACTION_KEEP, None),
    StatusRule("loading", "being provisioned, image pulling, container starting", "storage",
               ACTION_REPLACE, 30 * 60.0),
    StatusRule("scheduling", "waiting for the machine's GPUs to be free", "storage", ACTION_REPLACE, 10 * 60.0),
    StatusRule("rebooting", "the container restarts (transient)", "storage", ACTION_REPLACE, 10 * 60.0),
    StatusRule("unknown", "no recent heartbeat from the host", "may bill", ACTION_REPLACE, 10 * 60.0),
    StatusRule("frozen", "paused with memory kept: does no work", "GPU + storage", ACTION_REPLACE, 5 * 60.0),
    StatusRule("stopped", "halted: will not run again by itself", "storage", ACTION_REPLACE, 0.0),
    StatusRule("exited", "the container's process ended", "storage", ACTION_REPLACE, 0.0),
    StatusRule("offline", "the host disconnected from vast", "storage", ACTION_REPLACE, 0.0),
)}
#: Statuses replaced at once (the old "dead" set, now with `stopped`: it keeps billing storage).
DEAD_STATUSES = frozenset(s for s, r in STATUS_RULES.items() if r.action == ACTION_REPLACE and not r.deadline_s)


def status_verdict(status: str, seconds_in_status: float | None) -> tuple[str, str] | None:
    """(reason, detail) when the status table says to replace the instance now, else None.

    `seconds_in_status` None: unknown (e.g. a Pulumi diff without a clock): only at-once rules apply. A
    status the table does not know is treated as `unknown`."""
    rule = STATUS_RULES.get(status, STATUS_RULES["unknown"])
    if rule.action == ACTION_KEEP or rule.deadline_s is None:
        return None
    blame = "a marketplace condition, the machine is not blamed"
    if rule.deadline_s == 0:
        return REASON_INSTANCE_DEAD, f"instance is {status} ({rule.meaning}; bills {rule.billing}): {blame}"
    if seconds_in_status is None or seconds_in_status < rule.deadline_s:
        return None
    return (REASON_INSTANCE_STUCK, f"instance {status} for {seconds_in_status / 60:.0f} min > "
            f"{rule.deadline_s / 60:g} min ({rule.meaning}): {blame}")


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
    #: Since when (epoch seconds) the instance has had `status` (loading: since creation); None: unknown.
    status_since: float | None = None
    price_usd_per_hour: float | None = None


@dataclass(frozen=True)
class _OnSlot:
    """What every slot action says: the slot, its pool, why (a REASON_*) and in words. An action with a usual
    reason gives it as its default; fields keep this order, so positional construction is as before."""

    slot: str
    pool: str
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class Create(_OnSlot):
    reason: str = REASON_MISSING
    kind: str = "create"
    #: A machine to benchmark once more (domain/correlation.py): rented first while the market offers it.
    retest_machine: str | None = None


@dataclass(frozen=True)
class Replace(_OnSlot):
    kind: str = "replace"
    retest_machine: str | None = None


@dataclass(frozen=True)
class Delete(_OnSlot):
    kind: str = "delete"


@dataclass(frozen=True)
class Keep(_OnSlot):
    reason: str = ""
    kind: str = "keep"


@dataclass(frozen=True)
class Hold(_OnSlot):
    """A desired slot deliberately left without an instance (its pool is paused)."""

    reason: str = REASON_POOL_PAUSED
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
    def capped(self) -> tuple[SlotAction, ...]:
        """Slots left empty because filling them could pass the fleet spend cap."""
        return tuple(a for a in self.actions if a.reason == REASON_SPEND_CAP or "spend cap" in a.detail)

    @property
    def converged(self) -> bool:
        """Nothing to do, nothing held back by a paused pool or the spend cap."""
        return not self.changes and not self.held and not self.capped


def spend_cap_note(spec: FleetSpec) -> str | None:
    """The cap against the worst case of the spec alone (for a plan that knows no running instances)."""
    if spec.max_total_dph is None:
        return None
    worst = sum(p.count * p.max_price_usd_per_hour for p in spec.pools)
    if worst <= spec.max_total_dph + 1e-9:
        return (f"fleet spend cap ${spec.max_total_dph:.2f}/h: every slot fits even at its pool's max price "
                f"(${worst:.2f}/h)")
    return (f"fleet spend cap ${spec.max_total_dph:.2f}/h: the pools may cost up to ${worst:.2f}/h (count x max "
            "price); creates that would pass the cap are held and say so (apply, status)")


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
                   desired_digest: str | None, seconds_in_status: float | None = None) -> tuple[str, str] | None:
    """Why the instance of a slot must be replaced (reason, detail), or None to keep it.

    `desired_digest` None means "not known yet" (e.g. a Pulumi preview before the image is built): no
    replacement on the image then. `seconds_in_status`: how long the instance has had `status` (the status
    table's deadlines); None: only the at-once rules apply."""
    by_status = status_verdict(status, seconds_in_status)
    if by_status is not None:
        return by_status
    if machine_id in set(bad_machine_ids):
        host = host_of_machine(machine_id)
        return REASON_MACHINE_BAD, (f"machine {machine_id} is recorded bad" if host is None else
                                    f"GPU {machine_id} (host {host}) is recorded bad or its host is banned")
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
    # A host banned by a PR (fleet-spec/hosts.yaml state: banned): every GPU of it, as if each were banned.
    bad = bad | excluded_by_hosts(spec.hosts, (s.machine_id for s in observed.values()))
    wanted = desired_slots(spec)
    pauses = {p.name: pause for p in spec.pools if (pause := pool_pause(p.name, records, desired_digest))}
    actions: list[SlotAction] = []
    notes: list[str] = [pause.describe(now) for pause in pauses.values()]

    # An unknown failure no correlation decided is retested on the same machine (domain/correlation.py): the slot
    # whose instance failed prefers that machine when it rents again, while the market offers it.
    retests = retests_pending(records, spec, now, [s.machine_id for s in observed.values() if s.machine_id])

    def retest_of(seen: ObservedSlot | None, pool: PoolSpec) -> tuple[str | None, str]:
        pending = retests.get(seen.machine_id) if seen is not None else None
        if pending is None or pending.pool not in (None, pool.name):
            return None, ""
        return pending.machine_id, (f"; retest of machine {pending.machine_id} (unknown failure of "
                                    f"{pending.instance_id}, due until {format_time(pending.until)})")

    cap = spec.max_total_dph
    # Spend of what stays: every observed instance kept (unknown price: its pool's cap, the worst case).
    planned = 0.0
    creates: list[tuple[str, PoolSpec, str, str, bool]] = []  # slot, pool, reason, detail, is_replace
    epoch = now.timestamp()

    for slot, pool in wanted.items():
        seen = observed.get(slot)
        paused = pool.name in pauses
        if slot in pool.draining:
            # Capacity shrinks the pool: the worker finishes its proofs, then the leader releases the slot
            # (domain/capacity.py). Never rent for it; an instance that is dead or gone is not replaced.
            if seen is None or seen.status == STATUS_GONE:
                continue
            age = None if seen.status_since is None else max(0.0, epoch - seen.status_since)
            why = status_verdict(seen.status, age)
            if why is not None:
                actions.append(Delete(slot, pool.name, REASON_DRAINING, f"{why[1]}; draining: not replaced"))
            else:
                actions.append(Keep(slot, pool.name, REASON_DRAINING, "draining: finishing its proofs"))
                planned += seen.price_usd_per_hour if seen.price_usd_per_hour is not None else \
                    pool.max_price_usd_per_hour
            continue
        if seen is None or seen.status == STATUS_GONE:
            if paused:
                actions.append(Hold(slot, pool.name, REASON_POOL_PAUSED, "no instance; pool is paused"))
                continue
            detail = (f"instance {seen.instance_id} is gone from the market" if seen is not None
                      else "no instance yet")
            retest, why_retest = retest_of(seen, pool)
            creates.append((slot, pool, REASON_INSTANCE_GONE if seen else REASON_MISSING, detail + why_retest, False))
            actions.append(Create(slot, pool.name, REASON_INSTANCE_GONE if seen else REASON_MISSING,
                                  detail + why_retest, retest_machine=retest))
            continue
        age = None if seen.status_since is None else max(0.0, epoch - seen.status_since)
        why = replace_reason(seen.machine_id, seen.image_digest, seen.status, bad, desired_digest, age)
        if why is None:
            actions.append(Keep(slot, pool.name))
            planned += seen.price_usd_per_hour if seen.price_usd_per_hour is not None else pool.max_price_usd_per_hour
        elif paused and why[0] in (REASON_INSTANCE_DEAD, REASON_INSTANCE_STUCK):
            actions.append(Delete(slot, pool.name, why[0], why[1] + "; pool paused: not replaced"))
        elif paused:
            actions.append(Keep(slot, pool.name, REASON_POOL_PAUSED, f"would replace ({why[1]}) but pool is paused"))
            planned += seen.price_usd_per_hour if seen.price_usd_per_hour is not None else pool.max_price_usd_per_hour
        else:
            retest, why_retest = retest_of(seen, pool) if why[0] != REASON_MACHINE_BAD else (None, "")
            creates.append((slot, pool, why[0], why[1] + why_retest, True))
            actions.append(Replace(slot, pool.name, why[0], why[1] + why_retest, retest_machine=retest))

    if cap is not None:
        held: list[str] = []
        for slot, pool, reason, detail, is_replace in creates:
            worst = pool.max_price_usd_per_hour
            if planned + worst <= cap + 1e-9:
                planned += worst
                continue
            index = next(i for i, a in enumerate(actions) if a.slot == slot)
            why_cap = (f"fleet spend cap ${cap:.2f}/h: ${planned:.2f}/h planned + up to ${worst:.2f}/h for this slot "
                       f"would pass it ({reason}: {detail})")
            # A replace still destroys its instance (it is dead or must go); only the new rental is held.
            actions[index] = (Delete(slot, pool.name, reason, detail + "; not replaced: " + why_cap.split(" (")[0])
                              if is_replace else Hold(slot, pool.name, REASON_SPEND_CAP, why_cap))
            held.append(slot)
        if held:
            notes.append(f"spend cap ${cap:.2f}/h holds {len(held)} slot(s) ({', '.join(held)}): planned "
                         f"${planned:.2f}/h; raise max_total_dph or lower a pool's count/price to fill them")

    # Extra slots: highest index first, so a later partial run leaves the lowest slots standing.
    extra = [s for s in observed.values() if s.slot not in wanted]
    for seen in sorted(extra, key=lambda s: (s.pool, -_slot_index(s.slot), s.slot)):
        try:
            pool_spec = spec.pool(seen.pool)
            reason, detail = REASON_SCALED_DOWN, f"pool {seen.pool} count is {pool_spec.count}"
            if pool_spec.min_count is not None:
                detail = (f"pool {seen.pool} has {pool_spec.count} slot(s) (autoscaled within "
                          f"{pool_spec.bounds[0]}..{pool_spec.bounds[1]}: fleet-spec/capacity.yaml)")
        except KeyError:
            reason, detail = REASON_POOL_REMOVED, f"pool {seen.pool} is no longer in the spec"
        actions.append(Delete(seen.slot, seen.pool, reason, detail))

    if records.problems:
        notes.append(f"{len(records.problems)} record file(s) unreadable; their machines are treated as bad")
    return SlotPlan(tuple(actions), tuple(notes), pauses)


def _slot_index(slot: str) -> int:
    tail = slot.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1
