"""GitReader (plain `git log` + `git cat-file --batch`) tells the same audit trail as GitStore's gitpython
reads: the same verdict commits newest first with the record text at each, the same last change (a human's
edit or deletion) and the same current record, for machines judged once, several times, pardoned by an edit,
deleted, and never seen; and it reads only the commits that touched the machine's record."""

from __future__ import annotations

import random
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
        assert list(trail.verdicts) == store.history_for_machine(machine_id)
        assert trail.last_change == store.last_change(record_path)
        assert trail.current_text == store.file_at("HEAD", record_path)
    assert trail.workdir == human


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
