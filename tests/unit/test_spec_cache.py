"""The validated-spec cache (spec_files.load_spec_cached) changes speed, never the answer: an unchanged spec is
not parsed or validated again (a warm read-only command imports neither PyYAML nor jsonschema), and any change
of the spec, of the name it is loaded under or of what validation depends on validates it again. A spec with
problems is never remembered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import REPO_ROOT
from reconciler.adapters import spec_files
from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.record_files import machine_record_path, render_machine_record
from reconciler.domain.records import BenchmarkEntry, MachineRecord
from reconciler.domain.spec import SpecError
from tests.gitrepos import git

SPEC = """version: 1
image: {repository: ghcr.io/example/cuzk-worker}
controller: {url: http://127.0.0.1:8080}
pools:
  - name: rtx4090
    gpu_name: RTX 4090
    count: 2
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.6
"""


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    (root / "fleet-spec").mkdir(parents=True)
    git(root, "init", "--quiet", "--initial-branch=main")
    path = root / "fleet-spec" / "fleet.yaml"
    path.write_text(SPEC, encoding="utf-8")
    return path


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every full load (parse + validate) load_spec_cached falls back to."""
    seen: list[Path] = []
    real = spec_files.load_spec

    def counting(path: str | Path) -> spec_files.FleetSpec:
        seen.append(Path(path))
        return real(path)

    monkeypatch.setattr(spec_files, "load_spec", counting)
    return seen


def test_an_unchanged_spec_is_validated_once_and_loads_as_load_spec_does(spec_path: Path,
                                                                         validations: list[Path]) -> None:
    first = spec_files.load_spec_cached(spec_path)
    again = spec_files.load_spec_cached(spec_path)
    assert first == again == spec_files.load_spec(spec_path)
    assert len(validations) == 2  # the first cached load and the direct one above
    assert spec_files.spec_cache_path(spec_path) == spec_path.parent.parent / ".git" / "fleet" / "spec.pickle"


def test_an_edit_a_broken_spec_and_a_change_of_the_validation_code_are_each_validated_again(
        spec_path: Path, validations: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    spec_files.load_spec_cached(spec_path)
    spec_path.write_text(SPEC.replace("count: 2", "count: 3"), encoding="utf-8")
    assert spec_files.load_spec_cached(spec_path).pools[0].count == 3
    spec_path.write_text(SPEC.replace("count: 2", "count: -1"), encoding="utf-8")
    for _ in range(2):  # refused each time, with the problem named: never remembered
        with pytest.raises(SpecError, match="count"):
            spec_files.load_spec_cached(spec_path)
    spec_path.write_text(SPEC, encoding="utf-8")
    spec_files.load_spec_cached(spec_path)
    before = len(validations)
    monkeypatch.setattr(spec_files, "_validation_inputs", lambda: b"another schema or checker")
    spec_files.load_spec_cached(spec_path)
    assert len(validations) == before + 1


def test_a_corrupt_or_foreign_cache_file_means_validating_again(spec_path: Path, validations: list[Path]) -> None:
    cache = spec_files.spec_cache_path(spec_path)
    for content in (b"not a pickle", b"\x80\x05N.", b""):  # garbage, a pickled None, empty
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(content)
        assert spec_files.load_spec_cached(spec_path) == spec_files.load_spec(spec_path)
    assert spec_files.load_spec_cached(spec_path) == spec_files.load_spec(spec_path)
    assert len(validations) == 3 + 3 + 1  # each corrupt file: a cached load and a direct one; then cached


_PROBE = """
import io, json, sys, contextlib
from reconciler.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
libs = sorted({m.split('.')[0] for m in sys.modules} & {"yaml", "jsonschema"})
print(json.dumps({"code": code, "libs": libs}), file=sys.stderr)
"""


def test_a_warm_status_or_plan_imports_neither_pyyaml_nor_jsonschema(spec_path: Path) -> None:
    entry = BenchmarkEntry("i-1", "2026-12-02T18:00:00Z", "ok", "none", False, "ok 46.4/h", pool="rtx4090",
                           proofs_per_hour=46.4, evidence={"exit_code": 0})
    spec_dir = spec_path.parent
    write_text_atomic(machine_record_path(spec_dir, "40213"),
                      render_machine_record(MachineRecord("40213", status="ok", benchmarks=(entry,))))
    old = (os.stat(spec_path).st_mtime_ns - 10**10) // 10**9  # settled: its stat alone proves its content
    os.utime(machine_record_path(spec_dir, "40213"), (old, old))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for args in (["status", "--spec-dir", "fleet-spec", "--at", "2026-12-03T12:00:00Z"],
                 ["plan", "--spec", "fleet-spec/fleet.yaml"]):
        runs = []
        for _ in range(2):  # the first validates the spec and indexes the records; the second answers warm
            proc = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=spec_dir.parent, env=env,
                                  capture_output=True, text=True, check=False, timeout=120)
            runs.append(json.loads(proc.stderr.strip().splitlines()[-1]))
        assert [r["code"] for r in runs] == [0, 0], runs
        if args[0] == "status":  # the very first run validated (the probe sees the imports when they happen)
            assert runs[0]["libs"] == ["jsonschema", "yaml"]
        assert runs[1]["libs"] == [], f"fleet {args[0]} imported {runs[1]['libs']} on a warm run"
