"""The pass from judging to commit on a fake fleet tree (tests/fakes.py FakeFleetTree): the steps in order, one
summary, what lands in the commit and in the store, and the pass's refusals. The same pass against real git
is tests/integration/test_loop.py and its neighbours."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from reconciler.adapters.record_files import parse_machine_record, render_machine_record
from reconciler.domain import errors
from reconciler.domain.leadership import LeaseLost
from reconciler.domain.observations import InstanceReport
from reconciler.domain.records import MachineRecord
from reconciler.flows.judge import (
    FleetTreeView,
    Halted,
    LeaderTerm,
    Loaded,
    Observed,
    PassInputs,
    PassMemory,
    build,
    follow,
    load,
    run_pass,
)
from tests.fakes import FakeFleetTree
from tests.loop_support import FakeFeed, FakeReports
from tests.scenarios import (
    DAEMON_REFUSED_TAIL,
    DIGEST,
    LATER,
    OTHER_DIGEST,
    SPEC_YAML,
    T0,
    bench_events,
    completed_report,
    error_report,
    make_report,
)

M123 = "machines/123.yaml"


def tree(**files: str) -> FakeFleetTree:
    return FakeFleetTree({"fleet-spec/fleet.yaml": SPEC_YAML, "README.md": "fleet\n",
                          **{f"fleet-spec/{k.replace('__', '/')}": v for k, v in files.items()}})


def record(fake: FakeFleetTree, path: str) -> MachineRecord:
    text = fake.file(path)
    assert text is not None, path
    return parse_machine_record(text, Path(path))


class Sink:
    """The DirectiveSink port in memory; `error` is raised instead of storing."""

    def __init__(self, error: Exception | None = None) -> None:
        self.stored: list[dict[str, Mapping[str, Any]]] = []
        self.error = error

    def set_directives(self, directives: Mapping[str, Mapping[str, Any]], now: datetime, *,
                       fence: Callable[[Any], None] | None = None) -> int:
        if fence is not None:
            fence(None)
        if self.error is not None:
            raise self.error
        self.stored.append(dict(directives))
        return len(directives)


def test_one_pass_is_one_commit_of_records_and_trailers_and_a_rerun_writes_nothing() -> None:
    fake = tree()
    source = FakeReports([completed_report("pro-0-a", "123", 20.0), completed_report("pro-1-a", "456", 35.0)])
    sink = Sink()
    result = run_pass(fake, source, LATER, directive_sink=sink)
    assert result.ok and result.pushed and result.attempts == 1
    [commit] = fake.commits
    assert result.commit == commit.sha
    assert commit.request.summary.startswith("fleet: machine 123 below-min-rate: benchmark exit 0, 10/10 proofs")
    assert fake.trailer_values("Fleet-Instance") == {"pro-0-a", "pro-1-a"}
    assert record(fake, M123).status == "bad" and record(fake, "machines/456.yaml").status == "ok"
    assert [v.instance_id for v in result.verdicts] == ["pro-0-a", "pro-1-a"]
    # The directives are computed from the records as this pass left them: the slow machine stops.
    assert {i: d["action"] for i, d in sink.stored[-1].items()} == {"pro-0-a": "stop", "pro-1-a": "serve"}

    again = run_pass(fake, source, LATER + timedelta(minutes=1), directive_sink=sink)
    assert again.ok and again.commit is None and again.verdicts == () and len(fake.commits) == 1
    assert sink.stored[-1] == sink.stored[0]  # recomputed every pass, the same
    assert again.condition().reason == "Succeeded"
    assert [name for name, _ in again.steps] == ["observe", "load", "evidence", "decide", "capacity", "directives",
                                                  "render", "publish"]
    assert all(seconds >= 0 for _, seconds in again.steps) and set(again.to_json()["steps"]) == dict(again.steps).keys()


def test_the_steps_read_the_tree_the_push_goes_to_and_run_again_on_a_newer_tip() -> None:
    """A refused push: someone committed meanwhile (here a human pardons machine 456 by hand); the steps run again
    on the new tip, so the commit that lands is computed over that edit, never rebased blindly over it."""
    fake = tree()
    fake.refuse_pushes = 1
    pardoned = render_machine_record(MachineRecord("456", status="pardoned", note="ticket OPS-12"))
    fake.on_refused = lambda _refused: fake.edit({"fleet-spec/machines/456.yaml": pardoned})
    source = FakeReports([completed_report("pro-0-a", "123", 20.0), error_report("pro-1-a", "456",
                                                                                 DAEMON_REFUSED_TAIL)])
    result = run_pass(fake, source, LATER)
    assert result.pushed and result.attempts == 2 and fake.views == 2
    assert fake.commits[0].request.summary == "human edit"
    kept = record(fake, "machines/456.yaml")
    assert kept.status == "pardoned" and kept.note == "ticket OPS-12"  # the human's edit stands
    assert [b.instance_id for b in kept.benchmarks] == ["pro-1-a"]  # the verdict is recorded on top of it


def test_a_pardon_by_deleting_the_record_holds_until_a_new_failure() -> None:
    fake = tree()
    source = FakeReports([completed_report("pro-0-a", "123", 20.0)])
    assert run_pass(fake, source, LATER).pushed
    fake.edit({"fleet-spec/machines/123.yaml": None}, "pardon 123")
    assert run_pass(fake, source, LATER + timedelta(minutes=5)).commit is None  # its instance stays judged
    assert fake.file(M123) is None
    source.items.append(completed_report("pro-0-b", "123", 21.0))
    result = run_pass(fake, source, LATER + timedelta(minutes=10))
    assert [v.instance_id for v in result.verdicts] == ["pro-0-b"]
    assert [b.instance_id for b in record(fake, M123).benchmarks] == ["pro-0-b"]


def test_an_observation_failure_judges_and_writes_nothing() -> None:
    fake = tree()
    result = run_pass(fake, FakeReports(error=OSError("database is locked")), LATER)
    assert result.observation_error == "OSError: database is locked" and result.reason == errors.OBSERVATION_FAILED
    assert not result.ok and fake.views == 0 and fake.commits == []


def test_a_bad_spec_stalls_the_pass_with_its_reason_and_writes_nothing() -> None:
    fake = tree(**{"fleet.yaml": SPEC_YAML.replace("min_rate_proofs_per_hour: 29", "min_rate_proofs_per_hour: fast")})
    sink = Sink()
    result = run_pass(fake, FakeReports([completed_report("pro-0-a", "123", 20.0)]), LATER, directive_sink=sink)
    assert result.stalled is not None and "min_rate_proofs_per_hour" in result.stalled and "fast" in result.stalled
    assert result.reason == errors.SPEC_INVALID and result.condition().type == errors.STALLED
    assert fake.commits == [] and sink.stored == []


def test_a_term_that_ended_before_the_push_pushes_nothing_and_stores_no_directives() -> None:
    fake = tree()
    sink = Sink()

    def fence() -> None:
        raise LeaseLost("epoch 4 is no longer held by this replica")

    result = run_pass(fake, FakeReports([completed_report("pro-0-a", "123", 20.0)]), LATER, directive_sink=sink,
                      term=LeaderTerm(4, fence))
    assert not result.ok and result.reason == errors.LEASE_LOST and "epoch 4" in (result.error or "")
    assert fake.commits == [] and sink.stored == []


def test_a_term_carries_its_epoch_into_the_commit() -> None:
    fake = tree()
    result = run_pass(fake, FakeReports([completed_report("pro-0-a", "123", 20.0)]), LATER,
                      term=LeaderTerm(7, lambda: None))
    assert result.pushed and fake.trailer_values("Fleet-Leader-Epoch") == {"7"}


def test_directives_that_cannot_be_stored_are_a_note_and_the_records_stand() -> None:
    fake = tree()
    result = run_pass(fake, FakeReports([completed_report("pro-0-a", "123", 20.0)]), LATER,
                      directive_sink=Sink(OSError("disk I/O error")))
    assert result.ok and result.pushed and fake.file(M123) is not None
    assert result.notes == ("directives not stored (workers ask again): OSError: disk I/O error",)


def test_the_desired_digest_reaches_the_judge() -> None:
    fake = tree()
    report = error_report("pro-0-a", "123", DAEMON_REFUSED_TAIL, digest=OTHER_DIGEST)
    result = run_pass(fake, FakeReports([report]), LATER, desired_image_digest=DIGEST)
    [verdict] = result.verdicts
    assert verdict.verdict == "stale-image" and not verdict.marks_bad


def test_the_steps_on_one_tip_give_one_typed_outcome() -> None:
    """`build`, the steps between load and the commit request, as a function of a tree view: what a pass would
    commit, without publishing it (the what-if replay and the bench call it this way)."""
    fake = tree()
    views: list[FleetTreeView] = []
    fake.publish(lambda view: views.append(view) or None)
    observed = Observed.of([completed_report("pro-0-a", "123", 20.0)])
    loaded = load(views[0])
    assert isinstance(loaded, Loaded) and loaded.judged == frozenset() and loaded.spec_dir == "fleet-spec"
    outcome = build(views[0], FakeReports(), observed, PassInputs(leader_epoch=3), LATER)
    assert not isinstance(outcome, Halted) and outcome.request is not None
    assert [c.path for c in outcome.request.changes] == ["fleet-spec/machines/123.yaml"]
    assert ("Fleet-Leader-Epoch", "3") in outcome.request.trailers
    assert outcome.directives.docs["pro-0-a"]["action"] == "stop" and fake.commits == []


# --- honest results: a pass that lost its term says so --------------------------------------------------------


class Term:
    """A leadership term that ends after `valid` checks (the lease lapsed while the pass ran)."""

    def __init__(self, valid: int) -> None:
        self.valid = valid
        self.checks = 0

    def fence(self) -> None:
        self.checks += 1
        if self.checks > self.valid:
            raise LeaseLost("lease epoch 2 is no longer held by r1; r2 holds epoch 3; not writing")

    def term(self) -> LeaderTerm:
        return LeaderTerm(2, self.fence, lambda _conn: self.fence())


def test_a_refused_push_with_nothing_left_after_the_term_ended_is_not_leader_never_succeeded() -> None:
    """The stale leader of issue 33: its lease check passed, then it stalled; the new leader pushed the same
    verdicts; git refused the stale push and the retry, recomputed on the new tip, had nothing left to write."""
    fake = tree()
    fake.refuse_pushes = 1
    fake.on_refused = fake.commit  # the new leader's commit of the very same records
    sink = Sink()
    term = Term(valid=1)
    result = run_pass(fake, FakeReports([completed_report("pro-0-a", "123", 20.0)]), LATER, directive_sink=sink,
                      term=term.term())
    assert result.commit is None and not result.pushed and result.attempts == 2 and len(fake.commits) == 1
    assert not result.ok and result.reason == errors.LEASE_LOST
    assert result.error == ("not-leader: push refused; nothing left to publish: lease epoch 2 is no longer held by r1; "
                            "r2 holds epoch 3; not writing")
    condition = result.condition()
    assert (condition.type, condition.reason) == (errors.RECONCILING, errors.LEASE_LOST) and sink.stored == []
    assert result.headline().startswith("not-leader: push refused; nothing left to publish")
    assert result.to_json()["condition"]["reason"] == "LeaseLost"


def test_a_push_refused_by_a_humans_commit_while_leading_succeeds() -> None:
    fake = tree()
    fake.refuse_pushes = 1
    fake.on_refused = lambda request: fake.commit(replace(request, summary="human: the same records, by hand",
                                                          trailers=()))
    term = Term(valid=10)
    result = run_pass(fake, FakeReports([completed_report("pro-0-a", "123", 20.0)]), LATER, directive_sink=Sink(),
                      term=term.term())
    assert result.ok and result.commit is None and result.attempts == 2 and term.checks == 3
    assert result.condition().reason == "Succeeded"


def test_a_term_that_ended_after_the_push_reports_the_push_and_not_leader() -> None:
    fake = tree()
    sink = Sink()
    result = run_pass(fake, FakeReports([completed_report("pro-0-a", "123", 20.0)]), LATER, directive_sink=sink,
                      term=Term(valid=1).term())
    assert result.pushed and result.commit == fake.commits[-1].sha and [v.instance_id for v in result.verdicts] == [
        "pro-0-a"]
    assert not result.ok and result.reason == errors.LEASE_LOST and sink.stored == []
    assert (result.error or "").startswith(f"not-leader: commit {result.commit[:12]} pushed; directives not stored: ")


# --- the warm pass: a memory between passes ------------------------------------------------------------------


def test_a_warm_pass_reads_what_changed_and_decides_what_a_full_pass_decides() -> None:
    """The same history twice, one loop with a memory and a change feed, one without: the same results pass by pass;
    the warm loop reads every report once, then only the changed ones, and stores only the directives that differ."""
    # Never finishes: judged at its deadline, benchmark start (T0 + 100 min) + 120 min, with no new report.
    running = make_report("pro-3-a", "789", events=bench_events(bench_start=100.0))
    history: list[tuple[timedelta, list[InstanceReport]]] = [
        (timedelta(0), [completed_report("pro-0-a", "123", 20.0), completed_report("pro-1-a", "456", 35.0),
                        running]),
        (timedelta(minutes=1), []),
        (timedelta(minutes=2), [error_report("pro-2-a", "456", DAEMON_REFUSED_TAIL)]),
        (timedelta(minutes=3), []),
        (timedelta(hours=2), []),  # past the running benchmark's deadline: a timeout, with no new report
        (timedelta(hours=2, minutes=1), []),
    ]
    cold_tree, warm_tree = tree(), tree()
    cold_source, warm_source = FakeReports(), FakeFeed()
    cold_sink, warm_sink = Sink(), Sink()
    memory = PassMemory()
    for offset, new in history:
        cold_source.items = [*[r for r in cold_source.items if r.instance_id not in {n.instance_id for n in new}],
                             *new]
        for report in new:
            warm_source.put(report)
        now = T0 + timedelta(hours=3) + offset
        cold = run_pass(cold_tree, cold_source, now, directive_sink=cold_sink)
        warm = run_pass(warm_tree, warm_source, now, directive_sink=warm_sink, memory=memory)
        assert warm == replace(cold, commit=warm.commit, publish_seconds=warm.publish_seconds, steps=warm.steps), offset
        assert [c.request for c in warm_tree.commits] == [c.request for c in cold_tree.commits]
    assert fake_verdicts(warm_tree) == ["below-min-rate", "ok", "benchmark-error", "timeout"]
    assert warm_source.calls == 1  # one bulk read, then the changes only
    assert warm_source.asked == [("pro-2-a",)]
    # Directives: every one the first time, then only those that changed (the full loop writes all, every pass).
    assert [sorted(d) for d in warm_sink.stored] == [["pro-0-a", "pro-1-a", "pro-3-a"], ["pro-2-a"], ["pro-3-a"]]
    assert all(len(d) in (3, 4) for d in cold_sink.stored)


def fake_verdicts(fake: FakeFleetTree) -> list[str]:
    return [v for c in fake.commits for k, v in c.request.trailers if k == "Fleet-Verdict"]


def test_a_warm_pass_that_failed_keeps_the_memory_it_had() -> None:
    """A pass whose push failed published nothing: the next one must judge the same instances again."""
    fake = tree()
    source = FakeFeed([completed_report("pro-0-a", "123", 20.0)])
    memory = PassMemory()
    assert run_pass(fake, source, LATER, memory=memory).pushed
    source.put(completed_report("pro-1-a", "456", 35.0))
    fake.refuse_pushes = 5
    failed = run_pass(fake, source, LATER + timedelta(minutes=1), memory=memory)
    assert not failed.ok and failed.reason == errors.GIT_PUSH_REJECTED
    again = run_pass(fake, source, LATER + timedelta(minutes=2), memory=memory)
    assert again.pushed and [v.instance_id for v in again.verdicts] == ["pro-1-a"]


def test_a_follower_keeps_its_memory_of_the_store_and_takes_over_warm() -> None:
    """A standby replica's passes (flows `follow`) read the store's changes into its memory and the tree's records,
    judging and writing nothing; once it leads, its first pass reads only what changed since it last followed,
    judges every instance (what the last leader decided is not its to remember) and stores every directive."""
    fake = tree()
    source = FakeFeed([completed_report("pro-0-a", "123", 20.0)])
    memory = PassMemory()
    views = fake.views
    assert follow(fake, source, memory) == ()
    assert source.calls == 1 and set(memory.reports) == {"pro-0-a"} and fake.views == views + 1
    assert fake.commits == [] and memory.judge is None
    source.put(completed_report("pro-1-a", "456", 35.0))
    assert follow(fake, source, memory) == () and source.asked == [("pro-1-a",)]
    source.put(error_report("pro-2-a", "456", DAEMON_REFUSED_TAIL))
    sink = Sink()
    result = run_pass(fake, source, LATER, directive_sink=sink, memory=memory, term=LeaderTerm(5, lambda: None))
    assert source.calls == 1 and source.asked == [("pro-1-a",), ("pro-2-a",)]  # no second bulk read
    assert sorted(v.instance_id for v in result.verdicts) == ["pro-0-a", "pro-1-a", "pro-2-a"]
    assert sorted(sink.stored[-1]) == ["pro-0-a", "pro-1-a", "pro-2-a"]


def test_a_follower_that_cannot_read_the_store_says_so_and_keeps_following_the_branch() -> None:
    fake = tree()
    notes = follow(fake, FakeFeed.failing(OSError("database is locked")), PassMemory())
    assert notes == ("store not followed: OSError: database is locked",) and fake.views == 1
