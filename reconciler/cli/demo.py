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
from typing import Any

import yaml

from reconciler import REPO_ROOT
from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.marketplace.local import (
    LocalMachine,
    LocalMachinesError,
    LocalMarketplace,
    load_local_machines,
)
from reconciler.adapters.params_mirror import ParamsMirrorServer, write_manifest
from reconciler.adapters.record_files import load_records
from reconciler.adapters.slot_provider import SLOT_STATE_FILE, SlotProvider, directory_digest, load_slot_state
from reconciler.adapters.spec_files import load_spec
from reconciler.adapters.store.port import ControllerStore
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.observations import InstanceReport
from reconciler.domain.planner import desired_slots, pool_pause
from reconciler.domain.records import RecordSet
from reconciler.domain.slots import SlotOutputs
from reconciler.domain.status import status_view
from reconciler.domain.surfaces import CommitLine, LiveSnapshot
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
    #: Enough for an early verdict: the warm-up proof, three measured (early_verdict.min_measured_proofs), two saved.
    proofs: int = 6
    poll_s: float = 1.0
    machines_file: Path = DEMO_MACHINES_FILE
    worker_image: Path = REPO_ROOT / "worker-image"
    params_file_bytes: int = 2 << 20
    #: After the machine faults: a broken image build is rolled out, the breaker blames it, a fixed one recovers.
    image_story: bool = True
    #: Keep the live status page up after the story until interrupted (interactive runs only).
    wait: bool = False


@dataclass
class ImageStory:
    """The seed's incident replayed: what the demo rolled out and what the fleet did about it."""

    broken_digest: str
    fixed_digest: str | None = None
    tripped: bool = False
    root_cause: str | None = None  # the one line that says what broke (printed first)
    held: list[str] = field(default_factory=list)  # machines whose failure the breaker held (not marked bad)
    paused: list[str] = field(default_factory=list)  # apply lines that held a pool back
    rented_after_trip: list[str] = field(default_factory=list)  # must stay empty: a paused pool rents nothing
    #: Rentals after the trip in a pool the suspect record did not (yet) name: its own failure pauses it.
    rented_unpaused: list[str] = field(default_factory=list)
    recovered: bool = False


@dataclass
class DemoOutcome:
    converged: bool
    elapsed_s: float
    passes: int
    commits: list[str] = field(default_factory=list)
    bad_machines: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # slot -> machine_id
    story: ImageStory | None = None
    page_url: str | None = None


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
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
             wait_for_interrupt: Callable[[], None] | None = None) -> DemoOutcome:
    check_tools()
    workdir = settings.workdir.resolve()
    prepare_workspace(workdir)
    echo(f"demo workspace: {workdir}")
    make_params(workdir / "params-mirror", settings.params_file_bytes)
    store = SqliteStore(workdir / "controller.db", ring_lines=2000)
    secret = secrets.token_bytes(32)
    read_token = secrets.token_urlsafe(24)
    from reconciler.adapters.controller.server import ControllerServer
    from reconciler.cli.surfaces import build_surfaces, market_view, slot_prices

    state_path = workdir / "state" / SLOT_STATE_FILE
    surfaces = build_surfaces(
        spec_dir=workdir / "reconciler" / "fleet-spec", store=store, admin_token=None, read_token=read_token,
        desired_image_digest=None, last_pass_file=None, commits=lambda: _page_commits(workdir / "reconciler"),
        prices=slot_prices(state_path.parent), market=market_view(state_path.parent), refresh_s=2.0, sessions=store)
    controller = ControllerServer(store, secret, admin_token=secrets.token_hex(16), allow_open_reads=True,
                                  require_machine_claim=True, extra_routes=surfaces.routes)
    market: LocalMarketplace | None = None
    provider: SlotProvider | None = None
    try:
        controller.start()
        with contextlib.ExitStack() as stack:
            mirror = stack.enter_context(_started(ParamsMirrorServer(workdir / "params-mirror")))
            echo(f"controller API on {controller.url}; params mirror on {mirror.url}")
            page_url = f"{controller.url}/"
            echo(f"live status page: {page_url} (sign in with the read token {read_token})")
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
            surfaces.source.set_desired_image_digest(image.digest)
            loop = _Loop(settings, bot, ci, store, provider, state_path, echo, clock, sleep, surfaces.on_pass)
            outcome = loop.converge(image, "machine faults")
            if outcome.converged and settings.image_story:
                outcome.story, image, after = _image_story(settings, loop, image, outcome, workdir, surfaces)
                # The summary is of the whole run: where the slots are now and every machine recorded bad.
                outcome.converged = after.converged
                outcome.bad_machines, outcome.kept = after.bad_machines, after.kept
                outcome.passes, outcome.commits = loop.passes, list(loop.commits)
                outcome.elapsed_s = loop.clock() - loop.start
            outcome.page_url = page_url
            _final_report(settings, outcome, ci, store, image, echo, surfaces.source.snapshot)
            if wait_for_interrupt is not None and settings.wait and page_url:
                echo(f"live status page stays up at {page_url} - press Ctrl-C to stop the demo")
                with contextlib.suppress(KeyboardInterrupt):
                    wait_for_interrupt()
            return outcome
    finally:
        _teardown(provider, state_path, echo)
        controller.stop()
        surfaces.close()
        store.close()


