"""run_pass / run against a real git origin (bare repo in a tmp dir), with a fake of the ReportSource port.

Proves: verdicts land on origin as bot commits with Fleet-* trailers; a repeated pass is a no-op; a crash
between commit and push is recovered by the next pass; an observation failure produces no verdicts; a
bad spec stalls the pass with its reason; a human's pardon is respected until a NEW failure.
"""

from __future__ import annotations

import json
import random
import threading
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import BOT_NAME, GitStore
from reconciler.adapters.record_files import parse_machine_record
from reconciler.cli import main
from reconciler.flows.judge import PassResult, run, run_pass
from tests.fakes import Sleeps
from tests.gitrepos import clone, git, human_commit, install_rejecting_hook, make_origin, origin_file, origin_log
from tests.loop_support import FakeReports, trailers
from tests.scenarios import DAEMON_REFUSED_TAIL, DIGEST, LATER, SPEC_YAML, T0, completed_report

M123 = "fleet-spec/machines/123.yaml"




class ProcessDied(BaseException):
    """Stands for the reconciler process being killed: not an Exception, nothing catches it."""


class DiesBeforePush(GitStore):
    def _push(self) -> None:
        raise ProcessDied


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    bare, _seed = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML, "README.md": "fleet\n"})
    return bare


def bot_store(origin: Path, tmp_path: Path, cls: type[GitStore] = GitStore) -> GitStore:
    workdir = tmp_path / "bot"
    if not workdir.exists():
        git(tmp_path, "clone", "--quiet", str(origin), str(workdir))
    return cls(workdir, sleep=Sleeps(), rng=random.Random(3), max_attempts=2)


def test_verdicts_land_as_bot_commits_with_trailers_and_a_rerun_is_a_no_op(origin: Path, tmp_path: Path) -> None:
    store = bot_store(origin, tmp_path)
    source = FakeReports([completed_report("pro-0-a", "123", 20.0), completed_report("pro-1-a", "456", 35.0)])
    result = run_pass(GitFleetTree(store), source, LATER)
    assert result.ok and result.pushed and result.commit is not None
    assert origin_log(origin)[0] == (f"{BOT_NAME}|fleet: machine 123 below-min-rate: benchmark exit 0, 10/10 proofs: "
                                     "20.0/h < 29/h (180.0 s/proof) (blame: machine) [2 verdicts; 1 bad: machine 123]")
    assert trailers(origin, "Fleet-Instance") == ["pro-0-a", "pro-1-a"]
    assert trailers(origin, "Fleet-Machine") == ["123", "456"]
    record = parse_machine_record(origin_file(origin, M123) or "", Path(M123))
    assert record.status == "bad" and record.host_id == "7781"
    assert record.benchmarks[0].evidence["proofs_per_hour"] == 20.0

    before = origin_log(origin)
    again = run_pass(GitFleetTree(store), source, LATER + timedelta(minutes=1))
    assert again.ok and again.commit is None and again.verdicts == ()
    assert origin_log(origin) == before


def test_crash_between_commit_and_push_is_recovered_by_the_next_pass(origin: Path, tmp_path: Path) -> None:
    source = FakeReports([completed_report("pro-0-a", "123", 20.0)])
    with pytest.raises(ProcessDied):
        run_pass(GitFleetTree(bot_store(origin, tmp_path, DiesBeforePush)), source, LATER)
    bot = tmp_path / "bot"
    assert "[1 verdict" in git(bot, "log", "-1", "--format=%s")  # committed locally...
    assert origin_file(origin, M123) is None  # ...never pushed

    restarted = bot_store(origin, tmp_path)
    result = run_pass(GitFleetTree(restarted), source, LATER + timedelta(minutes=1))
    assert result.pushed and [v.instance_id for v in result.verdicts] == ["pro-0-a"]
    assert trailers(origin, "Fleet-Instance") == ["pro-0-a"]  # exactly once
    assert run_pass(GitFleetTree(restarted), source, LATER + timedelta(minutes=2)).commit is None


def test_rejected_push_is_a_temporary_error_and_the_next_pass_publishes(origin: Path, tmp_path: Path) -> None:
    store = bot_store(origin, tmp_path)
    source = FakeReports([completed_report("pro-0-a", "123", 20.0)])
    hook = install_rejecting_hook(origin)
    result = run_pass(GitFleetTree(store), source, LATER)
    assert not result.ok and result.error is not None and "rejected" in result.error
    assert result.stalled is None and origin_file(origin, M123) is None
    hook.unlink()
    assert run_pass(GitFleetTree(store), source, LATER).pushed
    assert origin_file(origin, M123) is not None


