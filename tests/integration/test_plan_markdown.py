"""`fleet plan --format markdown` on a recorded history (tests/fixtures/plan-history: spec, machine records,
the slot state a previous apply left): the PR comment is pinned by a golden file. FLEET_UPDATE_GOLDEN=1
rewrites the golden file (review the diff like any other change)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from reconciler.cli import main
from reconciler.render.markdown import PLAN_MARKER

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "plan-history"
GOLDEN = FIXTURE / "plan.md"
DIGEST = "sha256:" + "5e" * 32


def plan(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    argv = ["plan", "--spec", str(FIXTURE / "fleet-spec" / "fleet.yaml"), "--state-dir", str(FIXTURE / "state"),
            "--image-digest", DIGEST, *extra]
    assert main(argv) == 0
    return capsys.readouterr().out


def test_the_markdown_plan_matches_the_golden_file(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(capsys, "--format", "markdown")
    if os.environ.get("FLEET_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(out, encoding="utf-8")
    assert out == GOLDEN.read_text(encoding="utf-8")
    # What the golden file says, in words: the marker pr.yml finds the comment by, the slot diff, and per pool
    # the forecast from history against the SLO and the cap, with the warnings.
    assert out.startswith(PLAN_MARKER + "\n")
    assert "- `replace` **rtx4090-1** machine-bad: machine 41003 is recorded bad" in out
    assert "- `create` **rtx-pro-4000-1** missing: no instance yet" in out
    assert "| **rtx4090** | 145.5 | 120 (3 × 40) | meets SLO |" in out
    assert "| **rtx-pro-4000** | 56 | 58 (2 × 29) | **below SLO** |" in out
    assert "only 1 of 2 slots have a known RTX PRO 4000 machine" in out


def test_json_carries_the_same_forecast(capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(plan(capsys, "--format", "json"))
    forecast = {f["pool"]: f for f in doc["forecast"]}
    # rtx4090: 41001 (median 53.5/h at $0.48) and 41002 (47/h at $0.55) proven, one slot at the 45/h prior;
    # 41003 is bad and 41004 measures below 40/h: neither counts.
    assert forecast["rtx4090"]["expected_proofs_per_hour"] == 53.5 + 47 + 45
    assert forecast["rtx4090"]["expected_usd_per_hour"] == pytest.approx(0.48 + 0.55 + 0.60)
    assert forecast["rtx4090"]["below_min_known"] == 1 and forecast["rtx4090"]["meets_slo"] is True
    # rtx-pro-4000: 42002 is over the $0.45 cap, so only 42001 (31/h) is proven; the 25/h prior misses 29/h.
    assert forecast["rtx-pro-4000"]["expected_proofs_per_hour"] == 31 + 25
    assert forecast["rtx-pro-4000"]["meets_slo"] is False and len(forecast["rtx-pro-4000"]["warnings"]) == 3
    assert plan(capsys, "--json") == json.dumps(doc, indent=2) + "\n"


def test_the_pr_workflow_finds_its_comment_by_the_same_marker() -> None:
    workflow = yaml.safe_load((Path(__file__).resolve().parents[2] / ".github/workflows/pr.yml").read_text())
    steps = {s.get("name"): s for s in workflow["jobs"]["validate-and-plan"]["steps"]}
    assert "--format markdown > fleet-plan.md" in steps["fleet plan"]["run"]
    script = steps["Post or update the plan comment"]["with"]["script"]
    assert f'const marker = "{PLAN_MARKER}";' in script
    assert "updateComment" in script and "createComment" in script  # find-and-update, else create: one comment
    assert workflow["permissions"]["pull-requests"] == "write"
