"""Fault injection across the pieces, with real servers, real git origins, real processes and a real full disk.

What other test files already prove is not repeated here (vast.ai client retries: test_vastai_client; one
rejected publish: test_gitstore/test_loop; SIGKILL of the controller losing no acknowledged log line:
test_controller_http). These are the cross-cutting scenarios:
- the marketplace fails (5xx, read timeout, garbage JSON) during an apply pass that WOULD replace a slot on a
  bad machine: nothing is destroyed, the slot state file is untouched, the CLI says so in one line;
- git pushes are rejected for several passes while new reports keep arriving: each pass retries a bounded
  number of times, nothing is lost, and the first pass after the outage publishes every verdict once;
- the controller process is SIGKILLed mid-ingest: the store is sound, the loop judges what was acknowledged,
  and a restarted controller accepts new reports which the next pass judges;
- the reconciler process is SIGKILLed while its push is in flight (records written and committed, not on
  origin), or leaves half-written record files behind: the next pass recovers, each verdict exactly once;
- the disk is full when a record is written (a real tmpfs): a clear error, no partial file, nothing pushed,
  and the next pass after space is freed publishes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.marketplace import vastai
from reconciler.adapters.marketplace.vastai import RetryPolicy, Timeouts, VastAiMarketplace
from reconciler.adapters.record_files import (
    load_records,
    machine_record_path,
    parse_machine_record,
    render_machine_record,
)
from reconciler.adapters.slot_provider import SlotProvider
from reconciler.adapters.spec_files import check_spec_text
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.cli import main
from reconciler.domain.marketplace import MarketplaceError
from reconciler.domain.records import MachineRecord
from reconciler.domain.tokens import instance_token
from reconciler.flows.judge import PassResult, run, run_pass
from reconciler.flows.provision import apply_fleet
from tests.controller_support import StepClock
from tests.fakes import Sleeps
from tests.fault_support import IMAGE, SECRET, VAST_SPEC, bot_clone, register_doc
from tests.gitrepos import git, install_rejecting_hook, make_origin, origin_file, origin_log
from tests.scenarios import SPEC_YAML
from tests.vast_fake import Fault, VastFake

T0 = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
DIGEST = "sha256:" + "a1" * 32
VAST_KEY = "fault-test-vast-key"


def result_doc(rate: float, log_tail: list[str] | None = None) -> dict[str, Any]:
    spp = round(3600.0 / rate, 1)
    return {"protocol": 1, "outcome": "completed", "at": "2026-12-02T19:00:00Z", "started_at": "2026-12-02T18:25:00Z",
            "exit_code": 0, "requested": 10, "completed": 10, "failed": 0, "proofs_per_hour": rate,
            "seconds_per_proof": spp, "proof_type": "porep", "concurrency": 2, "image_digest": DIGEST,
            "log_tail": log_tail or ["=== Batch Summary ===",
                                     f"throughput:    {rate / 60:.3f} proofs/min ({spp}s/proof)"]}


def report_finished(store: SqliteStore, instance_id: str, machine_id: str, rate: float,
                    log_tail: list[str] | None = None) -> None:
    """A worker's whole life in the store: register, benchmark events, result."""
    store.register(instance_id, register_doc(instance_id, machine_id))
    for phase, status, minute in (("params", "started", 1), ("params", "done", 22), ("benchmark", "started", 25),
                                  ("benchmark", "done", 59)):
        store.add_event(instance_id, {"protocol": 1, "phase": phase, "status": status,
                                      "at": f"2026-12-02T18:{minute:02d}:00Z"})
    store.set_result(instance_id, result_doc(rate, log_tail))




def machine_file(machine_id: str) -> str:
    return f"fleet-spec/machines/{machine_id}.yaml"


def trailer_list(bare: Path, key: str) -> list[str]:
    return [v for v in git(bare, "log", f"--format=%(trailers:key={key},valueonly)", "main").split("\n") if v]


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    bare, _seed = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML, "README.md": "fleet\n"})
    return bare


LATER = T0 + timedelta(hours=3)


