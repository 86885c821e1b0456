"""The leader records demand samples through the pass (flows.judge.run_pass + flows.demand.DemandRecorder) into
fleet-spec/demand/ on a real git origin: with a commit the pass makes anyway, or on their own once due; never
more often than the resolution, each day file named in a Fleet-Demand trailer."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

from reconciler.adapters.demand_files import day_path, parse_day
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.flows.demand import DemandRecorder
from reconciler.flows.judge import run_pass
from tests.capacity_support import at, serving
from tests.fakes import Sleeps
from tests.gitrepos import git, make_origin, origin_file
from tests.loop_support import FakeReports, trailers
from tests.scenarios import SPEC_YAML, completed_report

FILE = "fleet-spec/" + day_path("rtx-pro-4000", at(0).date())


def _store(tmp_path: Path) -> tuple[Path, GitFleetTree]:
    origin, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    git(tmp_path, "clone", "--quiet", str(origin), str(tmp_path / "bot"))
    return origin, GitFleetTree(GitStore(tmp_path / "bot", sleep=Sleeps(), rng=random.Random(3), max_attempts=2))


def test_samples_ride_with_the_pass_commit_or_go_alone_once_due(tmp_path: Path) -> None:
    origin, store = _store(tmp_path)
    recorder = DemandRecorder(resolution_s=60.0, spacing_s=60.0, flush_s=600.0)  # a sample a minute, changed or not
    worker = serving("pro-0-a", "rtx-pro-4000-0", [True] * 12, pool="rtx-pro-4000")
    source = FakeReports([worker])
    assert run_pass(store, source, at(29)).pushed  # its admission verdict (no recorder yet)

    first = run_pass(store, source, at(30), demand=recorder)
    assert first.ok and first.commit is None  # a sample taken, nothing due: no commit of its own
    assert [s.pool for s in recorder.pending] == ["rtx-pro-4000", "rtx4090"]  # every pool: the idle one too
    assert run_pass(store, source, at(30.5), demand=recorder).commit is None  # within the resolution
    assert len(recorder.pending) == 2

    # A verdict commit: the samples go with it.
    source.items.append(completed_report("pro-1-a", "123", 20.0, pool="rtx4090", gpu_name="RTX 4090"))
    judged = run_pass(store, source, at(31.5), demand=recorder)
    assert judged.pushed and recorder.pending == ()
    assert trailers(origin, "Fleet-Demand") == [day_path("rtx-pro-4000", at(0).date()),
                                                day_path("rtx4090", at(0).date())]
    assert trailers(origin, "Fleet-Instance") == ["pro-1-a", "pro-0-a"]
    samples, problems = parse_day(origin_file(origin, FILE) or "", "rtx-pro-4000", FILE)
    assert problems == [] and [s.at for s in samples] == [at(30), at(31.5)]
    # Heartbeats every 5 min from minute 1: none ends in (29, 30]; the one at 31 brings its whole interval.
    assert [(s.span_s, s.busy_s, s.wall_s, s.proofs) for s in samples] == [(60.0, 0, 0, 0), (90.0, 300, 300, 4)]
    assert samples[0].serving == 1 and samples[0].usd_per_hour == 0.6 and samples[0].unpriced == 1

    # Nothing else to commit: samples wait, then go out alone once the oldest (at 33) is 10 min old.
    for minute in range(33, 43):
        assert run_pass(store, source, at(minute), demand=recorder).commit is None
    alone = run_pass(store, source, at(43), demand=recorder)
    assert alone.pushed
    subject = git(origin, "log", "-1", "--format=%s", "main").strip()
    assert subject == "fleet demand: samples of rtx-pro-4000, rtx4090"
    samples, _ = parse_day(origin_file(origin, FILE) or "", "rtx-pro-4000", FILE)
    assert samples[-1].at == at(43)
    assert sum(s.proofs for s in samples) == 4 * 3  # the beats at 31, 36 and 41


def test_a_new_leader_continues_the_day_file(tmp_path: Path) -> None:
    origin, store = _store(tmp_path)
    worker = serving("pro-0-a", "rtx-pro-4000-0", [True] * 12, pool="rtx-pro-4000")
    run_pass(store, FakeReports([worker]), at(30), demand=DemandRecorder(flush_s=0.0, spacing_s=60.0))
    # Another process (a replica that now leads): its first tile starts at the file's newest sample.
    run_pass(store, FakeReports([worker]), at(35), demand=DemandRecorder(flush_s=0.0, spacing_s=60.0))
    samples, _ = parse_day(origin_file(origin, FILE) or "", "rtx-pro-4000", FILE)
    assert [(s.at, s.span_s) for s in samples] == [(at(30), 60.0), (at(35), 300.0)]
    assert samples[1].at - samples[0].at == timedelta(minutes=5)
