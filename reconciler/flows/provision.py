"""Provision: converge the fleet to the spec without a Pulumi engine (the flow behind `fleet apply`).

The second driver of the slot planner (the first is the Pulumi program in infra/): load the spec and the
records, observe the slots this state directory knows (refreshed from the marketplace), `planner.plan()`,
then carry out each action through `SlotProvider` - the same CRUD Pulumi's dynamic provider runs.
Used by `fleet demo` with the local backend and by operators without Pulumi.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from reconciler.adapters.atomic_files import write_text_atomic
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
from reconciler.adapters.spec_files import load_spec_cached
from reconciler.domain import errors
from reconciler.domain.marketplace import MarketplaceAuthError, MarketplaceError, MarketplaceRateLimitedError
from reconciler.domain.planner import (
    STATUS_GONE,
    Create,
    Delete,
    Hold,
    Keep,
    Replace,
    SlotAction,
    SlotPlan,
    desired_slots,
    plan,
)
from reconciler.domain.records import RecordSet
from reconciler.domain.slots import SlotError, SlotOutputs, digest_of_image_ref, slot_inputs
from reconciler.domain.spec import FleetSpec, SpecError
from reconciler.domain.sweep import (
    DEFAULT_GRACE_S,
    MARKET_VIEW_FILE,
    ORPHAN_RECORD_DIR,
    Orphan,
    find_orphans,
    orphan_record,
)
from reconciler.domain.tokens import SecretError, check_secret

if TYPE_CHECKING:
    from reconciler.adapters.git import GitStore

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
    #: The market asked us not to try before this many seconds (a 429 with a long Retry-After).
    retry_after_s: float | None = None


@dataclass(frozen=True)
class ApplyReport:
    plan: SlotPlan
    results: tuple[ActionResult, ...]
    notes: tuple[str, ...] = ()
    slots: Mapping[str, SlotOutputs] = field(default_factory=dict)
    #: Instances with this fleet's label that no slot owns, as the sweep left them (not destroyed).
    orphans: tuple[Orphan, ...] = ()
    #: Duplicates and orphans this run destroyed (each committed with its evidence).
    destroyed: tuple[Orphan, ...] = ()

    @property
    def failed(self) -> tuple[ActionResult, ...]:
        return tuple(r for r in self.results if not r.ok)

    @property
    def converged(self) -> bool:
        return not self.failed and not self.plan.held and not self.plan.capped


@dataclass(frozen=True)
class Image:
    """What the marketplace runs and the digest that identifies it."""

    ref: str
    digest: str
    params_dir: str | None = None


# --- the driver (callable without argparse: `fleet demo` and tests use it) ---------------------------------


#: Commits the evidence of destroyed duplicates/orphans (`fleet apply --workdir`); None: do not destroy them.
OrphanRecorder = Callable[[Sequence[Orphan], datetime], None]



def apply_fleet(spec: FleetSpec, records: RecordSet, provider: SlotProvider, state_path: Path, image: Image,
                now: datetime, echo: Callable[[str], None] = print, *, recorder: OrphanRecorder | None = None,
                orphan_grace_s: float = DEFAULT_GRACE_S) -> ApplyReport:
    """Observe -> plan -> act -> sweep. Every action's outcome is saved before the next one starts.

    A refused API key (MarketplaceAuthError) stops the run where it is: what was done is saved, nothing is
    dropped, destroyed or recorded on it, and the error propagates to the caller."""
    stored = load_slot_state(state_path)
    observed = provider.observe(stored)
    # Record what we just saw, so a crash below still leaves fresh statuses behind.
    stored = {s: replace(o, status=observed[s].status, status_since=observed[s].status_since)
              for s, o in stored.items()}
    slot_plan = plan(spec, observed, records, image.digest, now)
    for note in slot_plan.notes:
        echo(f"note    {note}")
    results: list[ActionResult] = []
    try:
        for action in slot_plan.actions:
            if isinstance(action, Keep | Hold):
                if action.reason:
                    echo(f"{action.kind:<7} {action.slot:<20} {action.reason}: {action.detail}")
                continue
            result = _carry_out(action, spec, records, provider, stored, image, now)
            save_slot_state(state_path, stored)
            results.append(result)
            echo(result.message)
    finally:
        save_slot_state(state_path, stored)
    orphans, destroyed, notes = sweep_market(spec, provider, stored, now, echo, recorder, orphan_grace_s)
    waits = [r for r in results if r.retry_after_s is not None]
    write_market_view(state_path.parent / MARKET_VIEW_FILE, spec, stored, orphans, now,
                      waits=[(now + timedelta(seconds=r.retry_after_s or 0.0), r.message) for r in waits])
    return ApplyReport(slot_plan, tuple(results), slot_plan.notes + notes, dict(stored), orphans, destroyed)


def sweep_market(spec: FleetSpec, provider: SlotProvider, stored: Mapping[str, SlotOutputs], now: datetime,
                 echo: Callable[[str], None], recorder: OrphanRecorder | None,
                 grace_s: float) -> tuple[tuple[Orphan, ...], tuple[Orphan, ...], tuple[str, ...]]:
    """Find instances with the fleet's label that no slot owns; destroy the duplicates and the orphans past
    their grace period, then commit their evidence. (remaining orphans, destroyed, notes)"""
    try:
        instances = provider.fleet_instances(spec.label_prefix)
    except MarketplaceAuthError:
        raise
    except MarketplaceError as exc:
        note = f"orphan sweep skipped: cannot list the market's instances ({describe_error(exc)})"
        echo(f"note    {note}")
        return (), (), (note,)
    found = find_orphans(instances, spec.label_prefix, {s: o.contract_id for s, o in stored.items()},
                         desired_slots(spec), now.timestamp(), grace_s)
    remaining: list[Orphan] = []
    destroyed: list[Orphan] = []
    notes: list[str] = []
    for orphan in found:
        echo(f"{orphan.kind:<7} {orphan.describe()}")
        if not orphan.due:
            remaining.append(orphan)
            continue
        if recorder is None:
            remaining.append(orphan)
            notes.append(f"{orphan.kind} instance {orphan.contract_id} ({orphan.label}) is due for destruction but "
                         "was kept: run `fleet apply --workdir CLONE` so each destruction is committed with its "
                         "evidence")
            echo(f"note    {notes[-1]}")
            continue
        try:
            provider.marketplace.destroy_instance(orphan.contract_id)
        except MarketplaceAuthError:
            if destroyed:
                recorder(destroyed, now)
            raise
        except MarketplaceError as exc:
            remaining.append(orphan)
            notes.append(f"could not destroy {orphan.kind} instance {orphan.contract_id}: {describe_error(exc)}")
            echo(f"note    {notes[-1]}")
            continue
        destroyed.append(orphan)
        echo(f"destroy {orphan.kind} instance {orphan.contract_id} ({orphan.label}) -> destroyed")
    if destroyed and recorder is not None:
        recorder(destroyed, now)
    return tuple(remaining), tuple(destroyed), tuple(notes)


def write_market_view(path: Path, spec: FleetSpec, stored: Mapping[str, SlotOutputs], orphans: Sequence[Orphan],
                      now: datetime, *, waits: Sequence[tuple[datetime, str]] = ()) -> None:
    """What `fleet status --state-dir` shows about the market: spend against the cap, orphans with their $/h, and
    the waits the market asked for (a 429 with a long Retry-After: no call before `until`, counted from `now`,
    the apply's start, so at most the apply's own duration early; the adapter itself holds the exact time)."""
    slot_spend = sum(o.price_usd_per_hour for o in stored.values())
    orphan_spend = sum(o.price_usd_per_hour or 0.0 for o in orphans)
    doc = {"version": 1, "at": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "fleet": spec.name,
           "label_prefix": spec.label_prefix, "max_total_dph": spec.max_total_dph,
           "slots_usd_per_hour": round(slot_spend, 4), "orphans_usd_per_hour": round(orphan_spend, 4),
           "orphans": [o.to_json() for o in orphans]}
    if waits:
        until, why = max(waits, key=lambda w: w[0])
        doc["market_wait"] = {"until": until.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "why": why}
    write_text_atomic(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def git_orphan_recorder(store: GitStore, fleet: str, echo: Callable[[str], None] = print) -> OrphanRecorder:
    """Commits one evidence file per destroyed instance (`fleet-spec/marketplace/destroyed/<contract>.yaml`)
    in one commit, and pushes it, through the bot clone's GitStore."""

    from reconciler.adapters.git import CommitRequest, FileChange  # gitpython: only when recording

    def record(destroyed: Sequence[Orphan], now: datetime) -> None:
        spend = sum(o.price_usd_per_hour or 0.0 for o in destroyed)
        changes = tuple(FileChange(f"fleet-spec/{ORPHAN_RECORD_DIR}/{o.contract_id}.yaml",
                                   orphan_record(o, now, fleet)) for o in destroyed)
        kinds = sorted({o.kind for o in destroyed})
        request = CommitRequest(
            summary=f"marketplace: destroyed {len(destroyed)} {'/'.join(kinds)} instance(s) of fleet {fleet} "
                    f"(${spend:.2f}/h)",
            body="\n".join(f"- {o.describe()}" for o in destroyed),
            trailers=tuple(("Fleet-Orphan", f"{o.contract_id} {o.label}") for o in destroyed),
            changes=changes)
        result = store.publish(lambda _workdir: request)
        echo(f"record  committed {result.commit} ({len(destroyed)} destroyed instance(s), pushed={result.pushed})")

    return record


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
        retest = action.retest_machine if isinstance(action, Create | Replace) else None
        inputs = slot_inputs(spec, pool, action.slot, records, image=image.ref, image_digest=image.digest,
                             params_dir=image.params_dir, now=now,
                             retest_machine_ids=frozenset({retest}) if retest else frozenset())
        out = provider.create(inputs)
        stored[action.slot] = out
        rate = "?" if out.expected_proofs_per_hour is None else f"{out.expected_proofs_per_hour:.0f}"
        return ActionResult(action, True, f"{head} {why} -> rented machine {out.machine_id} ({out.gpu_name}, "
                                          f"${out.price_usd_per_hour:.2f}/h, ~{rate} proofs/h by {out.ranking_basis})"
                                          f" as {out.instance_id} [contract {out.contract_id}]", out)
    except MarketplaceAuthError:
        raise  # stops the whole run: every later call would be refused too
    except (SlotError, MarketplaceError) as exc:
        temporary = is_temporary(exc)
        kind = "temporary" if temporary else "permanent"
        return ActionResult(action, False, f"FAILED  {action.kind} {action.slot} ({kind}): {describe_error(exc)}",
                            temporary=temporary,
                            retry_after_s=exc.retry_after_s if isinstance(exc, MarketplaceRateLimitedError) else None)


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
        spec = load_spec_cached(spec_path)
    except SpecError as exc:
        raise ApplyError(str(exc)) from None
    records = load_indexed(spec_path.parent)
    for problem in records.problems:
        print(f"warning: {problem} (its machine is treated as bad)", file=out)
    return spec, records
