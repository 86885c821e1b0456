"""Crash safety of write, commit and push (issue 14 item 3), with a REAL `fleet reconcile --once` process.

The process is SIGKILLed together with its git children (the whole process group, as the OOM killer or a
power cut would leave things) at each step: while writing the record files, while `git add` holds
`.git/index.lock`, after the commit and before the push, and during the push (before and after the remote
updated its branch). A restarted reconciler recovers (a stale lock is removed only when no process holds
it), nothing reported is lost, and nothing is committed twice.

Steps are reached exactly, no sleeps: the reconciler stops itself (SIGSTOP) at a named step when
FLEET_TEST_PAUSE_AT is set, and for the steps inside git, a clean filter (runs inside `git add`) or a
pre-/post-receive hook of the origin announces itself on a FIFO and blocks.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.adapters.store.sqlite import SqliteStore
from tests.gitrepos import git, make_origin, origin_file
from tests.scenarios import SPEC_YAML

#: One instance per pool: both machines are recorded bad (each pool's kill budget allows one).
MACHINES = {"rtx-pro-4000-0-crash1": ("51001", "rtx-pro-4000"), "rtx4090-0-crash2": ("51002", "rtx4090")}


@dataclass
class Scenario:
    tmp: Path
    origin: Path
    bot: Path
    db: Path
    fifo: Path

    def command(self) -> list[str]:
        return [sys.executable, "-m", "reconciler.cli", "reconcile", "--repo", str(self.origin),
                "--workdir", str(self.bot), "--controller-db", str(self.db), "--once"]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        return {**env, "FLEET_TEST_PAUSE_FIFO": str(self.fifo), **extra}

    def run(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(), capture_output=True, text=True, env=self.env(**extra), timeout=300)

    def kill_at(self, step: str, **extra: str) -> str:
        """Start the reconciler, wait until it announces `step` on the FIFO, SIGKILL its process group."""
        rfd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        keep = os.open(self.fifo, os.O_WRONLY)  # a writer of our own: no EOF before the real one writes
        proc = subprocess.Popen(self.command(), env=self.env(**extra), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            ready, _, _ = select.select([rfd], [], [], 120)
            if not ready:
                proc.kill()
                out, err = proc.communicate(timeout=30)
                pytest.fail(f"the reconciler never reached {step!r}: rc={proc.returncode} {out} {err}")
            announced = os.read(rfd, 200).decode().split()[0]  # "<step> <pid>"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
            os.close(keep)
            os.close(rfd)
        assert proc.returncode == -signal.SIGKILL
        return announced


def write_reports(db: Path) -> None:
    """Two finished benchmarks, both below the pool's minimum: two verdicts, two record files."""
    store = SqliteStore(db)
    for iid, (machine, pool) in MACHINES.items():
        store.register(iid, {"protocol": 1, "instance_id": iid, "at": "2026-12-02T18:00:00Z",
                             "pool": pool, "slot": f"{pool}-0", "machine_id": machine, "host_id": "7781"})
        store.set_result(iid, {"protocol": 1, "outcome": "completed", "at": "2026-12-02T18:40:00Z",
                               "started_at": "2026-12-02T18:20:00Z", "exit_code": 0, "requested": 10,
                               "completed": 10, "failed": 0, "proofs_per_hour": 20.0, "seconds_per_proof": 180.0,
                               "log_tail": ["throughput:    0.333 proofs/min (180.0s/proof)"]})
    store.close()


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Scenario]:
    origin, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML, "README.md": "fleet\n"})
    bot = tmp_path / "bot"
    git(tmp_path, "clone", "--quiet", str(origin), str(bot))
    db = tmp_path / "controller.db"
    write_reports(db)
    fifo = tmp_path / "pause.fifo"
    os.mkfifo(fifo)
    yield Scenario(tmp_path, origin, bot, db, fifo)


def install_hook(path: Path, step: str) -> None:
    """A git hook/filter that announces `step` on the FIFO and stops itself (until the test kills it)."""
    path.write_text(f'#!/bin/sh\nprintf "{step}\\n" > "$FLEET_TEST_PAUSE_FIFO"\nkill -STOP $$\ncat\n')
    path.chmod(0o755)


