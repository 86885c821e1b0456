"""`fleet why` on a long history (bench/shapes.py at test size): the newest verdicts by default with how many
more `--all` shows; each verdict's evidence from the current record, and from the record as of its own commit
only where a human removed the entry since; the commit-graph hint on a long history without one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import reconciler.adapters.git as git_adapter
from bench.shapes import write_why_history
from reconciler.adapters.git import GitReader
from reconciler.cli import main
from reconciler.flows.why import FROM_COMMIT, FROM_CURRENT, historical_wanted
from tests.gitrepos import git

VERDICTS = 30


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[str]]:
    repo = tmp_path_factory.mktemp("why") / "fleet"
    machine, entries = write_why_history(repo, commits=300, verdicts=VERDICTS, machines=40)
    # A human removes the entry of the 3rd verdict (and keeps the rest): only that one is read from history.
    path = repo / f"fleet-spec/machines/{machine}.yaml"
    removed = entries[2].instance_id
    path.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                            if f'"instance_id": "{removed}"' not in line))
    git(repo, "commit", "--quiet", "-am", f"drop the entry of {removed}")
    return repo, machine, [e.instance_id for e in entries]


def _why(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["why", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_shows_the_newest_verdicts_and_says_how_many_more(
        history: tuple[Path, str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    repo, machine, instances = history
    code, out, _ = _why(capsys, machine, "--repo", str(repo))
    assert code == 0
    shown = re.findall(r"^  instance (\S+)", out, flags=re.M)
    assert shown == instances[::-1][:20]  # newest first, 20 of them
    assert f"{VERDICTS} verdict commit(s); the newest 20 shown" in out
    assert f"... {VERDICTS - 20} older verdict commit(s) not shown: fleet why {machine} --all" in out
    assert "record last changed in" in out and "drop the entry of" in out  # the human's edit is the last change
    code, out, _ = _why(capsys, machine, "--repo", str(repo), "--newest", "3")
    assert re.findall(r"^  instance (\S+)", out, flags=re.M) == instances[::-1][:3]


def test_all_shows_every_verdict_and_reads_history_only_for_the_removed_entry(
        history: tuple[Path, str, list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    repo, machine, instances = history
    code, out, _ = _why(capsys, machine, "--repo", str(repo), "--all", "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["verdicts_total"], doc["verdicts_shown"]) == (VERDICTS, VERDICTS)
    got = [(v["entries"][0]["instance_id"], v["evidence_from"]) for v in doc["verdicts"]]
    assert got == [(i, FROM_COMMIT if i == instances[2] else FROM_CURRENT) for i in instances[::-1]]
    code, text, _ = _why(capsys, machine, "--repo", str(repo), "--all")
    assert text.count("entry no longer in the current record") == 1 and "not shown" not in text
    trail = GitReader(repo).machine_trail(machine)
    path = f"fleet-spec/machines/{machine}.yaml"
    assert historical_wanted(path, trail.verdicts, trail.current_text, None) == [trail.verdicts[-3].sha]
    assert historical_wanted(path, trail.verdicts, trail.current_text, 20) == []  # not among the newest 20


def test_hint_on_a_long_history_without_a_commit_graph(history: tuple[Path, str, list[str]],
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    repo, machine, _ = history
    monkeypatch.setattr(git_adapter, "LONG_HISTORY_COMMITS", 100)
    _, _, err = _why(capsys, machine, "--repo", str(repo))
    assert "hint:" in err and git_adapter.COMMIT_GRAPH_COMMAND in err
    git(repo, *git_adapter.COMMIT_GRAPH_COMMAND.split()[1:])
    code, _, err = _why(capsys, machine, "--repo", str(repo))
    assert code == 0 and "hint:" not in err