class ApplyRig:
    """A converged 2-slot fleet on the vast.ai fake, with the machine of slot 0 then recorded bad: the next
    apply pass would destroy and replace it - unless the marketplace fails first."""

    def __init__(self, root: Path, fake: VastFake):
        self.fake = fake
        self.spec_dir = root / "fleet-spec"
        self.spec_dir.mkdir()
        (self.spec_dir / "fleet.yaml").write_text(VAST_SPEC)
        spec, problems = check_spec_text(VAST_SPEC, "fleet.yaml")
        assert spec is not None, problems
        self.spec = spec
        self.state_dir = root / "state"
        self.state = self.state_dir / "slots.json"
        self.sleeps = fake.clock  # pacing and backoff sleep on the fake's clock: no real wait
        self.market = VastAiMarketplace(VAST_KEY, base_url=fake.base_url, clock=fake.clock, sleep=fake.clock.sleep,
                                        retry=RetryPolicy(max_attempts=3), timeouts=Timeouts(read_s=0.3),
                                        jitter=lambda: 0.5)
        self.provider = SlotProvider(self.market, SECRET)
        report = self.apply()
        assert report.converged and len(report.slots) == 2
        self.victim = report.slots["rtx4090-0"]
        bad = MachineRecord(self.victim.machine_id, status="bad", gpu_name="RTX 4090")
        write_text_atomic(machine_record_path(self.spec_dir, self.victim.machine_id), render_machine_record(bad))

    def apply(self) -> Any:
        return apply_fleet(self.spec, load_records(self.spec_dir), self.provider, self.state, IMAGE,
                           T0, echo=lambda _line: None)

    def destroys(self) -> int:
        return len(self.fake.requests_to("DELETE", "/api/v0/instances/"))


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[ApplyRig]:
    with VastFake(api_key=VAST_KEY) as fake:
        r = ApplyRig(tmp_path, fake)
        yield r
        r.market.close()


READS = {"method": "GET", "path_prefix": "/api/v0/instances/"}


@pytest.mark.parametrize("inject", [
    pytest.param(lambda fake: fake.fail_next(99, status=502, **READS), id="5xx"),
    pytest.param(lambda fake: fake.slow_next(99, delay_s=1.0, **READS), id="read-timeout"),
    pytest.param(lambda fake: fake.garbage_next(99, **READS), id="garbage-json"),
])
def test_marketplace_failure_during_apply_destroys_nothing_and_keeps_state(
        rig: ApplyRig, inject: Callable[[VastFake], None]) -> None:
    state_before = rig.state.read_bytes()
    rig.sleeps.calls.clear()
    inject(rig.fake)
    with pytest.raises(MarketplaceError) as err:
        rig.apply()
    assert "failed after 3 attempts" in str(err.value)  # bounded, and says so
    assert rig.destroys() == 0  # no kill on a failed look
    assert rig.state.read_bytes() == state_before
    assert len(rig.sleeps.calls) == 2  # backoff between the 3 attempts, on the injected sleep

    rig.fake._faults.clear()
    report = rig.apply()  # the market answers again: the planned replacement happens, exactly once
    assert report.converged and rig.destroys() == 1
    assert report.slots["rtx4090-0"].machine_id != rig.victim.machine_id


def test_marketplace_failure_while_renting_after_a_replace_is_a_temporary_failed_action(rig: ApplyRig) -> None:
    rig.fake.fail_next(99, status=503, method="POST", path_prefix="/api/v0/bundles/")
    report = rig.apply()
    assert not report.converged
    [failed] = report.failed
    assert failed.temporary and "temporary" in failed.message and "HTTP 503" in failed.message
    # delete-before-replace had already destroyed the bad machine's instance (never pay for two) and the
    # state file says the slot is empty, so nothing is forgotten; the other slot was never touched.
    assert rig.destroys() == 1
    slots = json.loads(rig.state.read_text())["slots"]
    assert set(slots) == {"rtx4090-1"}
    rig.fake._faults.clear()
    assert rig.apply().converged


