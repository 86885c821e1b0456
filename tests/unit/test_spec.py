"""`fleet validate` on malformed specs: one clear line per problem (file:line, JSON path, value, expectation)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler import REPO_ROOT
from reconciler.adapters.spec_files import check_spec_text, load_spec
from reconciler.cli import main

# Line numbers below refer to this text.
BASE = """\
version: 1
image:
  repository: ghcr.io/acme/cuzk-worker
controller:
  url: https://fleet.example.com
pools:
  - name: rtx4090
    gpu_name: RTX 4090
    count: 2
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.6
    benchmark:
      proofs: 10
      concurrency: 2
"""


def edit(replace: dict[int, str | None] | None = None, append: str = "") -> str:
    """BASE with 1-based lines replaced (None deletes) and text appended."""
    lines: list[str | None] = list(BASE.splitlines())
    for number, text in (replace or {}).items():
        lines[number - 1] = text
    return "\n".join(line for line in lines if line is not None) + "\n" + append


@dataclass(frozen=True)
class Expected:
    line: int
    path: str
    contains: tuple[str, ...]

    def matches(self, file: str, output_line: str) -> bool:
        return (output_line.startswith(f"{file}:{self.line}: error: {self.path}: ")
                and all(part in output_line for part in self.contains))


SECOND_POOL = """\
  - name: rtx4090
    gpu_name: RTX 5090
    count: 1
    min_rate_proofs_per_hour: 60
    max_price_usd_per_hour: 0.9