def _page_commits(clone: Path) -> list[CommitLine]:
    """Recent commits for the live page, through its own GitStore (the loop's is busy in another thread)."""
    if not (clone / ".git").exists():
        return []
    with GitStore(clone) as git:
        return git.recent_commits(12)


class _Loop:
    """CI's provisioner and the reconciler, driven in turns like production: every push to origin runs the
    provisioner (`apply_fleet` here, `pulumi up` in production); every poll the reconciler judges and pushes."""

    def __init__(self, settings: DemoSettings, bot: GitStore, ci: GitStore, store: ControllerStore,
                 provider: SlotProvider, state_path: Path, echo: Callable[[str], None], clock: Callable[[], float],
                 sleep: Callable[[float], None], on_pass: Callable[[PassResult], None]):
        self.settings, self.bot, self.ci, self.store = settings, bot, ci, store
        self.provider, self.state_path, self.echo = provider, state_path, echo
        self.clock, self.sleep, self.on_pass = clock, sleep, on_pass
        self.start = clock()
        self.seen: set[tuple[str, str]] = set()
        self.passes = 0
        self.commits: list[str] = []

    def say(self, line: str) -> None:
        self.echo(f"[{self.clock() - self.start:5.1f}s] {line}")

    def run(self, image: Image, done: Callable[[PassResult, bool], bool],
            on_apply: Callable[[str], None] | None = None) -> bool:
        """Turns until `done(last pass, applied at the tip)` or the deadline; True when done."""
        started = self.clock()
        applied_at: str | None = None
        while self.clock() - started < self.settings.deadline_s:
            head = self.ci.sync()
            if head != applied_at:
                self.say(f"ci: origin at {head[:8]} -> apply (image {image.digest[:19]})")

                def show(line: str) -> None:
                    self.echo(f"          apply: {line}")
                    if on_apply is not None:
                        on_apply(line)

                report = _apply(self.ci, self.provider, self.state_path, image, show)
                applied_at = head if not report.failed else None
            self.sleep(self.settings.poll_s)
            _print_progress(self.store.reports(), self.seen, self.say)
            result = run_pass(GitFleetTree(self.bot), self.store, datetime.now(UTC),
                              desired_image_digest=image.digest, directive_sink=self.store)
            self.passes += 1
            self.on_pass(result)
            _print_pass(result, self.say)
            if result.commit:
                self.commits.append(result.commit)
            if done(result, head == applied_at):
                return True
        return False

    def converge(self, image: Image, phase: str) -> DemoOutcome:
        started = self.clock()
        converged = self.run(image, lambda result, applied: result.commit is None and applied
                             and _all_slots_proven(self.ci, self.state_path))
        outcome = DemoOutcome(converged=converged, elapsed_s=self.clock() - started, passes=self.passes,
                              commits=list(self.commits))
        self.ci.sync()
        records = load_records(self.ci.workdir / "fleet-spec")
        outcome.bad_machines = sorted(records.bad_machine_ids())
        outcome.kept = {slot: out.machine_id for slot, out in sorted(load_slot_state(self.state_path).items())}
        self.say(f"{phase}: {'converged' if converged else 'DID NOT converge'}; bad machines: "
                 f"{', '.join(outcome.bad_machines) or 'none'}")
        return outcome


