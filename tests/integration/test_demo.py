"""`fleet demo` end to end: real git origin, controller, worker processes, reconcile passes.

Shorter settings than `make demo` (fewer proofs, faster stand-in clock), same code path. Asserts the
outcome the issue asks for: slow and broken machines recorded bad with evidence in git commits, the good
ones kept, the spec's counts met, no worker process left behind.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from reconciler.cli.demo import DemoError, DemoSettings, check_tools, prepare_workspace, run_demo

pytestmark = pytest.mark.slow


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def _processes_in(workdir: Path) -> list[str]:
    """Live processes whose working directory is inside the demo workspace (the local workers run there)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = str((proc / "cwd").readlink())
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cwd.startswith(str(workdir)) and state != "Z":
            found.append(f"{proc.name} {cwd}")
    return found


def test_demo_converges_and_records_the_bad_machines(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    lines: list[str] = []
    outcome = run_demo(DemoSettings(workdir=workdir, deadline_s=100, time_scale=0.005, proofs=3),
                       echo=lines.append)
    text = "\n".join(lines)

    assert outcome.converged, text
    # The slow 4090 (30/h < 40), the broken-GPU 4090 and the 20/h PRO 4000 are recorded bad...
    assert outcome.bad_machines == ["41001", "41002", "42001"], text
    # ...and the spec's counts are met on good machines.
    assert sorted(outcome.kept) == ["rtx-pro-4000-0", "rtx4090-0", "rtx4090-1"]
    assert set(outcome.kept.values()) <= {"41003", "41004", "41005", "42002"}

    origin = workdir / "origin.git"
    authors = _git(origin, "log", "--format=%an", "main").splitlines()
    assert authors[-1] == "Demo Operator" and set(authors[:-1]) == {"fleet-reconciler"}
    judged = _git(origin, "log", "--format=%(trailers:key=Fleet-Machine,valueonly)", "main").split()
    for machine, verdict in (("41001", "below-min-rate"), ("41002", "benchmark-error"), ("42001", "below-min-rate")):
        assert machine in judged
        record = yaml.safe_load(_git(origin, "show", f"main:fleet-spec/machines/{machine}.yaml"))
        entry = record["benchmarks"][-1]
        assert record["status"] == "bad" and entry["verdict"] == verdict and entry["marks_bad"]
        assert entry["evidence"]["log_tail"], entry  # evidence travels with the verdict
    broken = yaml.safe_load(_git(origin, "show", "main:fleet-spec/machines/41002.yaml"))["benchmarks"][-1]
    assert broken["blame"] == "machine" and "CUDA error 700" in broken["reason"]
    assert broken["evidence"]["exit_code"] == 1

    # The printed report: status, audit trail and `fleet why` of each bad machine.
    assert "=== fleet status ===" in text and "=== fleet why 41002 ===" in text
    assert "below-min-rate 19." in text  # the PRO 4000 at ~20/h vs 29/h
    assert "cleaned up:" in lines[-1]
    page = (workdir / "status.html").read_text()
    assert "41002" in page and "CUDA error 700" in page
    assert _processes_in(workdir) == []


def test_demo_refuses_to_wipe_a_directory_it_did_not_make(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(DemoError, match="not a fleet demo workspace"):
        prepare_workspace(precious)
    assert (precious / "notes.txt").read_text() == "keep me"


def test_missing_worker_tools_are_named_with_the_package_to_install() -> None:
    with pytest.raises(DemoError, match=r"need: coreutils, jq \(apt-get install coreutils jq\)"):
        check_tools(lambda tool: None if tool in ("jq", "b2sum") else f"/usr/bin/{tool}")
    check_tools(lambda tool: f"/usr/bin/{tool}")
