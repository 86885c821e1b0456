"""`fleet demo`: the whole GitOps loop on this machine, without a cloud account or a GPU.

The embedded local default behind `make demo`. It wires the real pieces together in a throw-away
workspace: a bare git "origin" holding the fleet spec, the controller API + store, a params mirror, the
local marketplace (declared machines; every rental runs the real worker entrypoint as a local process),
the slot planner/provider driven like CI's `pulumi up` after every push (`apply_fleet`), and the
reconciler loop judging reports and pushing records (`run_pass`). Only cuzk-daemon/cuzk-bench are CPU
stand-ins. It runs until the fleet converges (every slot on a machine that passed its benchmark), prints
the status and the git audit trail, and stops every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import yaml

from reconciler import REPO_ROOT
from reconciler.adapters.git import GitStore
from reconciler.adapters.marketplace.local import (
    LocalMachine,
    LocalMachinesError,
    LocalMarketplace,
    load_local_machines,
)
from reconciler.adapters.params_mirror import ParamsMirrorServer, write_manifest
from reconciler.adapters.record_files import load_records, write_text_atomic
from reconciler.adapters.slot_provider import SLOT_STATE_FILE, SlotProvider, directory_digest, load_slot_state
from reconciler.adapters.spec_files import load_spec
from reconciler.adapters.store import ControllerStore
from reconciler.domain.observations import InstanceReport
from reconciler.domain.records import RecordSet
from reconciler.domain.slots import SlotOutputs
from reconciler.domain.status import status_view
from reconciler.flows.judge import PassResult, run_pass
from reconciler.flows.provision import ApplyReport, Image, apply_fleet
from reconciler.render.html import render_html
from reconciler.render.text import render_text

ASSETS = Path(__file__).resolve().parent.parent / "demo_assets"
DEMO_MACHINES_FILE = ASSETS / "local-machines.yaml"
WORKSPACE_MARKER = ".fleet-demo-workspace"
SPEC_PATH = "fleet-spec/fleet.yaml"

#: Real seconds the stand-in sleeps per simulated second: 0.01 turns a 72 s proof into 0.72 s.
DEFAULT_TIME_SCALE = 0.01


class DemoError(Exception):
    """The demo cannot start or did not converge; the message says what to look at."""


@dataclass(frozen=True)
class DemoSettings:
    workdir: Path
    deadline_s: float = 110.0
    time_scale: float = DEFAULT_TIME_SCALE
    proofs: int = 4
    poll_s: float = 1.0
    machines_file: Path = DEMO_MACHINES_FILE
    worker_image: Path = REPO_ROOT / "worker-image"
    params_file_bytes: int = 2 << 20


@dataclass
class DemoOutcome:
    converged: bool
    elapsed_s: float
    passes: int
    commits: list[str] = field(default_factory=list)
    bad_machines: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # slot -> machine_id


def demo_spec(controller_url: str, params_url: str, proofs: int, time_scale: float) -> str:
    """The operator's spec for the demo: the README's example fleet, scaled down to three slots."""
    bench_timeout_minutes = max(1.0, round(600 * proofs * time_scale / 60, 1))
    doc = {
        "version": 1,
        "image": {"repository": "registry.local/fleet/cuzk-worker", "context": "worker-image"},
        "controller": {"url": controller_url, "log_ring_lines": 2000},
        "params": {"sector_size": "32GiB", "base_url": params_url, "fetch_timeout_minutes": 2},
        "circuit_breaker": {"distinct_machines": 2, "window_hours": 24},
        # Two bad machines in a two-slot pool are the point of the demo; production keeps 20%.
        "kill_budget": {"max_fraction": 0.2, "min_machines": 2, "window_hours": 24},
        "pools": [
            {"name": "rtx4090", "gpu_name": "RTX 4090", "count": 2, "min_rate_proofs_per_hour": 40,
             "max_price_usd_per_hour": 0.60, "min_reliability": 0.98,
             "benchmark": {"proofs": proofs, "concurrency": 2, "timeout_minutes": bench_timeout_minutes}},
            {"name": "rtx-pro-4000", "gpu_name": "RTX PRO 4000", "count": 1, "min_rate_proofs_per_hour": 29,
             "max_price_usd_per_hour": 0.60, "min_reliability": 0.97,
             "benchmark": {"proofs": proofs, "concurrency": 2, "timeout_minutes": bench_timeout_minutes}},
        ],
    }
    header = ("# Demo fleet (written by `fleet demo`). Controller and params mirror run on this machine.\n")
    return header + yaml.safe_dump(doc, sort_keys=False)


# --- workspace -----------------------------------------------------------------------------------------


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "Demo Operator", "GIT_AUTHOR_EMAIL": "operator@example.invalid",
           "GIT_COMMITTER_NAME": "Demo Operator", "GIT_COMMITTER_EMAIL": "operator@example.invalid"}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DemoError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def prepare_workspace(workdir: Path) -> None:
    """Start from an empty directory; wipe only a directory an earlier demo made (it has our marker)."""
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / WORKSPACE_MARKER).is_file():
            raise DemoError(f"{workdir} exists and is not a fleet demo workspace; refusing to delete it "
                            "(choose another --workdir)")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / WORKSPACE_MARKER).write_text("made by `fleet demo`; deleted by the next run\n")


def make_params(directory: Path, file_bytes: int) -> None:
    """Small stand-in params (random bytes under the real v28 names) plus the c1.json bench input."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(32)  # noqa: S311 - filler bytes, not secrets: the same files every run
    names = [
        "v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher-"
        "82a357d2f2ca81dc61bb45f4a762807aedee1b0a53fd6c4e77b46a01bfef7820.params",
        "v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher-"
        "82a357d2f2ca81dc61bb45f4a762807aedee1b0a53fd6c4e77b46a01bfef7820.vk",
    ]
    for i, name in enumerate(names):
        size = file_bytes if i == 0 else 4096
        (directory / name).write_bytes(rng.randbytes(size))
    (directory / "c1.json").write_text(json.dumps({"stand_in": True, "sector_size": "32GiB",
                                                    "note": "fleet demo bench input for the CPU stand-in"}))
    write_manifest(directory)


