"""Provision: converge the fleet to the spec without a Pulumi engine (the flow behind `fleet apply`).

The second driver of the slot planner (the first is the Pulumi program in infra/): load the spec and the
records, observe the slots this state directory knows (refreshed from the marketplace), `planner.plan()`,
then carry out each action through `SlotProvider` - the same CRUD Pulumi's dynamic provider runs.
Used by `fleet demo` with the local backend and by operators without Pulumi.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TextIO

from reconciler.adapters.marketplace import backend_named
from reconciler.adapters.record_index import load_indexed
from reconciler.adapters.slot_provider import (
    SlotProvider,
    controller_secret_from,
    describe_error,
    directory_digest,
    is_temporary,
    load_slot_state,
    save_slot_state,
)
from reconciler.adapters.spec_files import load_spec
from reconciler.domain import errors
from reconciler.domain.marketplace import MarketplaceError
from reconciler.domain.planner import STATUS_GONE, Delete, Hold, Keep, Replace, SlotAction, SlotPlan, plan
from reconciler.domain.records import RecordSet
from reconciler.domain.slots import SlotError, SlotOutputs, digest_of_image_ref, slot_inputs
from reconciler.domain.spec import FleetSpec, SpecError
from reconciler.domain.tokens import SecretError, check_secret

DEFAULT_SPEC = Path("fleet-spec/fleet.yaml")
DEFAULT_STATE_DIR = Path(".fleet/state")


class ApplyError(errors.PermanentError):
    """A user-facing problem with the command's inputs (spec, backend settings, image). Exit 1, no traceback."""


@dataclass(frozen=True)
class ActionResult:
    action: SlotAction
    ok: bool
    message: str
    outputs: SlotOutputs | None = None
    temporary: bool = False


@dataclass(frozen=True)
class ApplyReport:
    plan: SlotPlan
    results: tuple[ActionResult, ...]
    notes: tuple[str, ...] = ()
    slots: Mapping[str, SlotOutputs] = field(default_factory=dict)

    @property
    def failed(self) -> tuple[ActionResult, ...]:
        return tuple(r for r in self.results if not r.ok)

    @property
    def converged(self) -> bool:
        return not self.failed and not self.plan.held


@dataclass(frozen=True)
class Image:
    """What the marketplace runs and the digest that identifies it."""

    ref: str
    digest: str
    params_dir: str | None = None


# --- the driver (callable without argparse: `fleet demo` and tests use it) ---------------------------------


def apply_fleet(spec: FleetSpec, records: RecordSet, provider: SlotProvider, state_path: Path, image: Image,
                now: datetime, echo: Callable[[str], None] = print) -> ApplyReport:
    """Observe -> plan -> act. Every action's outcome is saved before the next one starts."""
    stored = load_slot_state(state_path)
    observed = provider.observe(stored)
    # Record what we just saw, so a crash below still leaves fresh statuses behind.
    stored = {s: replace(o, status=observed[s].status) for s, o in stored.items()}
    slot_plan = plan(spec, observed, records, image.digest, now)
    for note in slot_plan.notes:
        echo(f"note    {note}")
    results: list[ActionResult] = []
    for action in slot_plan.actions:
        if isinstance(action, Keep | Hold):
            if action.reason:
                echo(f"{action.kind:<7} {action.slot:<20} {action.reason}: {action.detail}")
            continue
        result = _carry_out(action, spec, records, provider, stored, image, now)
        save_slot_state(state_path, stored)
        results.append(result)
        echo(result.message)
    save_slot_state(state_path, stored)
    return ApplyReport(slot_plan, tuple(results), slot_plan.notes, dict(stored))


def _carry_out(action: SlotAction, spec: FleetSpec, records: RecordSet, provider: SlotProvider,
               stored: dict[str, SlotOutputs], image: Image, now: datetime) -> ActionResult:
    head = f"{action.kind:<7} {action.slot:<20}"
    why = f"{action.reason}: {action.detail}" if action.detail else action.reason
    old = stored.get(action.slot)
    try:
        if isinstance(action, Delete | Replace) and old is not None:
            provider.delete(old)
            del stored[action.slot]
        elif old is not None and old.status == STATUS_GONE:
            del stored[action.slot]  # the market forgot it: nothing to destroy
        if isinstance(action, Delete):
            gone = f"destroyed {old.instance_id} on machine {old.machine_id}" if old else "nothing to destroy"
            return ActionResult(action, True, f"{head} {why} -> {gone}")
        pool = spec.pool(action.pool)
        inputs = slot_inputs(spec, pool, action.slot, records, image=image.ref, image_digest=image.digest,
                             params_dir=image.params_dir, now=now)
        out = provider.create(inputs)
        stored[action.slot] = out
        rate = "?" if out.expected_proofs_per_hour is None else f"{out.expected_proofs_per_hour:.0f}"
        return ActionResult(action, True, f"{head} {why} -> rented machine {out.machine_id} ({out.gpu_name}, "
                                          f"${out.price_usd_per_hour:.2f}/h, ~{rate} proofs/h by {out.ranking_basis})"
                                          f" as {out.instance_id} [contract {out.contract_id}]", out)
    except (SlotError, MarketplaceError) as exc:
        temporary = is_temporary(exc)
        kind = "temporary" if temporary else "permanent"
        return ActionResult(action, False, f"FAILED  {action.kind} {action.slot} ({kind}): {describe_error(exc)}",
                            temporary=temporary)


# --- resolving the command's inputs ---------------------------------------------------------------------


def resolve_image(backend: str, image: str | None, image_digest: str | None, spec: FleetSpec,
                  state_dir: Path) -> Image:
    if backend_named(backend).runs_image_directory:
        directory = Path(image or spec.image.context)
        if not directory.is_dir():
            raise ApplyError(f"--image {directory}: the local backend runs a worker-image directory; not found")
        try:
            digest = image_digest or directory_digest(directory)
        except OSError as exc:
            raise ApplyError(f"--image {directory}: cannot read: {exc}") from None
        return Image(str(directory.resolve()), digest, params_dir=str((state_dir / "params").resolve()))
    if not image:
        raise ApplyError("--image is required for the vastai backend: a registry reference pinned by digest "
                         "(repo@sha256:..., e.g. the Pulumi output image_repo_digest)")
    try:
        digest = digest_of_image_ref(image)
    except SlotError as exc:
        raise ApplyError(str(exc)) from None
    if image_digest and image_digest != digest:
        raise ApplyError(f"--image-digest {image_digest} disagrees with the digest in --image {image}")
    return Image(image, digest)


def read_controller_secret(path: Path | None) -> bytes:
    try:
        secret = path.read_bytes().strip() if path is not None else controller_secret_from({})
        return check_secret(secret)
    except OSError as exc:
        raise ApplyError(f"--controller-secret-file {path}: cannot read: {exc}") from None
    except (SecretError, SlotError) as exc:
        raise ApplyError(str(exc)) from None


def load_inputs(spec_path: Path, out: TextIO) -> tuple[FleetSpec, RecordSet]:
    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        raise ApplyError(str(exc)) from None
    records = load_indexed(spec_path.parent)
    for problem in records.problems:
        print(f"warning: {problem} (its machine is treated as bad)", file=out)
    return spec, records
