"""GitReader (plain `git log --grep` + `git cat-file --batch`) tells the same audit trail as GitStore's
gitpython reads: the same verdict commits newest first with the record text at each (read on demand), the same
last change (a human's edit or deletion) and the same current record, for machines judged once, several times,
pardoned by an edit, deleted, and never seen; its history shape says when a commit-graph would help."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.adapters.git import CommitRequest, FileChange, GitReader, GitStore, GitStoreError
from reconciler.adapters.record_files import render_machine_record
from reconciler.domain.records import BenchmarkEntry, MachineRecord
from tests.gitrepos import clone, git, human_commit, make_origin


def _entry(instance: str, bad: bool) -> BenchmarkEntry:
    return BenchmarkEntry(instance_id=instance, at="2026-12-02T10:00:00Z",
                          verdict="below-min-rate" if bad else "ok", blame="machine" if bad else "none",
                          marks_bad=bad, reason="r", proofs_per_hour=20.0 if bad else 50.0,
                          evidence={"log_tail": ["x — y"], "exit_code": 0})


@pytest.fixture
def human(tmp_path: Path) -> Path:
    bare, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": "version: 1\n"})
    store = GitStore.clone(str(bare), tmp_path / "bot", sleep=lambda s: None, rng=random.Random(1))
    records: dict[str, MachineRecord] = {}
    plan = [("1", True), ("2", False), ("1", False), ("3", True), ("1", True), ("2", True)]
    for n, (mid, bad) in enumerate(plan):
        rec = records.get(mid, MachineRecord(mid)).with_entry(_entry(f"i-{n}", bad), host_id="7", gpu_name="RTX 4090")
        records[mid] = rec
        others = [m for m in records if m != mid][:1]  # a second machine in the same commit now and then
        changes = [FileChange(f"fleet-spec/machines/{mid}.yaml", render_machine_record(rec))]
        trailers = [("Fleet-Machine", mid), ("Fleet-Instance", f"i-{n}")]
        if n == 4 and others:  # a pass judging two machines: both records change, both are named
            other = records[others[0]].with_entry(_entry(f"i-{n}b", False), host_id="7", gpu_name="RTX 4090")
            records[others[0]] = other
            changes.append(FileChange(f"fleet-spec/machines/{others[0]}.yaml", render_machine_record(other)))
            trailers.append(("Fleet-Machine", others[0]))
        request = CommitRequest(f"verdict {n}", "", tuple(trailers), tuple(changes))
        assert store.publish(lambda wd, request=request: request).commit is not None
    human = clone(bare, tmp_path / "human")
    path = human / "fleet-spec/machines/3.yaml"
    human_commit(human, {"fleet-spec/machines/3.yaml": path.read_text().replace("status: bad", "status: pardoned")},
                 "pardon 3")
    human_commit(human, {"fleet-spec/machines/2.yaml": None}, "pardon 2 by deletion")
    return human


@pytest.mark.parametrize("machine_id", ["1", "2", "3", "9"])
def test_git_reader_tells_what_gitstore_tells(human: Path, machine_id: str) -> None:
    record_path = f"fleet-spec/machines/{machine_id}.yaml"
    trail = GitReader.discover(human / "fleet-spec").machine_trail(machine_id)
    with GitStore(human) as store:
        expected = store.history_for_machine(machine_id)
        assert [replace(v, record_text=None) for v in expected] == list(trail.verdicts)
        texts = GitReader(human).records_at([v.sha for v in trail.verdicts], record_path)
        assert [texts[v.sha] for v in trail.verdicts] == [v.record_text for v in expected]
        assert trail.last_change == store.last_change(record_path)
        assert trail.current_text == store.file_at("HEAD", record_path)
    assert trail.workdir == human


def test_a_machine_id_that_prefixes_another_is_not_matched(human: Path) -> None:
    # --grep "Fleet-Machine: 1" also finds "Fleet-Machine: 10"; the parsed trailers decide.
    human_commit(human, {"fleet-spec/machines/10.yaml": "machine_id: '10'\nstatus: ok\nbenchmarks: []\n"},
                 "verdict 10\n\nFleet-Machine: 10\nFleet-Instance: i-10")
    assert all("10" not in v.trailers["Fleet-Machine"] for v in GitReader(human).machine_trail("1").verdicts)


def test_history_shape_sees_the_commit_graph_and_its_bloom_filters(human: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import reconciler.adapters.git as git_adapter

    monkeypatch.setattr(git_adapter, "LONG_HISTORY_COMMITS", 5)  # the fixture's 9 commits count as long
    shape = GitReader(human).history_shape()
    assert (shape.graph, shape.bloom, shape.long) == (False, False, True)
    assert shape.hint() is not None and git_adapter.COMMIT_GRAPH_COMMAND in shape.hint()
    git(human, "commit-graph", "write", "--reachable")
    shape = GitReader(human).history_shape()
    assert (shape.graph, shape.bloom) == (True, False) and "without changed-path filters" in (shape.hint() or "")
    git(human, *git_adapter.COMMIT_GRAPH_COMMAND.split()[1:])
    shape = GitReader(human).history_shape()
    assert (shape.graph, shape.bloom, shape.hint()) == (True, True, None)
    monkeypatch.setattr(git_adapter, "LONG_HISTORY_COMMITS", 50)
    git(human, "commit-graph", "write", "--reachable")  # a graph without filters, but a short history
    assert GitReader(human).history_shape().hint() is None


def test_the_bot_clone_keeps_a_commit_graph_with_bloom_filters(tmp_path: Path) -> None:
    bare, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": "version: 1\n"})
    store = GitStore.clone(str(bare), tmp_path / "bot", sleep=lambda s: None, rng=random.Random(1))
    assert GitReader(tmp_path / "bot").history_shape().bloom
    request = CommitRequest("verdict", "", (("Fleet-Machine", "5"),),
                            (FileChange("fleet-spec/machines/5.yaml", "machine_id: '5'\nbenchmarks: []\n"),))
    sha = store.publish(lambda wd: request).commit
    assert sha is not None
    # The new commit is in the graph (a layer of its own): `git commit-graph verify` checks every layer.
    git(tmp_path / "bot", "commit-graph", "verify")
    chain = (tmp_path / "bot/.git/objects/info/commit-graphs/commit-graph-chain").read_text().split()
    assert len(chain) >= 1 and GitReader(tmp_path / "bot").history_shape().bloom


def test_only_the_commits_touching_the_record_are_read(human: Path) -> None:
    trail = GitReader(human).machine_trail("3")
    assert [c.summary for c in trail.verdicts] == ["verdict 3"]
    assert trail.last_change is not None and trail.last_change.summary == "pardon 3"
    assert trail.current_text is not None and "status: pardoned" in trail.current_text
    assert len(git(human, "rev-list", "HEAD").split()) == 9


def test_outside_a_checkout_and_bad_refs_are_clear_errors(tmp_path: Path, human: Path) -> None:
    with pytest.raises(GitStoreError, match="not inside a git checkout"):
        GitReader.discover(tmp_path)
    with pytest.raises(GitStoreError, match="not a revision"):
        GitReader(human).machine_trail("1", ref="--all")
    with pytest.raises(GitStoreError, match="git log failed"):
        GitReader(human).machine_trail("1", ref="no-such-branch")