def init_origin(workdir: Path, spec_text: str) -> Path:
    origin = workdir / "origin.git"
    _git("init", "--quiet", "--bare", "--initial-branch=main", str(origin))
    operator = workdir / "operator"
    _git("clone", "--quiet", str(origin), str(operator))
    (operator / "fleet-spec" / "machines").mkdir(parents=True)
    (operator / SPEC_PATH).write_text(spec_text)
    (operator / "fleet-spec" / "machines" / ".gitkeep").write_text("")
    _git("checkout", "--quiet", "-B", "main", cwd=operator)
    _git("add", "-A", cwd=operator)
    _git("commit", "--quiet", "-m", "fleet: 2 x RTX 4090 >= 40/h, 1 x RTX PRO 4000 >= 29/h, max $0.60/h",
         cwd=operator)
    _git("push", "--quiet", "origin", "main", cwd=operator)
    return origin


def local_machines(settings: DemoSettings, workdir: Path) -> list[LocalMachine]:
    """The declared machines, each with its own disk (params cache) and stand-in state, like real hosts."""
    out = []
    try:
        declared = load_local_machines(settings.machines_file)
    except LocalMachinesError as exc:
        raise DemoError(str(exc)) from None
    for m in declared:
        home = workdir / "machines" / m.machine_id
        env = {**m.env, "FLEET_USE_STANDINS": "1", "STANDIN_TIME_SCALE": str(settings.time_scale),
               "STANDIN_STATE_DIR": str(home / "standin"), "FLEET_PARAMS_DIR": str(home / "params"),
               "FLEET_DAEMON_POLL_S": "0.2", "FLEET_LOG_SHIP_INTERVAL_S": "0.5",
               "FLEET_PROGRESS_INTERVAL_S": "1", "FLEET_BENCH_C1": str(home / "params" / "c1.json")}
        out.append(replace(m, env=env))
    return out


# --- the run -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _started(server: ParamsMirrorServer) -> Iterator[ParamsMirrorServer]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


#: What the worker scripts and the demo run on this host (the worker image installs them in production).
DEMO_TOOLS = {"git": "git", "bash": "bash", "curl": "curl", "jq": "jq", "b2sum": "coreutils", "timeout": "coreutils"}


def check_tools(which: Callable[[str], str | None] = shutil.which) -> None:
    missing = sorted({package for tool, package in DEMO_TOOLS.items() if which(tool) is None})
    if missing:
        raise DemoError(f"the demo runs the real worker scripts, which need: {', '.join(missing)} "
                        f"(apt-get install {' '.join(missing)})")