"""

CASES = {
    "yaml-syntax": (edit({9: "    count: [2"}), [Expected(10, "$", ("not valid YAML",))]),
    "tab-indent": (edit({9: "\tcount: 2"}), [Expected(9, "$", ("not valid YAML",))]),
    "empty-file": ("", [Expected(1, "$", ("expected a mapping", "got empty"))]),
    "top-level-list": ("- name: a\n- name: b\n", [Expected(1, "$", ("expected a mapping", "got list"))]),
    "missing-required": (edit({11: None}),
                         [Expected(7, "$.pools[0]", ("missing required field(s): max_price_usd_per_hour",))]),
    "wrong-type": (edit({9: "    count: two"}),
                   [Expected(9, "$.pools[0].count", ('got "two"', "expected a value of type integer"))]),
    "float-count": (edit({9: "    count: 2.0"}),
                    [Expected(9, "$.pools[0].count", ("got 2.0", "type integer"))]),
    "unknown-field": (edit({11: "    max_price_usd_per_hour: 0.6\n    colour: red"}),
                      [Expected(12, "$.pools[0].colour", ("unknown field(s) colour", "allowed: benchmark"))]),
    "negative-count": (edit({9: "    count: -1"}),
                       [Expected(9, "$.pools[0].count", ("got -1", "expected a number >= 0"))]),
    "min-rate-zero": (edit({10: "    min_rate_proofs_per_hour: 0"}),
                      [Expected(10, "$.pools[0].min_rate_proofs_per_hour", ("got 0", "expected a rate > 0"))]),
    "min-rate-nan": (edit({10: "    min_rate_proofs_per_hour: .nan"}),
                     [Expected(10, "$.pools[0].min_rate_proofs_per_hour", ("got nan", "finite number"))]),
    "duplicate-pool-names": (edit(append=SECOND_POOL),
                             [Expected(15, "$.pools[1].name", ("duplicate pool name 'rtx4090'", "$.pools[0]"))]),
    "duplicate-key": (edit({9: "    count: 2\n    count: 20"}),
                      [Expected(10, "$.pools[0].count", ("duplicate key 'count'", "first at line 9"))]),
    "bad-enum": (edit({14: "      concurrency: 2\n      proof_type: snarky"}),
                 [Expected(15, "$.pools[0].benchmark.proof_type",
                           ('got "snarky"', "expected one of porep, snap, winning, window"))]),
    "price-zero": (edit({11: "    max_price_usd_per_hour: 0"}),
                   [Expected(11, "$.pools[0].max_price_usd_per_hour", ("got 0", "expected a number > 0"))]),
    "bad-url": (edit({5: "  url: ftp://fleet.example.com"}),
                [Expected(5, "$.controller.url", ('got "ftp://fleet.example.com"', "expected text matching"))]),
    "concurrency-above-proofs": (edit({14: "      concurrency: 12"}),
                                 [Expected(14, "$.pools[0].benchmark.concurrency",
                                           ("got 12", "expected at most benchmark.proofs (10)"))]),
    "wrong-version": (edit({1: "version: 2"}), [Expected(1, "$.version", ("got 2", "expected 1"))]),
    "no-pools": (edit({7: None, 8: None, 9: None, 10: None, 11: None, 12: None, 13: None, 14: None,
                       6: "pools: []"}),
                 [Expected(6, "$.pools", ("got []", "at least 1 item"))]),
    "several-at-once": (
        edit({5: "  url: not-a-url", 9: "    count: -3", 11: "    max_price_usd_per_hour: 0\n    zone: eu",
              13: "      proofs: 1"}),
        [Expected(5, "$.controller.url", ('"not-a-url"',)),
         Expected(12, "$.pools[0].zone", ("unknown field(s) zone",)),
         Expected(9, "$.pools[0].count", ("got -3",)),
         Expected(11, "$.pools[0].max_price_usd_per_hour", ("got 0",)),
         Expected(15, "$.pools[0].benchmark.concurrency", ("at most benchmark.proofs (1)",))]),
}


def run_validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["validate", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_spec_gets_one_clear_line_per_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        case: str) -> None:
    text, expected = CASES[case]
    path = tmp_path / "fleet.yaml"
    path.write_text(text)

    code, out, err = run_validate(capsys, str(path))

    assert code == 1
    error_lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(error_lines) == len(expected), err
    for exp in expected:
        assert any(exp.matches(str(path), line) for line in error_lines), f"{exp} not in:\n{err}"
    assert err.splitlines()[-1] == f"{path}: {len(expected)} error(s)"
    assert "Traceback" not in err and out == ""


def test_unknown_gpu_is_a_warning_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(edit({8: "    gpu_name: RTX 9999"}))

    code, out, err = run_validate(capsys, str(path))

    assert code == 0 and err == ""
    warning, summary = out.splitlines()
    assert warning.startswith(f"{path}:8: warning: $.pools[0].gpu_name: GPU model 'RTX 9999' is not known")
    assert "RTX 4090" in warning and "gpu_priors" in warning
    assert summary == f"{path}: ok: 1 pool(s), 2 slot(s), 1 warning(s)"


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_validate(capsys, str(tmp_path / "nope.yaml"))
    assert code == 1
    assert err.splitlines()[0] == f"{tmp_path / 'nope.yaml'}: error: $: file not found"


def test_json_output_lists_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(CASES["several-at-once"][0])
    code, out, _ = run_validate(capsys, "--json", str(path))
    report = json.loads(out)
    assert code == 1 and report["valid"] is False
    assert sorted((p["line"], p["path"]) for p in report["problems"]) == [
        (5, "$.controller.url"), (9, "$.pools[0].count"), (11, "$.pools[0].max_price_usd_per_hour"),
        (12, "$.pools[0].zone"), (15, "$.pools[0].benchmark.concurrency")]


def test_example_fleet_spec_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    example = REPO_ROOT / "fleet-spec" / "fleet.yaml"
    code, out, err = run_validate(capsys, str(example))
    assert (code, err) == (0, "")
    assert out.strip() == f"{example}: ok: 2 pool(s), 10 slot(s)"
    spec = load_spec(example)
    assert [p.name for p in spec.pools] == ["rtx4090", "rtx-pro-4000"]


def _fleet_cmd() -> list[str]:
    script = Path(sys.executable).parent / "fleet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "reconciler.cli"]


@pytest.mark.parametrize("case", ["yaml-syntax", "several-at-once", "top-level-list"])
def test_installed_command_exits_1_without_traceback(tmp_path: Path, case: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(CASES[case][0])
    proc = subprocess.run([*_fleet_cmd(), "validate", str(path)], capture_output=True, text=True, check=False,
                          timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count(": error: ") == len(CASES[case][1])


def test_a_document_whose_keys_json_cannot_hold_is_a_problem_not_a_crash() -> None:
    # Found by the fuzz test: YAML reads `2026-12-02:` as a date key, and the error text used json.dumps.
    spec, problems = check_spec_text("2026-12-02: ", "fleet.yaml")
    assert spec is None and problems and all(p.severity == "error" for p in problems)
    assert any("missing required field(s): version, image, controller, pools" in p.message for p in problems)