#: The broken build of the story: a refactor hard-coded the benchmark's daemon address to the wrong port, so
#: every benchmark of this image exits 1 after 0 proofs with "connection refused" - the seed's incident.
BROKEN_BUILD_LINE = ('FLEET_DAEMON_ADDR="http://127.0.0.1:9821"  # v2 build: daemon address hard-coded '
                     "(wrong port) - the demo's broken image")


def make_image_build(source: Path, dest: Path, version: str, *, broken: bool) -> Path:
    """A copy of the worker image as another build: `broken` breaks every benchmark the way the seed's incident
    did; otherwise it differs from the source only by its version file (a new digest, same behaviour)."""
    shutil.copytree(source, dest, symlinks=True)
    (dest / "BUILD_VERSION").write_text(f"{version}\n")
    if broken:
        script = dest / "benchmark.sh"
        first, _, rest = script.read_text().partition("\n")
        script.write_text(f"{first}\n{BROKEN_BUILD_LINE}\n{rest}")
    return dest


def _image_story(settings: DemoSettings, loop: _Loop, good: Image, before: DemoOutcome, workdir: Path,
                 surfaces: Any) -> tuple[ImageStory, Image, DemoOutcome]:
    echo = loop.echo
    builds = workdir / "image-builds"
    broken_dir = make_image_build(settings.worker_image, builds / "v2-broken", "v2", broken=True)
    broken = Image(str(broken_dir), directory_digest(broken_dir))
    story = ImageStory(broken_digest=broken.digest)
    echo("")
    echo(f"=== a new worker image build v2 ({broken.digest[:19]}) is rolled out to every slot ===")
    surfaces.source.set_desired_image_digest(broken.digest)
    bad_before = set(before.bad_machines)

    def on_apply(line: str) -> None:
        if "paused" in line or "hold" in line.lower():
            story.paused.append(line)
        if story.tripped and "rented machine" in line:
            # The suspect record pauses the pools it names (where the failure was seen); another pool goes on
            # until its own failure grows the record. What must never happen is a rental in a paused pool: read
            # the records apply planned from (the tree it was just synced to).
            slot = line.split()[1]
            pool = desired_slots(load_spec(loop.ci.workdir / SPEC_PATH)).get(slot)
            records = load_records(loop.ci.workdir / "fleet-spec")
            if pool is None or pool_pause(pool.name, records, broken.digest) is not None:
                story.rented_after_trip.append(line)
            else:
                story.rented_unpaused.append(line)

    def judged_everything(result: PassResult, applied: bool) -> bool:
        for v in result.verdicts:
            if v.image_digest == broken.digest and v.held_by and v.machine_id:
                story.held.append(v.machine_id)
        if result.breaker_trips and not story.tripped:
            story.tripped = True
            trip = result.breaker_trips[0]
            failing = next((v for v in result.verdicts if v.image_digest == broken.digest and v.is_failure), None)
            cause = failing.root_cause() if failing is not None else trip.reason
            story.root_cause = (f"ROOT CAUSE: image {broken.digest[:19]} (build v2), not the machines: {cause} - "
                                f"the same failure ({trip.signature}) on machines {', '.join(trip.machines)}")
            echo("")
            echo(story.root_cause)
            echo(f"circuit breaker tripped: {trip.reason}")
            echo("")
        if not (story.tripped and applied):
            return False
        slots = load_slot_state(loop.state_path)
        judged = {b.instance_id for rec in load_records(loop.ci.workdir / "fleet-spec").machines.values()
                  for b in rec.benchmarks}
        return all(o.instance_id in judged for o in slots.values() if o.image_digest == broken.digest)

    loop.run(broken, judged_everything, on_apply)
    records = load_records(loop.ci.workdir / "fleet-spec")
    newly_bad = sorted(records.bad_machine_ids() - bad_before)
    echo(f"image v2: breaker {'tripped' if story.tripped else 'DID NOT trip'}; machines newly recorded bad: "
         f"{', '.join(newly_bad) or 'none'}")

    fixed_dir = make_image_build(settings.worker_image, builds / "v3-fixed", "v3", broken=False)
    fixed = Image(str(fixed_dir), directory_digest(fixed_dir))
    story.fixed_digest = fixed.digest
    echo("")
    echo(f"=== the fixed build v3 ({fixed.digest[:19]}) is rolled out; the paused pools resume ===")
    surfaces.source.set_desired_image_digest(fixed.digest)
    after = loop.converge(fixed, "fixed image v3")
    story.recovered = after.converged
    return story, fixed, after


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
                  echo: Callable[[str], None], snapshot: Callable[[], LiveSnapshot]) -> None:
    ci.sync()
    spec = load_spec(ci.workdir / SPEC_PATH)
    records = load_records(ci.workdir / "fleet-spec")
    view = status_view(spec, records, store.reports(), datetime.now(UTC), desired_image_digest=image.digest)
    page = settings.workdir.resolve() / "status.html"
    # The static export of the live page (same templates), with spend, SLO and the recent commits.
    write_text_atomic(page, render_html(view, spec_source=f"origin:{SPEC_PATH}", extras=snapshot().extras))
    story = outcome.story
    echo("")
    if story is not None and story.root_cause:
        # The root cause first: the seed's lesson is that it must not sit in a log nobody reads.
        echo(story.root_cause)
        echo("")
    echo("=== fleet status ===")
    echo(render_text(view).rstrip())
    echo(f"(the same as a page with rate plots and timelines: {page})")
    echo("")
    echo("=== audit trail: git log of origin (reconciler commits) ===")
    echo(_git("log", "--format=%h %an: %s%n%(trailers:key=Fleet-Machine,key=Fleet-Verdict,key=Fleet-Image,"
                     "key=Fleet-Instance)", "origin/main", cwd=ci.workdir).rstrip())
    for machine_id in outcome.bad_machines:
        echo("")
        echo(f"=== fleet why {machine_id} ===")
        echo(_why(ci.workdir, machine_id).rstrip())
    echo("")
    state = "converged" if outcome.converged else "DID NOT converge"
    echo(f"demo {state} in {outcome.elapsed_s:.1f}s over {outcome.passes} reconcile passes, "
         f"{len(outcome.commits)} record commit(s); bad machines: {', '.join(outcome.bad_machines) or 'none'}; "
         f"slots: {', '.join(f'{s}={m}' for s, m in outcome.kept.items())}")
    if story is not None:
        echo(f"image story: v2 {story.broken_digest[:19]} broken -> breaker "
             f"{'tripped' if story.tripped else 'DID NOT trip'}, failures held on machines "
             f"{', '.join(sorted(set(story.held))) or 'none'} (not marked bad); v3 "
             f"{(story.fixed_digest or '?')[:19]} {'recovered every pool' if story.recovered else 'DID NOT recover'}")


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
    p.add_argument("--proofs", type=int, default=DemoSettings.proofs, help="proofs per benchmark")
    p.add_argument("--no-image-story", action="store_true",
                   help="stop after the machine faults (skip the broken-image build and its recovery)")
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--wait", dest="wait", action="store_true", default=None,
                      help="keep the live status page up at the end until Ctrl-C (default when interactive)")
    wait.add_argument("--no-wait", dest="wait", action="store_false",
                      help="exit at the end (default when stdin is not a terminal or CI=true)")
    p.set_defaults(func=run)


def should_wait(flag: bool | None, stdin_is_tty: bool, ci: bool) -> bool:
    """Keep the page up only for a person at a terminal: never in CI or when run without a terminal (tests,
    `make demo` in a pipeline), unless asked explicitly."""
    if flag is not None:
        return flag
    return stdin_is_tty and not ci


def _wait_forever() -> None:
    import threading

    threading.Event().wait()


def run(args: argparse.Namespace) -> int:
    from reconciler.adapters.settings import settings as read_settings

    wait = should_wait(args.wait, sys.stdin.isatty(), read_settings().ci)
    settings = DemoSettings(workdir=args.workdir, deadline_s=args.deadline, time_scale=args.time_scale,
                            proofs=args.proofs, image_story=not args.no_image_story, wait=wait)
    try:
        outcome = run_demo(settings, echo=lambda line: print(line, flush=True), wait_for_interrupt=_wait_forever)
    except DemoError as exc:
        print(f"fleet demo: {exc}", file=sys.stderr)
        return 1
    story_ok = outcome.story is None or (outcome.story.tripped and outcome.story.recovered)
    return 0 if outcome.converged and story_ok else 1
