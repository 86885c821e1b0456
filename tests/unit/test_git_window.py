"""GitReader.window / start_window on a real repository: the first-parent commits that change the given paths, with
the changes under them only (git is given no pathspec; the paths are picked from its names)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.adapters.git import GitReader, GitStoreError
from tests.gitrepos import git, write_files

PATHS = ["fleet-spec/fleet.yaml", "fleet-spec/machines", "fleet-spec/images"]


T0 = 1_790_000_000  # 2026


def _commit(repo: Path, when: int, message: str, files: dict[str, str | None]) -> str:
    write_files(repo, files)
    git(repo, "add", "-A")
    os.environ["GIT_COMMITTER_DATE"] = os.environ["GIT_AUTHOR_DATE"] = f"@{T0 + when} +0000"
    try:
        git(repo, "commit", "--quiet", "--allow-empty", "-m", message)
    finally:
        del os.environ["GIT_COMMITTER_DATE"], os.environ["GIT_AUTHOR_DATE"]
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "--quiet", "-b", "main")
    return tmp_path


def test_the_window_lists_the_commits_that_change_the_paths_with_only_those_changes(repo: Path) -> None:
    _commit(repo, 1_000, "before the window", {"fleet-spec/fleet.yaml": "v0\n", "fleet-spec/machines/a.yaml": "a\n"})
    first = _commit(repo, 2_000, "a record and a demand file",
                    {"fleet-spec/machines/b.yaml": "b\n", "fleet-spec/demand/p/2026-12-01.csv": "x\n"})
    _commit(repo, 3_000, "demand only", {"fleet-spec/demand/p/2026-12-02.csv": "y\n"})
    _commit(repo, 3_500, "a look-alike directory", {"fleet-spec/machines-old/c.yaml": "c\n",
                                                    "fleet-spec/fleet.yaml.bak": "x\n"})
    spec = _commit(repo, 4_000, "the spec and a pardon", {"fleet-spec/fleet.yaml": "v1\n",
                                                          "fleet-spec/machines/a.yaml": None})
    _commit(repo, 5_000, "nothing", {})
    reader = GitReader.discover(repo)
    head = reader.resolve("HEAD")
    listed = reader.window(head, T0 + 1_500, PATHS)
    assert [(c.sha, c.at, c.changes) for c in listed] == [
        (first, T0 + 2_000, (("A", "fleet-spec/machines/b.yaml"),)),
        (spec, T0 + 4_000, (("M", "fleet-spec/fleet.yaml"), ("D", "fleet-spec/machines/a.yaml")))]
    assert listed[1].parent == git(repo, "rev-parse", f"{spec}^").strip()  # the commit's own first parent
    assert listed[0].author == "Ada Operator"
    assert reader.window(head, T0 + 4_500, PATHS) == []


def test_a_window_of_a_ref_git_does_not_know_says_what_git_said(repo: Path) -> None:
    _commit(repo, 1_000, "one", {"fleet-spec/fleet.yaml": "v0\n"})
    with pytest.raises(GitStoreError, match=r"git log failed in .*(unknown revision|bad revision)"):
        GitReader.discover(repo).window("no-such-branch", 0, PATHS)
    with pytest.raises(GitStoreError, match="not a revision"):
        GitReader.discover(repo).window("--all", 0, PATHS)


def test_a_window_left_unread_is_stopped_and_a_read_one_cannot_be_read_twice(repo: Path) -> None:
    _commit(repo, 1_000, "one", {"fleet-spec/fleet.yaml": "v0\n"})
    reader = GitReader.discover(repo)
    with reader.start_window("HEAD", T0, PATHS) as listing:
        pass  # closed unread: git is stopped and reaped
    assert listing._proc is None
    with reader.start_window("HEAD", T0, PATHS) as listing:
        assert len(listing.result()) == 1
        with pytest.raises(GitStoreError, match="already read"):
            listing.result()
