"""`fleet why` reads the records it tells about, not the fleet's: a marketplace machine id has the shape of an
owned host's name too, and `fleet why 40213` must not parse every record file before answering (10,000 of them
made `fleet why` take seconds). `fleet why <host>` reads that host's GPU records only. Against a real git
checkout, through the cli."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import reconciler.adapters.record_files as record_files
import reconciler.cli.why as cli_why
from reconciler.cli import main
from tests.gitrepos import git
from tests.record_support import rated_record, write_record

GPU_1 = "GPU-3b2f0000-0000-4000-8000-000000000001"
GPU_2 = "GPU-3b2f0000-0000-4000-8000-000000000002"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    root.mkdir()
    git(root, "init", "--quiet", "--initial-branch=main")
    spec = root / "fleet-spec"
    for machine_id in ("40213", "40214", "40215", f"gpu-a.{GPU_1}", f"gpu-a.{GPU_2}", f"gpu-b.{GPU_1}"):
        write_record(spec, rated_record(machine_id, 45.0, 20.0, bad=machine_id.endswith("2")))
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "records")
    return root


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the record files parsed, by the cli or by any loader of record_files."""
    names: list[str] = []
    real = record_files.parse_machine_record

    def counting(text: str, file: Path, **kw: Any) -> Any:
        names.append(Path(file).name)
        return real(text, file, **kw)

    monkeypatch.setattr(record_files, "parse_machine_record", counting)
    monkeypatch.setattr(cli_why, "parse_machine_record", counting)
    return names


def test_why_of_a_marketplace_machine_parses_only_its_record(repo: Path, parsed: list[str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["why", "40213", "--repo", str(repo)]) == 0
    assert capsys.readouterr().out.startswith("machine 40213: ok (fleet-spec/machines/40213.yaml)")
    assert parsed == ["40213.yaml"]


def test_why_of_an_owned_host_parses_only_its_gpus(repo: Path, parsed: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["why", "gpu-a", "--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("host gpu-a: 2 GPU(s) on record") and GPU_1 in out and GPU_2 in out
    assert sorted(parsed) == [f"gpu-a.{GPU_1}.yaml", f"gpu-a.{GPU_2}.yaml"]