def test_observation_failure_produces_no_verdicts(origin: Path, tmp_path: Path) -> None:
    store = bot_store(origin, tmp_path)
    before = origin_log(origin)
    result = run_pass(GitFleetTree(store), FakeReports(error=OSError("database is locked")), LATER)
    assert result.observation_error == "OSError: database is locked"
    assert result.verdicts == () and result.commit is None and not result.ok
    assert origin_log(origin) == before


def test_bad_spec_stalls_with_its_reason_and_writes_nothing(origin: Path, tmp_path: Path) -> None:
    human = clone(origin, tmp_path / "human")
    human_commit(human, {"fleet-spec/fleet.yaml": SPEC_YAML.replace("min_rate_proofs_per_hour: 29",
                                                                    "min_rate_proofs_per_hour: fast")})
    before = origin_log(origin)
    source = FakeReports([completed_report("pro-0-a", "123", 20.0)])
    result = run_pass(GitFleetTree(bot_store(origin, tmp_path)), source, LATER)
    assert result.stalled is not None
    assert "fleet.yaml" in result.stalled and "min_rate_proofs_per_hour" in result.stalled
    assert "fast" in result.stalled
    assert result.verdicts == () and origin_log(origin) == before
    assert result.headline().startswith("stalled: ")


def test_pardon_is_respected_until_a_new_failure(origin: Path, tmp_path: Path) -> None:
    store = bot_store(origin, tmp_path)
    source = FakeReports([completed_report("pro-0-a", "123", 20.0)])
    assert run_pass(GitFleetTree(store), source, LATER).pushed
    human = clone(origin, tmp_path / "human")
    human_commit(human, {M123: None}, "pardon machine 123: PSU replaced")

    assert run_pass(GitFleetTree(store), source, LATER + timedelta(minutes=5)).commit is None
    assert origin_file(origin, M123) is None

    source.items.append(completed_report("pro-0-b", "123", 21.0))
    result = run_pass(GitFleetTree(store), source, LATER + timedelta(minutes=10))
    assert [v.instance_id for v in result.verdicts] == ["pro-0-b"]
    record = parse_machine_record(origin_file(origin, M123) or "", Path(M123))
    assert record.status == "bad" and [b.instance_id for b in record.benchmarks] == ["pro-0-b"]


def test_run_repeats_passes_on_the_injected_clock_until_stopped(origin: Path, tmp_path: Path) -> None:
    store = bot_store(origin, tmp_path)
    source = FakeReports([completed_report("pro-0-a", "123", 20.0)])
    stop = threading.Event()
    ticks = iter(LATER + timedelta(seconds=30 * i) for i in range(100))
    sleeps = Sleeps()
    seen: list[PassResult] = []

    def on_pass(result: PassResult) -> None:
        seen.append(result)
        if len(seen) == 3:
            stop.set()

    def one_pass(now: datetime) -> PassResult:
        if len(seen) == 1:
            raise RuntimeError("controller store vanished")  # an unexpected bug must not end the loop
        return run_pass(GitFleetTree(store), source, now)

    results = run(one_pass, interval_s=30, stop_event=stop, clock=lambda: next(ticks), sleep=sleeps,
                  on_pass=on_pass)
    assert len(results) == 3 and sleeps.calls == [30, 30]
    assert results[0].pushed
    assert results[1].error is not None and "controller store vanished" in results[1].error
    assert results[2].ok and results[2].commit is None
    assert [r.at for r in results] == [LATER, LATER + timedelta(seconds=30), LATER + timedelta(seconds=60)]


# --- the commands, against a real controller store and a real origin ---------------------------------------


