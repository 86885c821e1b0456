"""Slot provider: create, read and delete the one instance behind a pool slot over a `Marketplace`.

The same CRUD serves both drivers (one planner, two drivers): the Pulumi dynamic provider
(`reconciler.adapters.pulumi_provider`) and `fleet apply` (`reconciler.flows.provision`), which keeps its
slots in a state file (`slots.json`, here too). No Pulumi import here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.settings import CONTROLLER_SECRET_ENV, settings
from reconciler.domain.marketplace import (
    Instance,
    InstanceRequest,
    Marketplace,
    MarketplaceAuthError,
    MarketplaceError,
    OfferTakenError,
    TemporaryMarketplaceError,
    is_truncated,
)
from reconciler.domain.planner import (
    STATUS_GONE,
    ObservedSlot,
)
from reconciler.domain.ranking import offer_query, rank_offers
from reconciler.domain.slots import (
    NoOfferError,
    PoolPausedError,
    SlotDiff,
    SlotError,
    SlotInputError,
    SlotInputs,
    SlotOutputs,
    SpendCapError,
    broad_query,
    describe_constraints,
    describe_shortfall,
    instance_of_label,
    new_nonce,
    slot_diff,
    slot_of_instance,
    worker_env,
)
from reconciler.domain.tokens import instance_token, machine_claim

log = logging.getLogger(__name__)

#: Offers tried per create: the best one may have been rented a moment ago - by someone else, or by a
#: sibling slot that Pulumi creates in parallel from the same ranking.
CREATE_ATTEMPTS = 8



# --- the provider ----------------------------------------------------------------------------------------


class SlotProvider:
    """CRUD of one slot's instance over a `Marketplace`. No Pulumi, no files: drivers own state."""

    def __init__(self, marketplace: Marketplace, controller_secret: bytes, *,
                 nonce: Callable[[], str] = new_nonce, clock: Callable[[], float] = time.time,
                 on_destroyed: Callable[[SlotOutputs], None] | None = None, image_login: str | None = None):
        """`image_login`: registry credentials for pulling a private image (vast's `-u USER -p PASS SERVER`)."""
        self.marketplace = marketplace
        self._image_login = image_login
        self._secret = controller_secret
        self._nonce = nonce
        self._clock = clock
        self._on_destroyed = on_destroyed
        self._create_lock = threading.Lock()

    def create(self, inputs: SlotInputs) -> SlotOutputs:
        """Rent an instance for the slot - or adopt the one a killed run rented for it (same slot label).

        Offer taken (`no_such_ask`) -> the next offer; a refused key stops at once (MarketplaceAuthError);
        with a spend cap, only offers that keep every instance of this fleet under it are tried."""
        if inputs.paused_reason:
            raise PoolPausedError(f"slot {inputs.slot}: {inputs.paused_reason}")
        with self._create_lock:  # the cap is checked and used by one create at a time (Pulumi runs threads)
            ours = self.fleet_instances(inputs.label_prefix)
            adopted = self._adoptable(inputs, ours)
            if adopted is not None:
                return adopted
            return self._rent(inputs, ours)

    def fleet_instances(self, label_prefix: str) -> list[Instance]:
        """Every instance carrying this fleet's label prefix (nothing else is ever ours to touch)."""
        return [i for i in self.marketplace.list_instances() if i.label and i.label.startswith(label_prefix)]

    def _adoptable(self, inputs: SlotInputs, ours: list[Instance]) -> SlotOutputs | None:
        """An instance a previous, interrupted run rented for this very slot and never recorded: take it
        instead of renting a second one, if it can still serve (alive, desired image, machine not bad)."""
        mine = [i for i in ours if (iid := instance_of_label(i.label, inputs.label_prefix)) is not None
                and slot_of_instance(iid) == inputs.slot and not i.is_dead
                and i.machine_id not in inputs.bad_machine_ids and i.image == inputs.image]
        if not mine:
            return None
        instance = max(mine, key=lambda i: int(i.contract_id) if i.contract_id.isdigit() else 0)
        instance_id = instance_of_label(instance.label, inputs.label_prefix)
        assert instance_id is not None
        log.warning("slot %s: adopting instance %s (contract %s) that an earlier run rented for it", inputs.slot,
                    instance_id, instance.contract_id)
        return SlotOutputs(
            slot=inputs.slot, pool_name=inputs.pool.name, instance_id=instance_id, contract_id=instance.contract_id,
            machine_id=instance.machine_id, host_id=instance.host_id, gpu_name=instance.gpu_name or "",
            price_usd_per_hour=instance.price_usd_per_hour or inputs.pool.max_price_usd_per_hour,
            image=inputs.image, image_digest=inputs.image_digest, status=instance.status,
            ranking_basis="adopted", created_at=instance.start_date or self._clock(), status_since=self._clock(),
            label=instance.label)

    def _rent(self, inputs: SlotInputs, ours: list[Instance]) -> SlotOutputs:
        query = offer_query(inputs.pool, inputs.bad_machine_ids)
        offers = self.marketplace.search_offers(query)
        ranked = rank_offers(offers, inputs.pool, inputs.measured, inputs.priors, inputs.bad_machine_ids)
        if inputs.retest_machine_ids:
            # A retest (domain/correlation.py): the same machine again while it is offered, then the usual order.
            ranked = sorted(ranked, key=lambda c: c.offer.machine_id not in inputs.retest_machine_ids)
        if not ranked and is_truncated(offers):
            # The market cut its answer short: the offers it left out may fit. Never a shortfall.
            raise NoOfferError(f"slot {inputs.slot}: none of the {len(offers)} offer(s) kept from the market's "
                               f"answer fits pool {inputs.pool.name}, and that answer was truncated (cut short by "
                               "the server): the market may hold more; not reading it as a shortfall; will retry "
                               "on the next apply")
        if not ranked:
            raise NoOfferError(f"slot {inputs.slot}: no offer fits pool {inputs.pool.name}: "
                               f"{self._shortfall(inputs)} (pool wants {describe_constraints(inputs.pool)}; "
                               f"{len(inputs.bad_machine_ids)} bad machine(s) excluded); will retry on the next "
                               "apply (under Pulumi: the hourly `pulumi up`)")
        if inputs.max_total_dph is not None:
            spend = sum(i.price_usd_per_hour or 0.0 for i in ours)
            room = inputs.max_total_dph - spend
            affordable = [c for c in ranked if c.offer.price_usd_per_hour <= room + 1e-9]
            if not affordable:
                cheapest = min(c.offer.price_usd_per_hour for c in ranked)
                raise SpendCapError(
                    f"slot {inputs.slot}: fleet spend cap ${inputs.max_total_dph:.2f}/h: {len(ours)} instance(s) of "
                    f"this fleet cost ${spend:.2f}/h and the cheapest fitting offer (${cheapest:.2f}/h) would pass "
                    "it; not renting (raise max_total_dph or lower a pool's count)")
            ranked = affordable
        instance_id = f"{inputs.slot}-{self._nonce()}"
        label = inputs.label_prefix + instance_id
        token = instance_token(self._secret, instance_id)
        errors: list[str] = []
        for candidate in ranked[:CREATE_ATTEMPTS]:
            request = InstanceRequest(image=inputs.image, disk_gb=inputs.pool.disk_gb, label=label,
                                      env=worker_env(inputs, instance_id, token, candidate,
                                                     machine_claim(self._secret, instance_id,
                                                                   candidate.offer.machine_id)),
                                      image_login=self._image_login)
            try:
                contract_id = self.marketplace.create_instance(candidate.offer.offer_id, request)
            except OfferTakenError as exc:
                # Someone rented it after our search (or a sibling slot did): the next offer may be free.
                errors.append(f"{candidate.describe()}: {exc}")
                continue
            log.info("slot %s: rented %s as %s (contract %s)", inputs.slot, candidate.describe(), instance_id,
                     contract_id)
            now = self._clock()
            return SlotOutputs(
                slot=inputs.slot, pool_name=inputs.pool.name, instance_id=instance_id, contract_id=str(contract_id),
                machine_id=candidate.offer.machine_id, host_id=candidate.offer.host_id,
                gpu_name=candidate.offer.gpu_name, price_usd_per_hour=candidate.offer.price_usd_per_hour,
                image=inputs.image, image_digest=inputs.image_digest, status="loading",
                expected_proofs_per_hour=candidate.expected_proofs_per_hour, ranking_basis=candidate.basis,
                created_at=now, status_since=now, label=label)
        raise NoOfferError(f"slot {inputs.slot}: every candidate offer was taken before we could rent it: "
                           + "; ".join(errors))

    def _shortfall(self, inputs: SlotInputs) -> str:
        """What the market lacked, from a second, broad search (GPU model only). Best effort: a failed look
        must not hide the NoOffer itself."""
        try:
            broad = self.marketplace.search_offers(broad_query(inputs.pool))
            said = describe_shortfall(inputs.pool, inputs.bad_machine_ids, broad)
            return said + (" (the market's answer was truncated: counts are a lower bound)"
                           if is_truncated(broad) else "")
        except MarketplaceAuthError:
            raise
        except MarketplaceError as exc:
            return f"could not look at the market more broadly ({exc})"

    def diff(self, old: SlotOutputs, new: SlotInputs) -> SlotDiff:
        return slot_diff(old, new)

    def read(self, old: SlotOutputs) -> SlotOutputs | None:
        """The slot as the market sees it now; None when the market no longer knows the instance.
        `status_since` moves only when the status changes (the status table's deadlines count from it)."""
        instance = self.marketplace.get_instance(old.contract_id)
        if instance is None:
            return None
        since = old.status_since if old.status_since is not None else old.created_at
        if instance.status != old.status or since is None:
            since = self._clock()
        return replace(old, status=instance.status, status_since=since,
                       price_usd_per_hour=instance.price_usd_per_hour or old.price_usd_per_hour)

    def delete(self, old: SlotOutputs) -> None:
        self.marketplace.destroy_instance(old.contract_id)
        if self._on_destroyed is not None:
            # Telling the controller is a courtesy (it stops waiting for reports); failing it must not
            # leave a destroyed instance in state as if it still ran.
            try:
                self._on_destroyed(old)
            except Exception as exc:
                log.warning("slot %s: instance %s destroyed, but telling the controller failed: %s",
                            old.slot, old.instance_id, exc)

    def observe(self, stored: Mapping[str, SlotOutputs]) -> dict[str, ObservedSlot]:
        """Current state of every stored slot (market errors propagate: never plan on a failed look)."""
        out: dict[str, ObservedSlot] = {}
        for slot, outputs in stored.items():
            fresh = self.read(outputs)
            out[slot] = fresh.observed() if fresh is not None else replace(outputs, status=STATUS_GONE).observed()
        return out


