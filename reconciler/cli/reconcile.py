"""`fleet reconcile`: the long-running judge. Each pass reads worker reports from the controller store,
judges finished benchmarks and commits records with trailers to the fleet repo (reconciler/flows/judge.py: one
pass, or a pass every `--interval`).

Works in a dedicated bot clone (`--workdir`, cloned from `--repo` on first use; its unpushed commits and
record-dir edits are discarded on every sync). `--once` runs one pass (exit 1 if it stalled, could not
observe or could not push); otherwise passes repeat every `--interval` seconds until SIGINT/SIGTERM.
`--listen host:port` also serves the controller HTTP API on the same store in this process. After every
pass its result is written to `<workdir>.last-pass.json`, which `fleet status --workdir` shows.

With a PostgreSQL `--controller-db`, several such processes (replicas, each with its own `--workdir`) share
one store: every replica serves the API, the page and /metrics; only the holder of the lease
(reconciler/adapters/lease.py, `--lease` seconds) runs passes, and each pass's push and directives are fenced
by its epoch. The others report `standby` and take over when the lease lapses. With a SQLite file this
process is the only one and always leads.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore, GitStoreError, TemporaryGitError
from reconciler.adapters.lease import (
    DEFAULT_LEASE_S,
    LeaseKeeper,
    PostgresLease,
    holder_id,
    replica_name,
)
from reconciler.adapters.record_files import RecordCache
from reconciler.adapters.settings import IMAGE_DIGEST_ENV, settings
from reconciler.cli._shared import desired_digest_arg, last_pass_path
from reconciler.domain.leadership import describe
from reconciler.domain.records import RecordError
from reconciler.flows.demand import DemandRecorder
from reconciler.flows.judge import LeaderTerm, PassMemory, PassResult, follow, run, run_pass

if TYPE_CHECKING:
    from reconciler.cli.surfaces import Surfaces


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"--listen {text!r}: expected host:port, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "127.0.0.1", int(port)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reconcile", help="judge benchmarks and commit machine records (one pass or a loop)")
    p.add_argument("--repo", required=True, help="fleet repo URL or path (cloned into --workdir if needed)")
    p.add_argument("--workdir", type=Path, required=True, help="the reconciler's own clone")
    p.add_argument("--controller-db", required=True, metavar="PATH|URI",
                   help="controller store: a SQLite file (one process) or a PostgreSQL URI "
                        "postgresql://user@host:port/dbname (password from the URI, PGPASSWORD or ~/.pgpass)")
    p.add_argument("--branch", default="main", help="branch to judge and push (default: %(default)s)")
    p.add_argument("--once", action="store_true", help="run a single pass and exit")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between passes (default: %(default)s)")
    p.add_argument("--image-digest", default=None,
                   help=f"desired worker image digest sha256:<hex> (default: ${IMAGE_DIGEST_ENV}; none = no "
                        "stale-image checks)")
    p.add_argument("--listen", type=_listen_address, default=None, metavar="HOST:PORT",
                   help="also serve the controller HTTP API on the same store (secrets from "
                        "$FLEET_CONTROLLER_SECRET / $FLEET_ADMIN_TOKEN)")
    p.add_argument("--json", action="store_true", help="print each pass result as one JSON line")
    p.add_argument("--status-refresh", type=float, default=5.0, metavar="SECONDS",
                   help="with --listen: how often the live status page at / refreshes itself (default: %(default)s)")
    p.add_argument("--slot-state-dir", type=Path, default=None, metavar="DIR",
                   help="the provisioner's state dir (`fleet apply --state-dir`): $/h per pool (with --listen) and "
                        "the $/h of each instance, so a shrinking autoscaled pool drains the worst $/proof first")
    p.add_argument("--market-prices", choices=["vastai"], default=None,
                   help="also read each instance's $/h from the marketplace's list of instances (every 5 min; vast.ai: "
                        "key from $VAST_API_KEY), for instances --slot-state-dir does not price (a fleet Pulumi runs "
                        "has no slot state): a shrinking pool drains the worst $/proof first")
    p.add_argument("--vast-base-url", default=None, help=argparse.SUPPRESS)  # tests point it at a fake
    p.add_argument("--metrics-open", action="store_true",
                   help="with --listen: serve /metrics without a token (a Prometheus on a private network)")
    p.add_argument("--lease", type=float, default=DEFAULT_LEASE_S, metavar="SECONDS",
                   help="with a PostgreSQL store: the leader's lease; another replica takes over this long after "
                        "the leader stops renewing it (default: %(default)s)")
    p.add_argument("--replica-name", default=None, metavar="NAME",
                   help="with a PostgreSQL store: this replica's name in the lease, status and /healthz "
                        "(default: host:port of --listen, or host:pid)")
    p.add_argument("--demand-sample", type=float, default=60.0, metavar="SECONDS",
                   help="the leader samples a pool's demand when it changed, at most this often (default: %(default)s) "
                        "and at least every 15 min; the samples go to fleet-spec/demand/ for `fleet plan --what-if` "
                        "(not with --once)")
    p.add_argument("--demand-flush", type=float, default=3600.0, metavar="SECONDS",
                   help="commit the demand samples with the next commit, or on their own once the oldest is this old "
                        "(default: %(default)s)")
    from reconciler.cli.controller import add_tls_arguments

    add_tls_arguments(p)
    p.set_defaults(func=run_command)


def _open_git(args: argparse.Namespace) -> GitStore:
    workdir: Path = args.workdir
    if (workdir / ".git").exists():
        return GitStore(workdir, branch=args.branch)
    if workdir.exists() and any(workdir.iterdir()):
        raise GitStoreError(f"{workdir} exists, is not empty and is not a git clone; choose an empty --workdir")
    workdir.parent.mkdir(parents=True, exist_ok=True)
    return GitStore.clone(args.repo, workdir, branch=args.branch)


def _prices(args: argparse.Namespace) -> Callable[[], Mapping[str, float]] | None:
    from reconciler.cli.surfaces import marketplace_prices, merged_prices, slot_prices

    market = None
    if args.market_prices is not None:
        from reconciler.adapters.marketplace import build_marketplace

        market = marketplace_prices(build_marketplace({"kind": args.market_prices, "base_url": args.vast_base_url},
                                                      {}))
    return merged_prices(slot_prices(args.slot_state_dir) if args.slot_state_dir is not None else None, market)


def _standby(tree: GitFleetTree, store: Any, keeper: LeaseKeeper, memory: PassMemory | None,
             now: datetime) -> PassResult:
    """A follower's pass: no judging, no writes anyone else sees; only its own clone follows the branch, so the
    page and status it serves show the records the leader pushed, and its memory follows the store (flows `follow`):
    when it takes over, its first pass is a warm one."""
    return PassResult(at=now, standby=_leadership_line(keeper), notes=follow(tree, store, memory))


def _leadership_line(keeper: LeaseKeeper) -> str:
    line = describe(keeper.leader(), keeper.holder, datetime.now(UTC))
    return f"{line} (lease database unreachable: {keeper.last_error})" if keeper.last_error else line


def _report(result: PassResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_json()), flush=True)
        return
    print(f"{datetime.now(UTC).strftime('%H:%M:%S')} {result.headline()}", flush=True)
    for v in result.verdicts:
        print(f"  {v.instance_id} machine {v.machine_id}: {v.root_cause()}", flush=True)
    for note in result.notes:
        print(f"  note: {note}", flush=True)
    for d in result.capacity:
        if d.changed:
            print(f"  capacity {d.trailer()}", flush=True)
        elif d.held_by:
            print(f"  capacity {d.pool} at {d.after}: {d.note}", flush=True)


def run_command(args: argparse.Namespace) -> int:
    from reconciler.adapters.curio_queue import CurioQueue
    from reconciler.adapters.store.port import StoreError
    from reconciler.adapters.stores import StoreTargetError, is_database_uri, open_store, shown_target, store_target
    from reconciler.cli.controller import exposure_warning

    try:
        desired = desired_digest_arg(args.image_digest)
    except RecordError as exc:
        print(f"fleet reconcile: --image-digest / ${IMAGE_DIGEST_ENV}: {exc}", file=sys.stderr)
        return 2
    if args.interval <= 0:
        print(f"fleet reconcile: --interval must be > 0 seconds, got {args.interval:g}", file=sys.stderr)
        return 2
    if args.listen is None and (args.tls_cert is not None or args.tls_key is not None):
        print("fleet reconcile: --tls-cert/--tls-key secure the controller API, which needs --listen", file=sys.stderr)
        return 2
    if args.lease <= 0:
        print(f"fleet reconcile: --lease must be > 0 seconds, got {args.lease:g}", file=sys.stderr)
        return 2
    if args.demand_sample <= 0 or args.demand_flush < 0:
        print(f"fleet reconcile: --demand-sample must be > 0 and --demand-flush >= 0 seconds, got "
              f"{args.demand_sample:g} and {args.demand_flush:g}", file=sys.stderr)
        return 2
    try:
        target = store_target(args.controller_db)
    except StoreTargetError as exc:
        print(f"fleet reconcile: --controller-db {exc}", file=sys.stderr)
        return 2
    replicated = is_database_uri(target)
    if args.listen is None and not replicated and not Path(target).is_file():
        print(f"fleet reconcile: {shown_target(target)}: no controller store there (start the controller, or "
              "pass --listen to serve it from this process)", file=sys.stderr)
        return 1
    try:
        git = _open_git(args)
        store = open_store(target)
    except (GitStoreError, TemporaryGitError, StoreError) as exc:
        print(f"fleet reconcile: {exc}", file=sys.stderr)
        return 1
    server: Any = None
    surfaces: Surfaces | None = None
    # $/h per instance from the provisioner's slot state, else the marketplace: a shrinking pool drains the worst
    # $/proof first, and the page shows what the fleet costs.
    prices = _prices(args)
    stop = threading.Event()
    wake = threading.Event()  # set when this replica becomes leader (or on a signal): pass at once
    previous: dict[int, Any] = {}
    status_file = last_pass_path(git.workdir)
    exposure = exposure_warning(args.listen[0], args) if args.listen is not None else None
    keeper: LeaseKeeper | None = None
    if replicated:
        name = args.replica_name or replica_name(args.listen[1] if args.listen and args.listen[1] else None)
        keeper = LeaseKeeper(PostgresLease(str(target), timeout_s=min(5.0, args.lease / 3)),
                             holder_id(name), args.lease, poll_s=min(args.lease / 3, args.interval),
                             on_gain=wake.set)
    try:
        if keeper is not None:
            keeper.start()
            print(f"replica {keeper.holder}: {_leadership_line(keeper)}", flush=True)
        if exposure is not None:
            print(f"fleet reconcile --listen: warning: {exposure}", file=sys.stderr, flush=True)
        if args.listen is not None:
            surfaces = _surfaces(args, store, git, desired, status_file, prices)
            if surfaces is None:
                return 2
            server = _start_controller(store, args.listen, args, surfaces.routes, health=partial(_health, keeper))
            if server is None:
                return 2
        # The loop keeps parsed records between passes and re-parses only changed files, and what it read of the
        # store and decided (its memory): each pass reads and judges only what changed or fell due. One pass
        # (--once) has no use for either.
        tree = GitFleetTree(git, record_cache=None if args.once else RecordCache())
        memory = None if args.once else PassMemory()
        # The leader's demand samples (one pass has no tile to measure: --once records none).
        demand = None if args.once else DemandRecorder(resolution_s=args.demand_sample, flush_s=args.demand_flush)

        # curio's queue for autoscaled pools with a `queue:` source (URL from the variable the spec names).
        queue = CurioQueue()

        def one_pass(now: datetime) -> PassResult:
            term = None
            if keeper is not None:
                epoch = keeper.term()
                if epoch is None:  # another replica leads: serve workers, judge and write nothing
                    return _standby(tree, store, keeper, memory, now)
                term = LeaderTerm(epoch, partial(keeper.fence, epoch), keeper.store_fence(epoch))
            return run_pass(tree, store, now, desired_image_digest=desired, directive_sink=store, queue_reader=queue,
                            prices=prices, term=term, memory=memory, demand=demand)

        shown_standby: list[str] = []

        def on_pass(result: PassResult) -> None:
            try:
                previous = json.loads(status_file.read_text(encoding="utf-8")).get("condition")
            except (OSError, ValueError, AttributeError):
                previous = None
            doc = result.to_json(previous if isinstance(previous, dict) else None)
            if keeper is not None:
                doc["leadership"] = keeper.status(datetime.now(UTC))
            if exposure is not None:
                doc["exposure"] = exposure  # `fleet status` and the page say it too
            write_text_atomic(status_file, json.dumps(doc, indent=2) + "\n")
            if result.standby is not None:
                # JSON: one line per pass, as always; text: say it when it changes, not every interval.
                if args.json or shown_standby[-1:] != [result.standby]:
                    _report(result, args.json)
                shown_standby[:] = [result.standby]
                return  # a follower's page and metrics show the leader's work, not passes of its own
            shown_standby.clear()
            _report(result, args.json)
            if surfaces is not None:
                surfaces.on_pass(result)

        if args.once:
            result = one_pass(datetime.now(UTC))
            on_pass(result)
            return 0 if result.ok else 1

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()
            wake.set()

        def nap(seconds: float) -> None:
            wake.wait(seconds)
            wake.clear()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        run(one_pass, interval_s=args.interval, stop_event=stop, clock=lambda: datetime.now(UTC), on_pass=on_pass,
            sleep=nap)
        return 0
    finally:
        if keeper is not None:  # first: a clean stop hands the lease over at once
            keeper.stop(release=True)
        if server is not None:
            server.stop()
        if surfaces is not None:
            surfaces.close()
        store.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _surfaces(args: argparse.Namespace, store: Any, git: GitStore, desired: str | None,
              status_file: Path, prices: Callable[[], Mapping[str, float]] | None) -> Surfaces | None:
    """The live page, /metrics and webhooks for this process; None (after saying why) if misconfigured."""
    from reconciler.adapters.spec_files import load_spec
    from reconciler.adapters.webhooks import WebhookConfigError
    from reconciler.cli.controller import ConfigError, load_admin_token, page_over_tls
    from reconciler.cli.surfaces import (
        SurfacesConfigError,
        build_surfaces,
        market_view,
        webhook_targets,
    )
    from reconciler.domain.spec import SpecError

    try:
        spec = load_spec(git.workdir / "fleet-spec" / "fleet.yaml")
        notifications, controller_url = spec.notifications, spec.controller.url
    except SpecError:
        # The loop stalls and says why; webhooks from the environment still work.
        notifications, controller_url = None, None
    try:
        targets, notes = webhook_targets(notifications)
        surfaces = build_surfaces(
            spec_dir=git.workdir / "fleet-spec", store=store, admin_token=load_admin_token(None),
            read_token=_read_token(), desired_image_digest=desired, last_pass_file=status_file,
            commits=lambda: git.recent_commits(15),
            prices=prices,
            market=market_view(args.slot_state_dir) if args.slot_state_dir else None,
            refresh_s=args.status_refresh, metrics_open=args.metrics_open, webhook_targets=targets,
            secure_cookie=page_over_tls(args, controller_url), sessions=store)
    except (ConfigError, SurfacesConfigError, WebhookConfigError) as exc:
        print(f"fleet reconcile --listen: {exc}", file=sys.stderr)
        return None
    for note in notes:
        print(f"fleet reconcile --listen: {note}", file=sys.stderr)
    if targets:
        print(f"webhooks: {', '.join(f'{t.name} ({t.format})' for t in targets)}", flush=True)
    if surfaces.note:
        print(f"fleet reconcile --listen: {surfaces.note}", file=sys.stderr)
    return surfaces


def _read_token() -> str | None:
    token = settings().read_token
    return token.reveal() if token is not None else None


def _health(keeper: LeaseKeeper | None) -> dict[str, object]:
    """/healthz's word on leadership: an embedded store's one process always leads."""
    if keeper is None:
        return {"leadership": {"leading": True, "summary": "embedded store: this process is the only one"}}
    return {"leadership": keeper.status(datetime.now(UTC))}


def _start_controller(store: Any, address: tuple[str, int], args: argparse.Namespace,
                      routes: Sequence[Any] = (), health: Callable[[], dict[str, object]] | None = None) -> Any:
    """The controller API on `address`, sharing `store`; None (after saying why) if it cannot start."""
    from reconciler.adapters.controller.server import ControllerServer
    from reconciler.cli.controller import ConfigError, load_admin_token, load_secret, tls_files

    try:
        secret = load_secret(None)
        admin_token = load_admin_token(None)
        tls = tls_files(args)
    except ConfigError as exc:
        print(f"fleet reconcile --listen: {exc}", file=sys.stderr)
        return None
    server = ControllerServer(store, secret, admin_token, address[0], address[1], require_machine_claim=True,
                              tls_cert=tls[0] if tls else None, tls_key=tls[1] if tls else None,
                              extra_routes=list(routes), health=health)
    try:
        server.start()
    except OSError as exc:
        print(f"fleet reconcile --listen: cannot listen on {address[0]}:{address[1]}: {exc.strerror or exc}",
              file=sys.stderr)
        return None
    print(f"controller listening on {server.url} (store {store.location})", flush=True)
    return server