def assert_recovered(s: Scenario) -> None:
    """Restart: one commit with both verdicts on the origin, clean clone, no lock; a second restart adds nothing."""
    restart = s.run()
    assert restart.returncode == 0, restart.stdout + restart.stderr
    commits = git(s.origin, "log", "--format=%an|%s", "main").splitlines()
    assert len(commits) == 2, commits
    assert commits[0].startswith("fleet-reconciler|fleet: ") and "2 verdicts" in commits[0], commits
    instances = git(s.origin, "log", "--format=%(trailers:key=Fleet-Instance,valueonly)", "main").split()
    assert sorted(instances) == sorted(MACHINES)  # each judged exactly once
    for machine, _ in MACHINES.values():
        record = origin_file(s.origin, f"fleet-spec/machines/{machine}.yaml")
        assert record is not None and "status: bad" in record and "below-min-rate" in record
    assert not list((s.bot / ".git").rglob("*.lock"))
    assert git(s.bot, "status", "--porcelain", "--untracked-files=all") == ""
    assert git(s.bot, "rev-parse", "HEAD") == git(s.origin, "rev-parse", "main")
    again = s.run()
    assert again.returncode == 0 and "nothing new" in again.stdout, again.stdout + again.stderr
    assert len(git(s.origin, "log", "--format=%H", "main").splitlines()) == 2
    store = SqliteStore(s.db)  # nothing reported was lost
    assert sorted(r.instance_id for r in store.reports()) == sorted(MACHINES)
    store.close()


def test_killed_while_writing_the_record_files(scenario: Scenario) -> None:
    assert scenario.kill_at("write", FLEET_TEST_PAUSE_AT="write") == "write"
    machines = scenario.bot / "fleet-spec" / "machines"
    assert len(list(machines.glob("*.yaml"))) == 1  # one record written, the other not yet
    assert origin_file(scenario.origin, "fleet-spec/machines/51001.yaml") is None
    assert_recovered(scenario)


def test_killed_during_git_add_leaves_index_lock_that_the_restart_removes(scenario: Scenario) -> None:
    filter_script = scenario.tmp / "crash-filter.sh"
    install_hook(filter_script, "git-add")
    git(scenario.bot, "config", "filter.crashpoint.clean", str(filter_script))
    (scenario.bot / ".git" / "info").mkdir(exist_ok=True)
    (scenario.bot / ".git" / "info" / "attributes").write_text("fleet-spec/machines/*.yaml filter=crashpoint\n")
    assert scenario.kill_at("git-add") == "git-add"
    assert (scenario.bot / ".git" / "index.lock").exists()  # the wedge of the issue, for real
    git(scenario.bot, "config", "--unset", "filter.crashpoint.clean")
    (scenario.bot / ".git" / "info" / "attributes").unlink()
    assert_recovered(scenario)


def test_killed_after_the_commit_before_the_push(scenario: Scenario) -> None:
    assert scenario.kill_at("push", FLEET_TEST_PAUSE_AT="push") == "push"
    assert "2 verdicts" in git(scenario.bot, "log", "-1", "--format=%s")  # committed locally...
    assert len(git(scenario.origin, "log", "--format=%H", "main").splitlines()) == 1  # ...not pushed
    assert_recovered(scenario)


@pytest.mark.parametrize("hook", ["pre-receive", "post-receive"])
def test_killed_during_the_push(scenario: Scenario, hook: str) -> None:
    """pre-receive: the objects arrived, the branch did not move; post-receive: the branch moved, the
    reconciler never heard back. Either way the restart ends with the verdicts committed exactly once."""
    install_hook(scenario.origin / "hooks" / hook, hook)
    assert scenario.kill_at(hook) == hook
    moved = len(git(scenario.origin, "log", "--format=%H", "main").splitlines()) == 2
    assert moved == (hook == "post-receive")
    (scenario.origin / "hooks" / hook).unlink()
    assert_recovered(scenario)


def test_a_lock_held_by_a_live_process_is_never_removed(scenario: Scenario) -> None:
    lock = scenario.bot / ".git" / "index.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; f = open(sys.argv[1], 'a'); sys.stdin.read()",
                               str(lock)], stdin=subprocess.PIPE)
    try:
        for _ in range(2000):  # until the holder has opened it (bounded; a file check, no sleep)
            if lock.exists():
                break
        blocked = scenario.run()
        assert blocked.returncode == 1 and "held by running process" in blocked.stdout + blocked.stderr
        assert lock.exists()
        assert len(git(scenario.origin, "log", "--format=%H", "main").splitlines()) == 1
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert lock.exists()  # left behind by a process that is gone now: stale
    assert_recovered(scenario)