def run_demo(settings: DemoSettings, echo: Callable[[str], None] = print,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> DemoOutcome:
    check_tools()
    workdir = settings.workdir.resolve()
    prepare_workspace(workdir)
    echo(f"demo workspace: {workdir}")
    make_params(workdir / "params-mirror", settings.params_file_bytes)
    store = ControllerStore(workdir / "controller.db", ring_lines=2000)
    secret = secrets.token_bytes(32)
    from reconciler.adapters.controller.server import ControllerServer

    controller = ControllerServer(store, secret, admin_token=secrets.token_hex(16), allow_open_reads=True,
                                  require_machine_claim=True)
    market: LocalMarketplace | None = None
    provider: SlotProvider | None = None
    state_path = workdir / "state" / SLOT_STATE_FILE
    try:
        controller.start()
        with contextlib.ExitStack() as stack:
            mirror = stack.enter_context(_started(ParamsMirrorServer(workdir / "params-mirror")))
            echo(f"controller API on {controller.url}; params mirror on {mirror.url}")
            spec_text = demo_spec(controller.url, mirror.url, settings.proofs, settings.time_scale)
            origin = init_origin(workdir, spec_text)
            echo(f"git origin {origin}: operator committed {SPEC_PATH}")
            bot = stack.enter_context(GitStore.clone(str(origin), workdir / "reconciler"))
            ci = stack.enter_context(GitStore.clone(str(origin), workdir / "ci"))
            market = LocalMarketplace(workdir / "state" / "market", local_machines(settings, workdir))

            def destroyed(out: SlotOutputs) -> None:
                store.mark_destroyed(out.instance_id, datetime.now(UTC))

            provider = SlotProvider(market, secret, on_destroyed=destroyed)
            image = Image(str(settings.worker_image.resolve()), directory_digest(settings.worker_image))
            echo(f"worker image {settings.worker_image} digest {image.digest[:19]}...")
            outcome = _converge(settings, bot, ci, store, provider, state_path, image, echo, clock, sleep)
            _final_report(settings, outcome, ci, store, image, echo)
            return outcome
    finally:
        _teardown(provider, state_path, echo)
        controller.stop()
        store.close()


def _converge(settings: DemoSettings, bot: GitStore, ci: GitStore, store: ControllerStore, provider: SlotProvider,
              state_path: Path, image: Image, echo: Callable[[str], None], clock: Callable[[], float],
              sleep: Callable[[float], None]) -> DemoOutcome:
    start = clock()
    seen: set[tuple[str, str]] = set()
    outcome = DemoOutcome(converged=False, elapsed_s=0.0, passes=0)
    applied_at: str | None = None
    while clock() - start < settings.deadline_s:
        # CI: every push to origin runs the provisioner (here `apply_fleet`; in production `pulumi up`).
        head = ci.sync()
        if head != applied_at:
            echo(f"[{clock() - start:5.1f}s] ci: origin at {head[:8]} -> apply")
            report = _apply(ci, provider, state_path, image, lambda line: echo(f"          apply: {line}"))
            applied_at = head if not report.failed else None
        sleep(settings.poll_s)
        _print_progress(store.reports(), seen, lambda line: echo(f"[{clock() - start:5.1f}s] {line}"))
        # The reconciler: judge finished benchmarks, commit records, push.
        result = run_pass(bot, store, datetime.now(UTC), desired_image_digest=image.digest, directive_sink=store)
        outcome.passes += 1
        _print_pass(result, lambda line: echo(f"[{clock() - start:5.1f}s] {line}"))
        if result.commit:
            outcome.commits.append(result.commit)
        if result.commit is None and head == applied_at and _all_slots_proven(ci, state_path):
            outcome.converged = True
            break
    outcome.elapsed_s = clock() - start
    records = load_records(ci.workdir / "fleet-spec")
    outcome.bad_machines = sorted(records.bad_machine_ids())
    outcome.kept = {slot: out.machine_id for slot, out in sorted(load_slot_state(state_path).items())}
    return outcome


def _apply(ci: GitStore, provider: SlotProvider, state_path: Path, image: Image,
           echo: Callable[[str], None]) -> ApplyReport:
    spec = load_spec(ci.workdir / SPEC_PATH)
    records = load_records(ci.workdir / "fleet-spec")
    return apply_fleet(spec, records, provider, state_path, image, datetime.now(UTC), echo=echo)


def _all_slots_proven(ci: GitStore, state_path: Path) -> bool:
    """Every desired slot runs an instance whose benchmark was judged ok and committed."""
    spec = load_spec(ci.workdir / SPEC_PATH)
    records = load_records(ci.workdir / "fleet-spec")
    slots = load_slot_state(state_path)
    desired = [s for pool in spec.pools for s in pool.slot_names()]
    return all(s in slots and _passed(records, slots[s]) for s in desired)


def _passed(records: RecordSet, out: SlotOutputs) -> bool:
    rec = records.machines.get(out.machine_id)
    return rec is not None and any(b.instance_id == out.instance_id and b.verdict == "ok" for b in rec.benchmarks)


_MILESTONES = {"register-done": "registered", "params-done": "params fetched", "daemon-done": "daemon up",
               "benchmark-done": "benchmark finished", "result": "result reported"}


def _print_progress(reports: list[InstanceReport], seen: set[tuple[str, str]], echo: Callable[[str], None]) -> None:
    for r in reports:
        times = r.phase_times()
        for key in ("registered", *_MILESTONES):
            if key not in times or (r.instance_id, key) in seen:
                continue
            seen.add((r.instance_id, key))
            what = "registered" if key == "registered" else _MILESTONES[key]
            extra = ""
            if key == "result" and r.result is not None:
                rate = r.result.proofs_per_hour
                extra = f": {r.result.outcome}, " + (f"{rate:.1f} proofs/h" if rate is not None else "no rate") + \
                    (f", exit {r.result.exit_code}" if r.result.exit_code else "")
            echo(f"worker {r.instance_id} (machine {r.machine_id}): {what}{extra}")
        failure = r.failure()
        if failure is not None and (r.instance_id, "failed") not in seen:
            seen.add((r.instance_id, "failed"))
            echo(f"worker {r.instance_id} (machine {r.machine_id}): {failure.phase} FAILED exit {failure.exit_code}"
                 f": {failure.message or ''}")


def _print_pass(result: PassResult, echo: Callable[[str], None]) -> None:
    for problem in (result.stalled, result.observation_error, result.error):
        if problem:
            echo(f"reconciler: {problem}")
    for v in result.verdicts:
        bad = "MARKED BAD" if v.marks_bad else "kept"
        echo(f"reconciler: machine {v.machine_id} ({v.instance_id}): {v.root_cause()} -> {bad}")
    if result.commit:
        echo(f"reconciler: committed {result.commit[:8]} and pushed={result.pushed}")


def _final_report(settings: DemoSettings, outcome: DemoOutcome, ci: GitStore, store: ControllerStore, image: Image,
                  echo: Callable[[str], None]) -> None:
    ci.sync()
    spec = load_spec(ci.workdir / SPEC_PATH)
    records = load_records(ci.workdir / "fleet-spec")
    view = status_view(spec, records, store.reports(), datetime.now(UTC), desired_image_digest=image.digest)
    page = settings.workdir.resolve() / "status.html"
    write_text_atomic(page, render_html(view, spec_source=f"origin:{SPEC_PATH}"))
    echo("")
    echo("=== fleet status ===")
    echo(render_text(view).rstrip())
    echo(f"(the same as a page with rate plots and timelines: {page})")
    echo("")
    echo("=== audit trail: git log of origin (reconciler commits) ===")
    echo(_git("log", "--format=%h %an: %s%n%(trailers:key=Fleet-Machine,key=Fleet-Verdict,key=Fleet-Instance)",
              "origin/main", cwd=ci.workdir).rstrip())
    for machine_id in outcome.bad_machines:
        echo("")
        echo(f"=== fleet why {machine_id} ===")
        echo(_why(ci.workdir, machine_id).rstrip())
    echo("")
    state = "converged" if outcome.converged else "DID NOT converge"
    echo(f"demo {state} in {outcome.elapsed_s:.1f}s over {outcome.passes} reconcile passes, "
         f"{len(outcome.commits)} record commit(s); bad machines: {', '.join(outcome.bad_machines) or 'none'}; "
         f"slots: {', '.join(f'{s}={m}' for s, m in outcome.kept.items())}")


def _why(repo: Path, machine_id: str) -> str:
    from reconciler.cli import main as fleet_main

    buf_out = _Capture()
    with contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_out):
        fleet_main(["why", machine_id, "--repo", str(repo)])
    return buf_out.text()


