"""GitStore against real git repos: bare origin + bot clone + human clone, no real sleeps."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.adapters.git import (
    BOT_EMAIL,
    BOT_NAME,
    CommitRequest,
    FileChange,
    GitStore,
    GitStoreError,
    PushRejected,
)
from tests.fakes import Sleeps
from tests.gitrepos import (
    clone,
    git,
    human_commit,
    install_rejecting_hook,
    make_origin,
    origin_file,
    origin_log,
    write_files,
)

SPEC = "fleet-spec/fleet.yaml"
M111 = "fleet-spec/machines/111.yaml"
M222 = "fleet-spec/machines/222.yaml"




@pytest.fixture
def repos(tmp_path: Path) -> tuple[Path, Path, Path]:
    bare, _seed = make_origin(tmp_path, {SPEC: "version: 1\npools: []\n", M111: "machine_id: '111'\nstatus: bad\n"})
    bot = tmp_path / "bot"
    human = clone(bare, tmp_path / "human")
    return bare, bot, human


def _store(bare: Path, bot: Path, sleeps: Sleeps | None = None, **kw: object) -> GitStore:
    return GitStore.clone(str(bare), bot, sleep=sleeps or Sleeps(), rng=random.Random(7), **kw)


def _verdict(machine: str, instance: str, text: str) -> CommitRequest:
    return CommitRequest(
        summary=f"verdict: machine {machine} below-min-rate",
        body=f"instance {instance} proved 20.0 proofs/h, pool minimum 40.0",
        trailers=(("Fleet-Machine", machine), ("Fleet-Verdict", "below-min-rate"),
                  ("Fleet-Image", "sha256:" + "a" * 64), ("Fleet-Instance", instance)),
        changes=(FileChange(f"fleet-spec/machines/{machine}.yaml", text),),
    )


def test_commit_has_bot_identity_message_and_queryable_trailers(repos: tuple[Path, Path, Path]) -> None:
    bare, bot, _ = repos
    store = _store(bare, bot)
    first = store.publish(lambda wd: _verdict("222", "rtx4090-0-aaa", "machine_id: '222'\nstatus: bad\n"))
    second = store.publish(lambda wd: _verdict("333", "rtx4090-1-bbb", "machine_id: '333'\nstatus: bad\n"))

    assert first.pushed and first.attempts == 1 and first.commit
    assert second.pushed and second.commit != first.commit
    assert origin_log(bare, "%H", "main")[0] == second.commit
    assert origin_log(bare, "%an <%ae>|%cn <%ce>")[0] == f"{BOT_NAME} <{BOT_EMAIL}>|{BOT_NAME} <{BOT_EMAIL}>"
    assert git(bare, "log", "-1", "--format=%B", first.commit) == (
        "verdict: machine 222 below-min-rate\n\ninstance rtx4090-0-aaa proved 20.0 proofs/h, pool minimum 40.0\n\n"
        f"Fleet-Machine: 222\nFleet-Verdict: below-min-rate\nFleet-Image: sha256:{'a' * 64}\n"
        "Fleet-Instance: rtx4090-0-aaa\n\n")
    assert store.trailer_values("Fleet-Instance") == {"rtx4090-0-aaa", "rtx4090-1-bbb"}
    assert store.trailer_values("Fleet-Machine") == {"222", "333"}
    assert origin_file(bare, "fleet-spec/machines/333.yaml") == "machine_id: '333'\nstatus: bad\n"


def test_same_change_twice_makes_no_empty_commit(repos: tuple[Path, Path, Path]) -> None:
    bare, bot, _ = repos
    store = _store(bare, bot)
    request = _verdict("222", "i-1", "machine_id: '222'\nstatus: bad\n")
    assert store.publish(lambda wd: request).commit is not None
    commits_before = origin_log(bare, "%H")

    again = store.publish(lambda wd: request)
    nothing = store.publish(lambda wd: None)
    delete_absent = store.publish(lambda wd: CommitRequest("drop", "", (), (FileChange(M222 + ".x", None),)))

    assert (again.commit, again.pushed) == (None, False)
    assert (nothing.commit, nothing.pushed) == (None, False)
    assert delete_absent.commit is None
    assert origin_log(bare, "%H") == commits_before


def test_concurrent_human_commit_rejects_push_then_bot_rebuilds_on_fresh_tip(
        repos: tuple[Path, Path, Path]) -> None:
    bare, bot, human = repos
    sleeps = Sleeps()
    store = _store(bare, bot, sleeps)
    seen_specs: list[str] = []

    def build(workdir: Path) -> CommitRequest:
        seen_specs.append((workdir / SPEC).read_text())
        if len(seen_specs) == 1:  # the human merges a PR between our sync and our push
            human_commit(human, {SPEC: "version: 1\npools: [changed]\n"}, "raise pool count")
        return _verdict("222", "i-1", "machine_id: '222'\nstatus: bad\n")

    result = store.publish(build)

    assert result.pushed and result.attempts == 2
    assert len(sleeps.calls) == 1 and 0.25 <= sleeps.calls[0] <= 0.5
    assert seen_specs == ["version: 1\npools: []\n", "version: 1\npools: [changed]\n"]  # rebuilt on fresh tree
    assert origin_file(bare, SPEC) == "version: 1\npools: [changed]\n"
    assert origin_file(bare, M222) == "machine_id: '222'\nstatus: bad\n"
    assert [line.split("|")[1] for line in origin_log(bare)][:2] == ["verdict: machine 222 below-min-rate",
                                                                     "raise pool count"]


def _recomputing_build(store: GitStore, verdicts: dict[str, str]) -> Callable[[Path], CommitRequest | None]:
    """Like the loop: only instances not yet judged in git produce a change; records come from the tree."""

    def build(workdir: Path) -> CommitRequest | None:
        judged = store.trailer_values("Fleet-Instance")
        changes, trailers = [], []
        for instance, machine in sorted(verdicts.items()):
            if instance in judged:
                continue
            path = workdir / f"fleet-spec/machines/{machine}.yaml"
            old = path.read_text() if path.exists() else f"machine_id: '{machine}'\nstatus: bad\nbenchmarks:\n"
            changes.append(FileChange(f"fleet-spec/machines/{machine}.yaml", old + f"- {instance}\n"))
            trailers += [("Fleet-Machine", machine), ("Fleet-Instance", instance)]
        if not changes:
            return None
        return CommitRequest("verdicts", "", tuple(trailers), tuple(changes))

    return build


def test_pardon_by_deletion_is_kept_by_later_publish(repos: tuple[Path, Path, Path]) -> None:
    bare, bot, human = repos
    store = _store(bare, bot)
    verdicts = {"i-1": "111"}
    assert store.publish(_recomputing_build(store, verdicts)).pushed
    assert origin_file(bare, M111) is not None

    human_commit(human, {M111: None}, "pardon 111: host fixed the PSU")
    verdicts["i-2"] = "222"  # a new failure elsewhere; 111's old verdict is already in the trail
    result = store.publish(_recomputing_build(store, verdicts))

    assert result.pushed
    assert origin_file(bare, M111) is None
    assert origin_file(bare, M222) == "machine_id: '222'\nstatus: bad\nbenchmarks:\n- i-2\n"
    # A NEW failure of the pardoned machine writes a fresh record (history before the pardon stays in git).
    verdicts["i-3"] = "111"
    assert store.publish(_recomputing_build(store, verdicts)).pushed
    assert origin_file(bare, M111) == "machine_id: '111'\nstatus: bad\nbenchmarks:\n- i-3\n"


def test_pardon_landing_during_publish_is_not_overwritten(repos: tuple[Path, Path, Path]) -> None:
    bare, bot, human = repos
    store = _store(bare, bot)
    calls = []

    def build(workdir: Path) -> CommitRequest:
        calls.append((workdir / M111).exists())
        if len(calls) == 1:
            human_commit(human, {M111: None}, "pardon 111")
        return CommitRequest("verdict 222", "", (("Fleet-Machine", "222"),), (FileChange(M222, "bad\n"),))

    assert store.publish(build).attempts == 2
    assert calls == [True, False]
    assert origin_file(bare, M111) is None and origin_file(bare, M222) == "bad\n"


def test_push_rejected_every_time_is_bounded_and_recoverable(repos: tuple[Path, Path, Path]) -> None:
    bare, bot, _ = repos
    sleeps = Sleeps()
    store = _store(bare, bot, sleeps, max_attempts=4, base_delay_s=0.5, max_delay_s=1.5)
    hook = install_rejecting_hook(bare)
    before = origin_log(bare, "%H")
    builds = []

    def build(workdir: Path) -> CommitRequest:
        builds.append(1)
        return _verdict("222", "i-1", "machine_id: '222'\nstatus: bad\n")

    with pytest.raises(PushRejected, match="4 time") as err:
        store.publish(build)

    assert "pre-receive hook declined" in str(err.value)
    assert len(builds) == 4 and len(sleeps.calls) == 3
    caps = [0.5, 1.0, 1.5]  # exponential, capped at max_delay_s
    assert all(cap / 2 <= s <= cap for s, cap in zip(sleeps.calls, caps, strict=True))
    assert origin_log(bare, "%H") == before

    hook.unlink()
    result = store.publish(build)
    assert result.pushed and result.attempts == 1
    log = origin_log(bare, "%an|%s")
    assert len(log) == len(before) + 1  # the rejected local commits were discarded, not stacked
    assert log[0] == f"{BOT_NAME}|verdict: machine 222 below-min-rate"


def test_sync_refuses_to_wipe_human_uncommitted_edits(repos: tuple[Path, Path, Path]) -> None:
    bare, _, human = repos
    write_files(human, {SPEC: "version: 1\npools: [my unsaved work]\n"})
    store = GitStore(human, sleep=Sleeps())

    with pytest.raises(GitStoreError, match=r"uncommitted changes.*fleet-spec/fleet\.yaml"):
        store.sync()
    with pytest.raises(GitStoreError, match="uncommitted"):
        store.publish(lambda wd: _verdict("222", "i", "x\n"))
    assert (human / SPEC).read_text() == "version: 1\npools: [my unsaved work]\n"
    assert origin_file(bare, M222) is None


def test_sync_refuses_to_discard_human_unpushed_commit_but_discards_bot_leftovers(
        repos: tuple[Path, Path, Path]) -> None:
    bare, bot, human = repos
    human_commit(human, {SPEC: "local only\n"}, "my local commit", push=False)
    with pytest.raises(GitStoreError, match="my local commit"):
        GitStore(human, sleep=Sleeps()).sync()
    assert (human / SPEC).read_text() == "local only\n"

    store = _store(bare, bot)
    write_files(bot, {M111: "half-written by a crashed pass\n", "fleet-spec/machines/.999.yaml.tmp": "x"})
    tip = store.sync()
    assert tip == origin_log(bare, "%H")[0] == store.head()
    assert (bot / M111).read_text() == "machine_id: '111'\nstatus: bad\n"
    assert not (bot / "fleet-spec/machines/.999.yaml.tmp").exists()


@pytest.mark.parametrize("path", ["../outside.yaml", "/etc/passwd", "fleet-spec/../../x", ".git/config",
                                  "fleet-spec\\machines\\1.yaml", "", "fleet-spec/machines/"])
def test_file_change_outside_the_repo_is_refused(repos: tuple[Path, Path, Path], path: str) -> None:
    bare, bot, _ = repos
    store = _store(bare, bot)
    before = origin_log(bare, "%H")
    with pytest.raises(GitStoreError, match="not a plain path inside the repository"):
        store.publish(lambda wd: CommitRequest("evil", "", (), (FileChange(path, "pwned\n"),)))
    assert not (bot.parent / "outside.yaml").exists() and not (bot.parent / "x").exists()
    assert origin_log(bare, "%H") == before


def test_history_for_machine_lists_verdict_commits_newest_first_with_record(
        repos: tuple[Path, Path, Path]) -> None:
    bare, bot, human = repos
    store = _store(bare, bot)
    store.publish(lambda wd: _verdict("222", "i-1", "v1\n"))
    human_commit(human, {SPEC: "edited\n"}, "unrelated human commit mentioning Fleet-Machine: 222")
    store.publish(lambda wd: _verdict("2222", "i-9", "other machine\n"))
    store.publish(lambda wd: _verdict("222", "i-2", "v2\n"))

    history = store.history_for_machine("222")

    assert [c.trailers["Fleet-Instance"] for c in history] == [("i-2",), ("i-1",)]
    assert [c.record_text for c in history] == ["v2\n", "v1\n"]
    assert history[0].author == f"{BOT_NAME} <{BOT_EMAIL}>"
    assert history[0].summary == "verdict: machine 222 below-min-rate"
    assert store.history_for_machine("nope") == []


def test_trailer_values_reads_new_commits_and_survives_rewritten_history(repos: tuple[Path, Path, Path]) -> None:
    bare, bot, human = repos
    store = _store(bare, bot)
    seed = origin_log(bare, "%H")[0]
    store.publish(lambda wd: _verdict("222", "i-1", "a\n"))
    assert store.trailer_values("Fleet-Instance") == {"i-1"}
    store.publish(lambda wd: _verdict("222", "i-2", "b\n"))
    assert store.trailer_values("Fleet-Instance") == {"i-1", "i-2"}  # incremental read since the cached tip

    git(human, "push", "--quiet", "--force", "origin", f"{seed}:refs/heads/main")  # an admin rewinds main
    store.sync()
    assert store.trailer_values("Fleet-Instance") == set()
    assert store.trailer_values("Fleet-Instance", ref="HEAD") == set()
    with pytest.raises(GitStoreError, match="does not exist"):
        store.trailer_values("Fleet-Instance", ref="refs/remotes/origin/nope")


def test_symlinked_directory_leading_out_of_the_repo_is_refused(repos: tuple[Path, Path, Path],
                                                                tmp_path: Path) -> None:
    bare, bot, human = repos
    outside = tmp_path / "outside"
    outside.mkdir()
    (human / "fleet-spec" / "images").symlink_to(outside, target_is_directory=True)
    human_commit(human, {}, "images dir is a symlink")
    store = _store(bare, bot)
    with pytest.raises(GitStoreError, match="outside the repository via a symlink"):
        store.publish(lambda wd: CommitRequest("img", "", (), (FileChange("fleet-spec/images/x.yaml", "x\n"),)))
    assert list(outside.iterdir()) == []