def test_fleet_apply_cli_says_nothing_changed_when_the_market_is_down(rig: ApplyRig,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", VAST_KEY)
    monkeypatch.setenv("FLEET_CONTROLLER_SECRET", SECRET.decode())
    monkeypatch.setattr(vastai.client, "TIME", vastai.TimeSource(rig.fake.clock, rig.fake.clock.sleep))
    state_before = rig.state.read_bytes()
    # Every attempt of every read fails (the backoff sleeps on the fake's clock).
    rig.fake.inject(Fault("status", 500, {"success": False, "msg": "Internal Server Error"}, {"Retry-After": "0"},
                          remaining=99, **READS))
    code = main(["apply", "--spec", str(rig.spec_dir / "fleet.yaml"), "--backend", "vastai", "--state-dir",
                 str(rig.state_dir), "--vast-base-url", rig.fake.base_url, "--image", IMAGE.ref])
    out = capsys.readouterr()
    assert code == 1
    assert "cannot observe the fleet, nothing changed" in out.err and "HTTP 500" in out.err
    assert "Traceback" not in out.err + out.out
    assert rig.destroys() == 0 and rig.state.read_bytes() == state_before


# --- git push rejected for several passes, reports keep arriving -------------------------------------------


def test_push_rejected_for_several_passes_loses_nothing_and_the_next_pass_publishes_all(
        origin: Path, tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "controller.db", now=StepClock())
    sleeps = Sleeps()
    git_store = GitStore(bot_clone(origin, tmp_path / "bot"), sleep=sleeps, rng=random.Random(1), max_attempts=3)
    hook = install_rejecting_hook(origin)
    before = origin_log(origin)
    arrivals = iter([("pro-0-aaaaaa", "123", 20.0), ("pro-1-bbbbbb", "456", 35.0), ("pro-0-cccccc", "789", 12.0)])
    clock = iter(LATER + timedelta(minutes=m) for m in range(100))

    def one_pass(now: datetime) -> PassResult:
        arrival = next(arrivals, None)
        if arrival is not None:  # a worker reports between passes
            report_finished(store, *arrival)
        return run_pass(GitFleetTree(git_store), store, now)

    results = run(one_pass, interval_s=60, stop_event=threading.Event(), clock=lambda: next(clock),
                  sleep=sleeps, max_passes=3)
    assert [r.ok for r in results] == [False, False, False]
    assert all(r.error and "rejected" in r.error and r.stalled is None for r in results)
    # each pass tried at most max_attempts times: 2 backoff sleeps per pass, plus the loop's interval waits
    assert sleeps.calls.count(60) == 2 and len(sleeps.calls) == 3 * 2 + 2
    assert origin_log(origin) == before
    assert len(store.reports()) == 3  # the controller store still holds everything

    hook.unlink()
    result = run_pass(GitFleetTree(git_store), store, LATER + timedelta(hours=1))
    assert result.ok and result.pushed
    assert sorted(trailer_list(origin, "Fleet-Instance")) == ["pro-0-aaaaaa", "pro-0-cccccc", "pro-1-bbbbbb"]
    assert len(origin_log(origin)) == len(before) + 1  # one commit, not one per failed attempt
    again = run_pass(GitFleetTree(git_store), store, LATER + timedelta(hours=2))
    assert again.ok and again.commit is None
    store.close()


# --- the controller process is SIGKILLed mid-ingest; the loop carries on -------------------------------------

CONTROLLER = textwrap.dedent("""
    import sys, threading
    from reconciler.adapters.controller.server import ControllerServer
    from reconciler.adapters.store.sqlite import SqliteStore
    store = SqliteStore(sys.argv[1])
    server = ControllerServer(store, sys.argv[2].encode(), None, "127.0.0.1", 0).start()
    print(server.url, flush=True)
    threading.Event().wait(120)  # bounded: the test kills it long before
""")


@contextlib.contextmanager
def controller_process(db: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(db), SECRET.decode()], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield proc, url
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def post(client: httpx.Client, instance_id: str, action: str, doc: dict[str, Any]) -> httpx.Response:
    return client.post(f"/api/v1/instances/{instance_id}/{action}", json=doc,
                       headers={"Authorization": f"Bearer {instance_token(SECRET, instance_id)}"})


def test_controller_killed_mid_ingest_then_loop_judges_what_was_acknowledged(origin: Path, tmp_path: Path) -> None:
    db = tmp_path / "controller.db"
    acked_lines = 0
    with controller_process(db) as (proc, url), httpx.Client(base_url=url, timeout=10) as client:
        assert post(client, "pro-0-aaaaaa", "register", register_doc("pro-0-aaaaaa", "123")).status_code == 200
        assert post(client, "pro-0-aaaaaa", "result", result_doc(20.0)).status_code == 200
        assert post(client, "pro-1-bbbbbb", "register", register_doc("pro-1-bbbbbb", "456")).status_code == 200
        for n in range(5_000):  # a flood of log batches; the process dies under it
            if n == 200:
                proc.send_signal(signal.SIGKILL)
            try:
                r = post(client, "pro-1-bbbbbb", "logs", {"protocol": 1, "lines": [f"line {n}"] * 20})
            except httpx.HTTPError:
                break
            assert r.status_code == 200
            acked_lines += 20
        else:
            pytest.fail("the controller kept answering after SIGKILL")

    store = SqliteStore(db)
    assert store.integrity_check() == ["ok"]
    assert len(store.tail("pro-1-bbbbbb", 10_000)) >= acked_lines
    git_store = GitStore(bot_clone(origin, tmp_path / "bot"), sleep=Sleeps())
    # The controller process stamps registrations with the real clock; judge well within the deadline.
    now = datetime.now(UTC) + timedelta(minutes=1)
    first = run_pass(GitFleetTree(git_store), store, now)
    assert first.ok and [v.instance_id for v in first.verdicts] == ["pro-0-aaaaaa"]  # pro-1 has no result yet
    store.close()

    with controller_process(db) as (_proc, url), httpx.Client(base_url=url, timeout=10) as client:
        assert post(client, "pro-1-bbbbbb", "result", result_doc(35.0)).json()["status"] == "stored"
        assert post(client, "pro-0-aaaaaa", "result", result_doc(20.0)).json()["status"] == "duplicate"
    store = SqliteStore(db)
    second = run_pass(GitFleetTree(git_store), store, now + timedelta(minutes=5))
    assert second.ok and [v.instance_id for v in second.verdicts] == ["pro-1-bbbbbb"]
    assert trailer_list(origin, "Fleet-Instance") == ["pro-1-bbbbbb", "pro-0-aaaaaa"]
    store.close()


# --- the reconciler process is SIGKILLed between record write and push -------------------------------------

RECONCILER = textwrap.dedent("""
    import sys
    from datetime import datetime
    from reconciler.adapters.fleet_tree import GitFleetTree
    from reconciler.adapters.git import GitStore
    from reconciler.flows.judge import run_pass
    from reconciler.adapters.store.sqlite import SqliteStore
    result = run_pass(GitFleetTree(GitStore(sys.argv[1], max_attempts=1)), SqliteStore(sys.argv[2]),
                      datetime.fromisoformat(sys.argv[3]))
    print(result.headline(), flush=True)
""")


def blocking_hook(bare: Path, reached: Path) -> Path:
    """A pre-receive hook that says it was reached, then holds the push (bounded) until killed."""
    hook = bare / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\ntouch '{reached}'\nsleep 60\nexit 1\n")
    hook.chmod(0o755)
    return hook


def wait_for(path: Path, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"reconciler exited early ({proc.returncode}): {proc.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{path} never appeared")
        time.sleep(0.05)


def test_reconciler_killed_while_pushing_is_recovered_exactly_once(origin: Path, tmp_path: Path) -> None:
    db = tmp_path / "controller.db"
    store = SqliteStore(db, now=StepClock())
    report_finished(store, "pro-0-aaaaaa", "123", 20.0)
    store.close()
    bot = bot_clone(origin, tmp_path / "bot")
    reached = tmp_path / "push-reached"
    hook = blocking_hook(origin, reached)
    before = origin_log(origin)
    proc = subprocess.Popen([sys.executable, "-c", RECONCILER, str(bot), str(db), LATER.isoformat()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(reached, proc)
        # The record is written and committed in the bot clone; the push is in flight. Kill the whole
        # process group we started (the reconciler, its git push and the hook it is waiting on).
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.communicate()
    assert "[1 verdict" in git(bot, "log", "-1", "--format=%s")
    assert origin_log(origin) == before and origin_file(origin, machine_file("123")) is None

    hook.unlink()
    store = SqliteStore(db)
    restarted = GitStore(bot, sleep=Sleeps())
    result = run_pass(GitFleetTree(restarted), store, LATER + timedelta(minutes=1))
    assert result.ok and result.pushed and [v.instance_id for v in result.verdicts] == ["pro-0-aaaaaa"]
    assert trailer_list(origin, "Fleet-Instance") == ["pro-0-aaaaaa"]
    assert run_pass(GitFleetTree(restarted), store, LATER + timedelta(minutes=2)).commit is None
    store.close()


def test_half_written_record_files_left_by_a_kill_are_discarded(origin: Path, tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "controller.db", now=StepClock())
    report_finished(store, "pro-0-aaaaaa", "123", 20.0)
    bot = bot_clone(origin, tmp_path / "bot")
    machines = bot / "fleet-spec" / "machines"
    machines.mkdir(parents=True)
    # What a kill during write_text_atomic (temp file) or by a non-atomic writer (truncated YAML) leaves.
    (machines / ".123.yaml.x1y2z3.tmp").write_text("machine_id: '123'\nstatus: ba")
    (machines / "123.yaml").write_text("machine_id: '123'\nstatus: bad\nbenchmarks:\n- instance_id: pro-0-")
    result = run_pass(GitFleetTree(GitStore(bot, sleep=Sleeps())), store, LATER)
    assert result.ok and result.pushed
    record = parse_machine_record(origin_file(origin, machine_file("123")) or "", Path("123.yaml"))
    assert record.status == "bad" and [b.instance_id for b in record.benchmarks] == ["pro-0-aaaaaa"]
    assert ".tmp" not in git(origin, "ls-tree", "-r", "--name-only", "main")
    assert sorted(p.name for p in machines.iterdir()) == ["123.yaml"]
    store.close()


# --- disk full on the record write (a real tmpfs) -----------------------------------------------------------


@contextlib.contextmanager
def tiny_disk(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("DISK-FULL TEST SKIPPED: mounting a tmpfs needs root; run the suite as root (CI does)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"DISK-FULL TEST SKIPPED: cannot mount a tmpfs here ({mounted.stderr.strip()}); "
                    "the container lacks CAP_SYS_ADMIN")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def fill(disk: Path) -> Path:
    """Write a filler file until the file system says ENOSPC; returns it (delete it to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(100_000):  # bounded: a 1 MiB tmpfs fills in a few hundred 4 KiB writes
            os.write(fd, b"\0" * 4096)
        pytest.fail("the tmpfs never filled up")
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


class FillsDiskAfterSync(GitStore):
    """Our own git port, with the disk filling up right after the sync (another process ate the space)."""

    disk: Path
    filler: Path | None = None

    def sync(self) -> str:
        tip = super().sync()
        if self.filler is None:
            self.filler = fill(self.disk)
        return tip


def test_disk_full_on_record_write_is_a_clear_error_with_no_partial_file(origin: Path, tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "controller.db", now=StepClock())
    # A long log tail makes the record bigger than any slack the file system has left.
    report_finished(store, "pro-0-aaaaaa", "123", 20.0,
                    log_tail=[f"  [{i}/10] ok — 171.4s ... gpu 0: 71C 348W util 99%" for i in range(1, 40)])
    with tiny_disk(tmp_path / "disk", "1m") as disk:
        bot = bot_clone(origin, disk / "bot")
        git_store = FillsDiskAfterSync(bot, sleep=Sleeps())
        git_store.disk = disk
        before = origin_log(origin)
        # Returns, never raises: `fleet reconcile --once` must not print a traceback.
        result = run_pass(GitFleetTree(git_store), store, LATER)
        assert not result.ok and result.error is not None
        assert result.error == "cannot write fleet-spec/machines/123.yaml: No space left on device"
        machines = bot / "fleet-spec" / "machines"
        assert not (machines / "123.yaml").exists()  # no partial record
        assert not machines.exists() or list(machines.iterdir()) == []  # no temp file either
        assert git(bot, "--no-optional-locks", "status", "--porcelain") == ""
        assert origin_log(origin) == before

        assert git_store.filler is not None
        git_store.filler.unlink()  # space is back
        again = run_pass(GitFleetTree(git_store), store, LATER + timedelta(minutes=1))
        assert again.ok and again.pushed
        assert trailer_list(origin, "Fleet-Instance") == ["pro-0-aaaaaa"]
    store.close()


def test_write_text_atomic_on_a_full_disk_leaves_the_old_file_intact(tmp_path: Path) -> None:
    with tiny_disk(tmp_path / "disk", "256k") as disk:
        target = disk / "machines" / "123.yaml"
        write_text_atomic(target, "machine_id: '123'\nstatus: ok\nbenchmarks: []\n")
        filler = fill(disk)
        with pytest.raises(OSError) as err:
            write_text_atomic(target, "machine_id: '123'\n" + "x" * 200_000)
        assert err.value.errno == errno.ENOSPC
        assert target.read_text() == "machine_id: '123'\nstatus: ok\nbenchmarks: []\n"
        assert sorted(p.name for p in target.parent.iterdir()) == ["123.yaml"]
        filler.unlink()