class _Capture:
    def __init__(self) -> None:
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(self._parts)


def _teardown(provider: SlotProvider | None, state_path: Path, echo: Callable[[str], None]) -> None:
    """Destroy every instance the demo rented: no worker process outlives the demo."""
    if provider is None:
        return
    slots: Mapping[str, SlotOutputs] = load_slot_state(state_path) if state_path.exists() else {}
    for out in slots.values():
        with contextlib.suppress(Exception):
            provider.delete(out)
    for inst in provider.marketplace.list_instances():
        with contextlib.suppress(Exception):
            provider.marketplace.destroy_instance(inst.contract_id)
    echo(f"cleaned up: {len(slots)} slot instance(s) destroyed, no worker processes left")


# --- command -------------------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run spec -> image -> hosts -> benchmarks -> verdicts -> commits locally")
    p.add_argument("--workdir", type=Path, default=Path(".fleet-demo"),
                   help="workspace, recreated on every run (default: %(default)s)")
    p.add_argument("--deadline", type=float, default=110.0, help="give up after this many seconds")
    p.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE,
                   help="real seconds the cuzk-bench stand-in sleeps per simulated second")
    p.add_argument("--proofs", type=int, default=4, help="proofs per benchmark")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = DemoSettings(workdir=args.workdir, deadline_s=args.deadline, time_scale=args.time_scale,
                            proofs=args.proofs)
    try:
        outcome = run_demo(settings, echo=lambda line: print(line, flush=True))
    except DemoError as exc:
        print(f"fleet demo: {exc}", file=sys.stderr)
        return 1
    return 0 if outcome.converged else 1
