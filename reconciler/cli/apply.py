"""`fleet apply`: converge the fleet to the spec without a Pulumi engine (see `reconciler.flows.provision`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from reconciler.adapters.marketplace import BACKENDS, backend_named, build_marketplace, settings_with_hosts
from reconciler.adapters.slot_provider import (
    SLOT_STATE_FILE,
    SlotProvider,
    describe_error,
)
from reconciler.adapters.spec_files import hosts_path
from reconciler.domain.marketplace import Marketplace, MarketplaceAuthError, MarketplaceError
from reconciler.domain.slots import SlotError
from reconciler.domain.sweep import DEFAULT_GRACE_S
from reconciler.flows.provision import (
    DEFAULT_SPEC,
    DEFAULT_STATE_DIR,
    ApplyError,
    ApplyReport,
    apply_fleet,
    git_orphan_recorder,
    load_inputs,
    read_controller_secret,
    resolve_image,
)


def make_marketplace(args: argparse.Namespace, state_dir: Path,
                     say: Callable[[str], None] | None = None) -> Marketplace:
    """`say`: where the adapter tells about its waits (pacing, rate limits, late commits)."""
    if getattr(args, "hosts", None) is None and hosts_path(args.spec).is_file():
        args.hosts = hosts_path(args.spec)  # the inventory beside the spec: its hosts are the fleet's too
    try:
        backend = backend_named(args.backend)
        market = build_marketplace(settings_with_hosts(backend.settings_from_options(vars(args), state_dir),
                                                       vars(args)), {})
    except (ValueError, MarketplaceError) as exc:
        raise ApplyError(str(exc)) from None
    if say is not None and hasattr(market, "notify"):
        market.notify = say
    return market


def add_backend_arguments(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="fleet spec (default: %(default)s)")
    p.add_argument("--backend", choices=sorted(BACKENDS), required=required, default=None,
                   help="marketplace to act on")
    p.add_argument("--state-dir", type=Path, default=None if not required else DEFAULT_STATE_DIR,
                   help=f"slot state directory (default for apply: {DEFAULT_STATE_DIR})")
    p.add_argument("--machines", type=Path, help="local backend: YAML file of declared machines")
    p.add_argument("--image", help="local: worker-image directory (default: the spec's image.context); "
                                   "vastai: repo@sha256:... reference")
    p.add_argument("--image-digest", help="desired image digest (local default: sha256 over the image directory)")
    p.add_argument("--vast-base-url", default=None, help="vast.ai API base URL (tests point it at a fake)")
    p.add_argument("--hosts", type=Path, default=None,
                   help="owned Docker hosts inventory, beside any backend (default: hosts.yaml beside the spec, "
                        "when there is one)")
    p.add_argument("--worker-command", help=argparse.SUPPRESS)  # tests: a trivial stand-in for entrypoint.sh


# --- CLI ------------------------------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("apply", help="converge slots to the spec through the slot provider (no Pulumi engine)")
    add_backend_arguments(p, required=True)
    p.add_argument("--controller-secret-file", type=Path,
                   help="file holding the controller secret (default: $FLEET_CONTROLLER_SECRET)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="a clone of the fleet repo (with its origin): duplicates and orphans are destroyed only "
                        "with it, each destruction committed there with its evidence and pushed")
    p.add_argument("--orphan-grace-minutes", type=float, default=DEFAULT_GRACE_S / 60,
                   help="destroy an orphan (this fleet's label, no slot) only once it is this old "
                        "(default: %(default)g)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    try:
        spec, records = load_inputs(args.spec, sys.stderr)
        state_dir: Path = args.state_dir
        image = resolve_image(args.backend, args.image, args.image_digest, spec, state_dir)
        secret = read_controller_secret(args.controller_secret_file)
        # With $FLEET_ADMIN_TOKEN set, destroyed instances are reported to the spec's controller.
        from reconciler.adapters.controller.client import admin_client_from  # httpx: only when applying

        notifier = admin_client_from(spec.controller.url)
        def say(line: str) -> None:
            print(line, file=out, flush=True)

        provider = SlotProvider(make_marketplace(args, state_dir, say=lambda line: say(f"wait    {line}")), secret,
                                on_destroyed=(lambda out: notifier.mark_destroyed(out.instance_id)) if notifier
                                else None)
        recorder = None
        if args.workdir is not None:
            from reconciler.adapters.git import GitStore, GitStoreError  # gitpython: only with --workdir

            try:
                recorder = git_orphan_recorder(GitStore(args.workdir), spec.name, echo=say)
            except GitStoreError as exc:
                raise ApplyError(f"--workdir {args.workdir}: {exc}") from None
        report = apply_fleet(spec, records, provider, state_dir / SLOT_STATE_FILE, image, datetime.now(UTC),
                             echo=say, recorder=recorder, orphan_grace_s=args.orphan_grace_minutes * 60)
    except ApplyError as exc:
        print(f"fleet apply: {exc}", file=sys.stderr)
        return 1
    except MarketplaceAuthError as exc:
        # A refused key: stop. What was done is in the state file; nothing was dropped, destroyed or recorded.
        print(f"fleet apply: stopped: {exc}", file=sys.stderr)
        return 1
    except (SlotError, MarketplaceError) as exc:
        # Observation failed: nothing was changed (never act on a failed look).
        print(f"fleet apply: cannot observe the fleet, nothing changed: {describe_error(exc)}", file=sys.stderr)
        return 1
    _tell_webhooks(report, spec)
    return summarize(report, out)


def _tell_webhooks(report: ApplyReport, spec: Any) -> None:
    """Orphans destroyed and the spend cap reached, to the webhooks of the spec and the environment."""
    from reconciler.adapters.webhooks import WebhookConfigError
    from reconciler.cli.surfaces import notify_once, provisioner_events, webhook_targets

    events = provisioner_events(report, spec, datetime.now(UTC))
    if not events:
        return
    try:
        targets, notes = webhook_targets(spec.notifications)
    except WebhookConfigError as exc:
        print(f"fleet apply: webhooks: {exc}", file=sys.stderr)
        return
    for note in notes:
        print(f"fleet apply: {note}", file=sys.stderr)
    left = notify_once(events, targets)
    if left:
        print(f"fleet apply: webhooks: {left} event(s) not delivered (receiver down?)", file=sys.stderr)


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
        waits = [r.retry_after_s for r in report.failed if r.retry_after_s is not None]
        if waits:
            print(f"the marketplace asked us to wait: run apply again in {max(waits) / 3600:.1f} h at the earliest "
                  f"({max(waits):.0f} s; sooner only repeats the refusal)", file=out)
    if report.plan.held:
        print(f"not converged: {len(report.plan.held)} slot(s) held by the circuit breaker "
              f"(pools: {', '.join(sorted(report.plan.paused))})", file=out)
    if report.plan.capped:
        print(f"not converged: {len(report.plan.capped)} slot(s) held by the fleet spend cap "
              f"({', '.join(a.slot for a in report.plan.capped)})", file=out)
    return 1
