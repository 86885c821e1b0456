"""`fleet apply`: converge the fleet to the spec without a Pulumi engine.

The second driver of the slot planner (the first is the Pulumi program in infra/): load the spec and the
records, observe the slots this state directory knows (refreshed from the marketplace), `planner.plan()`,
then carry out each action through `provider.SlotProvider` - the same CRUD Pulumi's dynamic provider runs.
Used by `fleet demo` with the local backend and by operators without Pulumi.

State: `<state-dir>/slots.json` (slot -> instance outputs, rewritten atomically after every action, so an
interrupted apply forgets nothing it rented) and, for the local backend, `<state-dir>/market/`.
Exit 0 when converged; 1 with the reasons when an action failed or a pool is held by the circuit breaker.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from reconciler.controller_client import admin_client_from
from reconciler.marketplace.base import Marketplace, MarketplaceError
from reconciler.planner import (
    STATUS_GONE,
    Delete,
    Hold,
    Keep,
    Replace,
    SlotAction,
    SlotPlan,
    plan,
)
from reconciler.provider import (
    SLOT_STATE_FILE,
    SlotError,
    SlotOutputs,
    SlotProvider,
    build_marketplace,
    controller_secret_from,
    describe_error,
    digest_of_image_ref,
    directory_digest,
    is_temporary,
    load_slot_state,
    save_slot_state,
    slot_inputs,
)
from reconciler.records import RecordSet, load_records
from reconciler.spec import FleetSpec, SpecError, load_spec
from reconciler.tokens import SecretError, check_secret

DEFAULT_SPEC = Path("fleet-spec/fleet.yaml")
DEFAULT_STATE_DIR = Path(".fleet/state")


class ApplyError(Exception):
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
        result = _carry_out(action, spec, records, provider, stored, image)
        save_slot_state(state_path, stored)
        results.append(result)
        echo(result.message)
    save_slot_state(state_path, stored)
    return ApplyReport(slot_plan, tuple(results), slot_plan.notes, dict(stored))


def _carry_out(action: SlotAction, spec: FleetSpec, records: RecordSet, provider: SlotProvider,
               stored: dict[str, SlotOutputs], image: Image) -> ActionResult:
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
                             params_dir=image.params_dir)
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
    if backend == "local":
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


def make_marketplace(args: argparse.Namespace, state_dir: Path) -> Marketplace:
    if args.backend == "local":
        if not args.machines:
            raise ApplyError("the local backend needs --machines FILE (the declared local machines)")
        settings: dict[str, object] = {"kind": "local", "state_dir": str(state_dir / "market"),
                                       "machines_file": str(args.machines)}
        if getattr(args, "worker_command", None):
            settings["worker_command"] = shlex.split(args.worker_command)
    else:
        settings = {"kind": "vastai", "base_url": args.vast_base_url}
    try:
        return build_marketplace(settings, {})
    except (ValueError, MarketplaceError) as exc:
        raise ApplyError(str(exc)) from None


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
    records = load_records(spec_path.parent)
    for problem in records.problems:
        print(f"warning: {problem} (its machine is treated as bad)", file=out)
    return spec, records


def add_backend_arguments(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="fleet spec (default: %(default)s)")
    p.add_argument("--backend", choices=("local", "vastai"), required=required, default=None,
                   help="marketplace to act on")
    p.add_argument("--state-dir", type=Path, default=None if not required else DEFAULT_STATE_DIR,
                   help=f"slot state directory (default for apply: {DEFAULT_STATE_DIR})")
    p.add_argument("--machines", type=Path, help="local backend: YAML file of declared machines")
    p.add_argument("--image", help="local: worker-image directory (default: the spec's image.context); "
                                   "vastai: repo@sha256:... reference")
    p.add_argument("--image-digest", help="desired image digest (local default: sha256 over the image directory)")
    p.add_argument("--vast-base-url", default=None, help="vast.ai API base URL (tests point it at a fake)")
    p.add_argument("--worker-command", help=argparse.SUPPRESS)  # tests: a trivial stand-in for entrypoint.sh


# --- CLI ------------------------------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("apply", help="converge slots to the spec through the slot provider (no Pulumi engine)")
    add_backend_arguments(p, required=True)
    p.add_argument("--controller-secret-file", type=Path,
                   help="file holding the controller secret (default: $FLEET_CONTROLLER_SECRET)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    try:
        spec, records = load_inputs(args.spec, sys.stderr)
        state_dir: Path = args.state_dir
        image = resolve_image(args.backend, args.image, args.image_digest, spec, state_dir)
        secret = read_controller_secret(args.controller_secret_file)
        # With $FLEET_ADMIN_TOKEN set, destroyed instances are reported to the spec's controller.
        notifier = admin_client_from(spec.controller.url)
        provider = SlotProvider(make_marketplace(args, state_dir), secret,
                                on_destroyed=(lambda out: notifier.mark_destroyed(out.instance_id)) if notifier
                                else None)
        report = apply_fleet(spec, records, provider, state_dir / SLOT_STATE_FILE, image, datetime.now(UTC),
                             echo=lambda line: print(line, file=out))
    except ApplyError as exc:
        print(f"fleet apply: {exc}", file=sys.stderr)
        return 1
    except (SlotError, MarketplaceError) as exc:
        # Observation failed: nothing was changed (never act on a failed look).
        print(f"fleet apply: cannot observe the fleet, nothing changed: {describe_error(exc)}", file=sys.stderr)
        return 1
    return summarize(report, out)


def summarize(report: ApplyReport, out: TextIO) -> int:
    running = len(report.slots)
    if report.converged:
        changed = len(report.results)
        what = f"{changed} change(s)" if changed else "no changes"
        print(f"converged: {running} slot(s), {what}", file=out)
        return 0
    if report.failed:
        temporary = sum(r.temporary for r in report.failed)
        print(f"not converged: {len(report.failed)} action(s) failed ({temporary} temporary: run apply again "
              "later)", file=out)
    if report.plan.held:
        print(f"not converged: {len(report.plan.held)} slot(s) held by the circuit breaker "
              f"(pools: {', '.join(sorted(report.plan.paused))})", file=out)
    return 1
