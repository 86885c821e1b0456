"""Orphan sweep: instances that carry this fleet's label but belong to no slot. Pure.

Place in the flow: after `fleet apply` has carried out its plan (and a create has adopted what an interrupted
run rented for a desired slot), every instance on the market whose label starts with the fleet's prefix
(`gpu-fleet/<name>/`) is matched against the slot state:
- its contract is a slot's instance -> ours, nothing to do;
- its slot already has another instance -> a duplicate (two instances for one slot, e.g. a create that
  committed after its client gave up and rented again): destroyed at once, the slot's own instance kept;
- otherwise (a removed pool, a lowered count, lost state, a crashed create whose slot was filled since) ->
  an orphan: listed with its $/h, destroyed once it is older than the grace period.
Instances without the prefix are never looked at: they are not ours (a human's, another fleet's).
Each destruction is recorded (`orphan_record`) and committed with its evidence by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from reconciler.domain.json_numbers import json_number
from reconciler.domain.marketplace import Instance

KIND_DUPLICATE = "duplicate"
KIND_ORPHAN = "orphan"

#: An orphan younger than this is left alone: it may be a create in flight (another apply, a Pulumi run).
DEFAULT_GRACE_S = 20 * 60.0

#: The marketplace view `fleet apply` leaves in its state directory for `fleet status --state-dir`.
MARKET_VIEW_FILE = "market.json"

#: Where destroyed orphans are recorded, one file per instance (committed to git by `fleet apply`).
ORPHAN_RECORD_DIR = "marketplace/destroyed"


@dataclass(frozen=True)
class Orphan:
    contract_id: str
    label: str
    slot: str | None  # None: the label carries our prefix but no slot we can read
    kind: str  # KIND_DUPLICATE | KIND_ORPHAN
    why: str
    machine_id: str
    host_id: str
    status: str
    price_usd_per_hour: float | None
    started_at: float | None  # epoch seconds (the market's start_date)
    age_s: float | None
    due: bool  # destroy now

    def to_json(self) -> dict[str, object]:
        return {"contract_id": self.contract_id, "label": self.label, "slot": self.slot, "kind": self.kind,
                "why": self.why, "machine_id": self.machine_id, "host_id": self.host_id, "status": self.status,
                "price_usd_per_hour": self.price_usd_per_hour, "started_at": self.started_at, "age_s": self.age_s,
                "due": self.due}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> Orphan:
        def num(key: str) -> float | None:
            return json_number(doc.get(key))

        slot = doc.get("slot")
        return cls(contract_id=str(doc["contract_id"]), label=str(doc["label"]),
                   slot=slot if isinstance(slot, str) else None, kind=str(doc["kind"]), why=str(doc["why"]),
                   machine_id=str(doc["machine_id"]), host_id=str(doc["host_id"]), status=str(doc["status"]),
                   price_usd_per_hour=num("price_usd_per_hour"), started_at=num("started_at"), age_s=num("age_s"),
                   due=bool(doc.get("due")))

    def describe(self) -> str:
        price = "?" if self.price_usd_per_hour is None else f"${self.price_usd_per_hour:.2f}/h"
        age = "age unknown" if self.age_s is None else f"{self.age_s / 60:.0f} min old"
        return (f"{self.kind} instance {self.contract_id} ({self.label}, machine {self.machine_id}, {self.status}, "
                f"{price}, {age}): {self.why}")


def _slot_of(label: str, prefix: str) -> str | None:
    instance_id = label[len(prefix):]
    slot, sep, nonce = instance_id.rpartition("-")
    if not sep or not slot or len(nonce) != 6 or any(c not in "0123456789abcdef" for c in nonce):
        return None
    return slot


def find_orphans(instances: Iterable[Instance], label_prefix: str, slot_contracts: Mapping[str, str],
                 desired_slots: Iterable[str], now_s: float, grace_s: float = DEFAULT_GRACE_S) -> list[Orphan]:
    """Every instance with `label_prefix` that no slot owns (`slot_contracts`: slot -> its contract id)."""
    owned = set(slot_contracts.values())
    desired = set(desired_slots)
    found: list[Orphan] = []
    for instance in instances:
        label = instance.label or ""
        if not label.startswith(label_prefix) or instance.contract_id in owned:
            continue
        slot = _slot_of(label, label_prefix)
        age = None if instance.start_date is None else max(0.0, now_s - instance.start_date)
        if slot is not None and slot in slot_contracts:
            kind, due = KIND_DUPLICATE, True
            why = (f"slot {slot} already has instance {slot_contracts[slot]}: two instances for one slot "
                   "(a create that committed late, then rented again); keeping the slot's own")
        else:
            kind, due = KIND_ORPHAN, age is not None and age >= grace_s
            if slot is None:
                why = "its label carries this fleet's prefix but names no slot"
            elif slot in desired:
                why = f"slot {slot} has no instance recorded and this one cannot serve it (dead, other image or bad)"
            else:
                why = f"slot {slot} is not in the spec (pool removed or count lowered)"
            why += f"; destroyed after {grace_s / 60:g} min" if not due else f"; older than {grace_s / 60:g} min"
        found.append(Orphan(instance.contract_id, label, slot, kind, why, instance.machine_id, instance.host_id,
                            instance.status, instance.price_usd_per_hour, instance.start_date, age, due))
    return sorted(found, key=lambda o: (not o.due, o.contract_id))


def orphan_record(orphan: Orphan, destroyed_at: datetime, fleet: str) -> str:
    """The YAML evidence committed for one destroyed instance (hand-written: no YAML library in domain)."""
    def q(value: object) -> str:
        if value is None:
            return "null"
        if isinstance(value, int | float) and not isinstance(value, bool):
            return repr(value)
        text = str(value).replace("\\", "\\\\").replace('"', '\\"')
        return f'"{text}"'

    started = (datetime.fromtimestamp(orphan.started_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
               if orphan.started_at is not None else None)
    lines = [
        f"# Destroyed by `fleet apply`: {orphan.kind} instance of fleet {fleet}. Evidence as seen on the market.",
        f"contract_id: {q(orphan.contract_id)}",
        f"label: {q(orphan.label)}",
        f"slot: {q(orphan.slot)}",
        f"kind: {q(orphan.kind)}",
        f"why: {q(orphan.why)}",
        f"machine_id: {q(orphan.machine_id)}",
        f"host_id: {q(orphan.host_id)}",
        f"status: {q(orphan.status)}",
        f"price_usd_per_hour: {q(orphan.price_usd_per_hour)}",
        f"started_at: {q(started)}",
        f"age_minutes: {q(None if orphan.age_s is None else round(orphan.age_s / 60, 1))}",
        f"destroyed_at: {q(destroyed_at.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ'))}",
        "blame: marketplace  # never the machine: an orphan says nothing about the hardware",
    ]
    return "\n".join(lines) + "\n"