# --- local worker-image digest ------------------------------------------------------------------------------

_DIGEST_SKIP = {"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def directory_digest(path: str | Path) -> str:
    """`sha256:` over every file of a worker-image directory (names, exec bits, contents).

    The local backend's stand-in for a registry digest: editing any script changes it, so the planner
    replaces the slots running the old one, exactly as a new pushed image does under Pulumi."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"worker image directory {root} not found")
    h = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file() and not (_DIGEST_SKIP & set(p.parts))):
        rel = file.relative_to(root).as_posix()
        executable = bool(file.stat().st_mode & stat.S_IXUSR)
        h.update(f"{rel}\0{int(executable)}\0".encode())
        h.update(hashlib.sha256(file.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


# --- `fleet apply` slot state file ----------------------------------------------------------------------

SLOT_STATE_FILE = "slots.json"


def load_slot_state(path: Path) -> dict[str, SlotOutputs]:
    """Slot -> outputs, as the last `fleet apply` left them. Missing file: no slots yet."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise SlotInputError(f"{path}: unreadable slot state ({exc}); fix or move it away (instances it "
                             "lists keep running and would be forgotten)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("slots"), dict):
        raise SlotInputError(f"{path}: expected {{\"version\": 1, \"slots\": {{...}}}}")
    return {slot: SlotOutputs.from_props(props) for slot, props in doc["slots"].items()}


def save_slot_state(path: Path, slots: Mapping[str, SlotOutputs]) -> None:
    doc = {"version": 1, "slots": {s: o.to_props() for s, o in sorted(slots.items())}}
    write_text_atomic(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


# --- marketplace from settings (both drivers) --------------------------------------------------------------


def image_login_from(secret_values: Mapping[str, str]) -> str | None:
    """The market's pull credentials for the pushed image (the push credentials serve: same registry)."""
    parts = [secret_values.get(k) for k in ("registry_username", "registry_password", "registry_server")]
    if not all(parts):
        return None
    user, password, server = parts
    return f"-u {user} -p {password} {server}"


def controller_secret_from(secret_values: Mapping[str, str]) -> bytes:
    from_env = settings().controller_secret
    value = secret_values.get("controller_secret") or (from_env.reveal() if from_env else None)
    if not value:
        raise SlotInputError("no controller secret: set the stack config secret gpu-fleet:controllerSecret "
                             f"(pulumi config set --secret controllerSecret ...) or {CONTROLLER_SECRET_ENV}")
    return value.encode("utf-8")


def is_temporary(exc: BaseException) -> bool:
    """Whether a failed slot action is worth retrying on a later apply."""
    if isinstance(exc, SlotError):
        return exc.temporary
    return isinstance(exc, TemporaryMarketplaceError)


def describe_error(exc: BaseException) -> str:
    """One line for the operator: our own errors already say what happened; others get their type."""
    return str(exc) if isinstance(exc, SlotError | MarketplaceError) else f"{type(exc).__name__}: {exc}"
