"""`fleet status`: the fleet at a glance (see `reconciler.domain.status` for the data and
`reconciler.render` for the text and HTML layouts).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.adapters.capacity_files import capacity_entries
from reconciler.adapters.record_index import load_indexed
from reconciler.adapters.spec_files import load_spec_cached
from reconciler.cli._shared import instant
from reconciler.domain.observations import format_time
from reconciler.domain.records import RecordError
from reconciler.domain.redact import escape_lines
from reconciler.domain.spec import SpecError
from reconciler.domain.status import PAGE_SIZE, FleetStatus, MarketStatus, StatusQuery, status_view
from reconciler.domain.sweep import MARKET_VIEW_FILE
from reconciler.render.text import render_text

# --- command -----------------------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="pools, guards, instance timelines and root causes")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workdir", type=Path, help="the reconciler's clone (reads <workdir>/fleet-spec and "
                                                    "the loop's last pass)")
    where.add_argument("--spec-dir", type=Path, help="spec directory (default: fleet-spec)")
    p.add_argument("--controller-db", metavar="PATH|URI",
                   help="controller store (a SQLite file or a postgresql:// URI); without it, records only")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="`fleet apply` state directory: adds the marketplace view (spend vs max_total_dph, orphans)")
    p.add_argument("--image-digest", default=None, help="desired image digest (default: $FLEET_IMAGE_DIGEST)")
    shown = p.add_argument_group("which instances (default: only those that need the operator: failing, "
                                 "judging, benchmarking, silent while serving, on probation)")
    shown.add_argument("--all", action="store_true", dest="everything",
                       help="every instance, also serving, ok and destroyed ones (and every bad machine)")
    shown.add_argument("--pool", action="append", default=[], metavar="POOL", help="only this pool (repeatable)")
    shown.add_argument("--machine", action="append", default=[], metavar="MACHINE_ID",
                       help="only this machine (repeatable)")
    shown.add_argument("--since", type=instant, default=None, metavar="TIME",
                       help="only instances heard from at or after this UTC time (ISO 8601)")
    shown.add_argument("--limit", type=int, default=PAGE_SIZE, metavar="N",
                       help="instances per page (default: %(default)s; 0: no limit)")
    shown.add_argument("--page", type=int, default=1, help="which page of instances (default: %(default)s)")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable output (same as -o json)")
    output.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")
    output.add_argument("--html", type=Path, metavar="FILE",
                        help="write a self-contained static HTML status page to FILE (also written, with the "
                             "problem shown, when the spec is stalled or the controller store is unreadable)")
    p.add_argument("--at", type=instant, default=None, metavar="TIME",
                   help="judge deadlines as of this UTC time (ISO 8601, e.g. 2026-12-02T22:00:00Z) instead of now: "
                        "replays what the status was at an incident")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reconciler.cli._shared import desired_digest_arg, last_pass_path

    spec_dir: Path = args.workdir / "fleet-spec" if args.workdir else (args.spec_dir or Path("fleet-spec"))
    html_out: Path | None = args.html
    try:
        desired = desired_digest_arg(args.image_digest)
    except RecordError as exc:
        print(f"fleet status: --image-digest / $FLEET_IMAGE_DIGEST: {exc}", file=sys.stderr)
        return 2
    target: str | Path | None = None
    if args.controller_db is not None:
        from reconciler.adapters.stores import StoreTargetError, store_target

        try:
            target = store_target(args.controller_db)
        except StoreTargetError as exc:
            print(f"fleet status: --controller-db {exc}", file=sys.stderr)
            return 2
    last_pass = None
    if args.workdir is not None:
        try:
            last_pass = json.loads(last_pass_path(args.workdir).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            last_pass = None
    now = args.at or datetime.now(UTC)
    try:
        spec = load_spec_cached(spec_dir / "fleet.yaml")
    except SpecError as exc:
        print(f"fleet status: stalled: {exc}", file=sys.stderr)
        if html_out is not None:
            # A page that vanishes when the spec breaks hides the one thing the reader must know.
            stalled = FleetStatus(at=format_time(now), pools=(), instances=(), suspects=(),
                                  record_problems=load_indexed(spec_dir).problems, last_pass=last_pass,
                                  notes=(f"spec stalled: {exc}",), desired_image_digest=desired)
            _write_html(html_out, stalled, spec_dir / "fleet.yaml")
        return 1
    as_json = args.json or args.output == "json"
    query = StatusQuery(everything=args.everything, pools=frozenset(args.pool), machines=frozenset(args.machine),
                        since=args.since, page=max(1, args.page), per_page=args.limit if args.limit > 0 else None)
    notes: tuple[str, ...] = ()
    market = None
    if args.state_dir is not None:
        try:
            market = MarketStatus.from_json(json.loads((args.state_dir / MARKET_VIEW_FILE).read_text("utf-8")))
        except FileNotFoundError:
            notes = (*notes, f"{args.state_dir}: no marketplace view yet (run `fleet apply` first)")
        except (OSError, ValueError, TypeError) as exc:
            notes = (*notes, f"{args.state_dir / MARKET_VIEW_FILE}: unreadable marketplace view: {exc}")
    records = load_indexed(spec_dir)
    include_rates = html_out is not None or as_json
    observation_error: str | None = None
    view: FleetStatus | None = None
    capacity = capacity_entries(spec, spec_dir / "fleet.yaml")
    if target is not None:
        from reconciler.adapters.store.port import StoreError, StoreUnavailable
        from reconciler.adapters.stores import is_database_uri, open_store, shown_target
        from reconciler.flows.fleet_status import triaged_view

        if not is_database_uri(target) and not Path(target).is_file():
            observation_error = f"{shown_target(target)}: no controller store there"
        else:
            try:
                store = open_store(target)
                try:
                    summaries = store.instance_summaries()
                    last_pass = _with_live_leadership(target, last_pass, now)
                    # Summaries of every instance (no events), then the full reports of the shown page only.
                    view, _ = triaged_view(spec, records, summaries, store.reports_of, now, query,
                                           desired_image_digest=desired, last_pass=last_pass, notes=notes,
                                           include_rates=include_rates, market=market, capacity_entries=capacity)
                finally:
                    store.close()
            except (StoreError, StoreUnavailable) as exc:
                observation_error = str(exc)
    if observation_error is not None:
        print(f"fleet status: {observation_error}", file=sys.stderr)
        if html_out is None:
            return 1
        notes = (*notes, f"observation failed, instances not shown: {observation_error}")
    if view is None:  # records only (no store, or it could not be read)
        view = status_view(spec, records, [], now, desired_image_digest=desired, last_pass=last_pass, notes=notes,
                           include_rates=include_rates, market=market, capacity_entries=capacity)
    if html_out is not None:
        written = _write_html(html_out, view, spec_dir / "fleet.yaml")
        return 1 if observation_error is not None or not written else 0
    if as_json:
        sys.stdout.write(json.dumps(view.to_json(), indent=2) + "\n")  # one write, not one per token
    else:
        sys.stdout.write(escape_lines(render_text(view, everything=args.everything)))
    return 0


def _with_live_leadership(location: str | Path, last_pass: dict[str, Any] | None,
                          now: datetime) -> dict[str, Any] | None:
    """With replicas (a PostgreSQL store), who leads as the database says now, instead of as of the last pass."""
    from reconciler.adapters.lease import LeaseUnavailable, PostgresLease
    from reconciler.adapters.stores import is_database_uri
    from reconciler.domain.leadership import describe

    if not is_database_uri(location):
        return last_pass  # the embedded store: one process, always the leader
    lease = PostgresLease(str(location))
    try:
        leader = lease.current()
    except LeaseUnavailable as exc:
        leadership: dict[str, Any] = {"summary": f"unknown: {exc}", "at": format_time(now)}
    else:
        leadership = {"summary": describe(leader, "", now), "at": format_time(now),
                      "leader": leader.to_json(now=now) if leader is not None else None}
    finally:
        lease.close()
    return {**(last_pass or {}), "leadership": leadership}


def _write_html(path: Path, view: FleetStatus, spec_source: Path) -> bool:
    from reconciler.adapters.atomic_files import write_text_atomic
    from reconciler.render.html import render_html

    try:
        # Atomic: a web server serving the file never sends a half-written page.
        write_text_atomic(path, render_html(view, spec_source=str(spec_source)))
    except OSError as exc:
        print(f"fleet status: --html {path}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return False
    print(f"fleet status: wrote {path} ({len(view.pools)} pools, {len(view.instances)} instances, "
          f"{sum(1 for b in view.bad_machines if b.standing != 'probation')} bad machines)")
    return True