def _seed_store(db: Path, instance_id: str = "pro-4000-0-3f9a1c") -> None:
    from reconciler.adapters.store.sqlite import SqliteStore

    # The controller's clock stamps every arrival (one clock): here a worker whose clock agrees with it, so the
    # reports arrive at the times the worker put in them.
    arrivals = iter(T0 + timedelta(minutes=m) for m in (0, 1, 22, 25, 27, 27))
    last = [T0]

    def clock() -> datetime:
        last[0] = next(arrivals, last[0])
        return last[0]

    store = SqliteStore(db, now=clock)
    try:
        store.register(instance_id, {"protocol": 1, "instance_id": instance_id, "at": "2026-12-02T18:00:00Z",
                                     "pool": "rtx-pro-4000", "slot": "rtx-pro-4000-0", "machine_id": "40213",
                                     "host_id": "7781", "gpu_name": "RTX PRO 4000", "image_digest": DIGEST})
        for phase, status, at in (("params", "started", "18:01"), ("params", "done", "18:22"),
                                  ("benchmark", "started", "18:25")):
            store.add_event(instance_id, {"protocol": 1, "phase": phase, "status": status,
                                          "at": f"2026-12-02T{at}:00Z"})
        store.add_logs(instance_id, list(DAEMON_REFUSED_TAIL))
        store.add_event(instance_id, {"protocol": 1, "phase": "benchmark", "status": "failed",
                                      "at": "2026-12-02T18:27:00Z", "exit_code": 1,
                                      "log_tail": list(DAEMON_REFUSED_TAIL)})
        store.set_result(instance_id, {"protocol": 1, "outcome": "error", "at": "2026-12-02T18:27:00Z",
                                       "requested": 10, "completed": 0, "failed": 0, "exit_code": 1,
                                       "image_digest": DIGEST, "log_tail": list(DAEMON_REFUSED_TAIL)})
    finally:
        store.close()


def test_fleet_reconcile_once_then_status_show_the_root_cause(origin: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "controller.db"
    _seed_store(db)
    workdir = tmp_path / "reconciler"
    argv = ["reconcile", "--repo", str(origin), "--workdir", str(workdir), "--controller-db", str(db), "--once",
            "--image-digest", DIGEST]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "committed" in out and "benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused" in out
    record = parse_machine_record(origin_file(origin, "fleet-spec/machines/40213.yaml") or "",
                                  Path("fleet-spec/machines/40213.yaml"))
    assert record.benchmarks[0].blame == "image" and record.status == "ok"
    assert main(argv) == 0
    assert "nothing new" in capsys.readouterr().out

    assert main(["status", "--workdir", str(workdir), "--controller-db", str(db)]) == 0
    status = capsys.readouterr().out
    assert "reconciler: last pass" in status and "nothing new" in status
    assert ("registered 2026-12-02T18:00:00Z -> params-done +22m00s -> bench-started "
            "+25m00s -> bench-failed +27m00s -> result +27m00s") in status
    assert ("benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused (os error 111) "
            "connecting to 127.0.0.1:9820 "
            "(blame: image)") in status
    # In the text view the root cause comes before the instance's timeline.
    assert status.index("0/10 proofs: Error: connection refused") < status.index("registered 2026-12-02T18:00:00Z")
    assert main(["status", "--workdir", str(workdir), "--controller-db", str(db), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    (pool,) = [p for p in view["pools"] if p["name"] == "rtx-pro-4000"]
    assert (pool["desired"], pool["running"], pool["bad"]) == (2, 1, 0)
    assert view["instances"][0]["verdict"] == "benchmark-error" and view["instances"][0]["recorded"]
    # The root cause is the first thing a reader of the JSON meets (issue 14).
    assert next(iter(view["instances"][0])) == "root_cause"
    assert view["instances"][0]["root_cause"].startswith("benchmark-error: benchmark exit 1, 0/10 proofs: Error:")


def test_fleet_reconcile_refuses_bad_input_without_a_traceback(origin: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "controller.db"
    base = ["reconcile", "--repo", str(origin), "--workdir", str(tmp_path / "w"), "--once"]
    assert main([*base, "--controller-db", str(db)]) == 1
    assert "no controller store there" in capsys.readouterr().err
    _seed_store(db)
    assert main([*base, "--controller-db", str(db), "--image-digest", "latest"]) == 2
    assert "sha256:<64 hex>" in capsys.readouterr().err


def test_fleet_reconcile_listen_serves_the_controller_api_on_the_same_store(
        origin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_CONTROLLER_SECRET", "s" * 40)
    monkeypatch.delenv("FLEET_ADMIN_TOKEN", raising=False)
    db = tmp_path / "new.db"
    argv = ["reconcile", "--repo", str(origin), "--workdir", str(tmp_path / "w"), "--controller-db", str(db),
            "--once", "--listen", "127.0.0.1:0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "controller listening on http://127.0.0.1:" in out and "nothing new" in out
    monkeypatch.delenv("FLEET_CONTROLLER_SECRET")
    assert main(argv) == 2
    assert "no controller secret" in capsys.readouterr().err
