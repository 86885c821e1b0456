"""Demand samples (domain/demand.py), their day files (adapters/demand_files.py) and the leader's recorder
(flows/demand.py): what a sample measures, how steady tiles merge, how a file reads back, when samples are taken
and committed."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from reconciler.adapters.demand_files import (
    DemandFileError,
    day_path,
    last_sample_at,
    load_demand,
    parse_day,
    render_day,
    stale_days,
)
from reconciler.domain.capacity import QueueSnapshot, Utilization, signals_for
from reconciler.domain.demand import PoolSample, Tile, compact, pool_sample, tile
from reconciler.domain.records import RecordSet
from reconciler.flows.demand import DemandRecorder, demand_trailers
from tests.capacity_support import at, autoscaled_spec, benchmarking, serving

SPEC = autoscaled_spec()
POOL = SPEC.pool("rtx4090")


def _reports() -> list:
    # Heartbeats every 5 min from minute 1: m-a busy throughout (4 proofs a beat), m-b idle, m-c on its way.
    return [serving("a", "rtx4090-0", [True] * 8), serving("b", "rtx4090-1", [False] * 8),
            benchmarking("c", "rtx4090-2", 20)]


def test_a_sample_measures_the_tile_since_the_last_one_and_the_pass_state() -> None:
    spec = replace(SPEC, pools=(replace(POOL, count=3, slot_indices=(0, 1, 2)),))
    pool = spec.pool("rtx4090")
    now = at(36)
    queue = QueueSnapshot({"PoRep": 3}, {"PoRep": 1}, now - timedelta(minutes=7))
    signals = signals_for(pool, _reports(), queue, spec.serving, {"a": 0.31}, now)
    s = pool_sample(pool, _reports(), spec.serving, {"a": 0.31}, now, timedelta(minutes=10), signals=signals,
                    desired=4, changed=True, image_digest="sha256:" + "ab" * 32)
    # Tile (26, 36]: the intervals ending at 31 and 36 of both serving machines: 2 x 300 s each, a busy, b idle.
    assert (s.busy_s, s.wall_s, s.proofs) == (600.0, 1200.0, 8)
    assert (s.serving, s.on_the_way, s.stopped, s.slots, s.desired) == (2, 1, 0, 3, 4)
    # a at its price, b and c (no price known) at the pool's max price 0.5.
    assert (s.usd_per_hour, s.unpriced) == (1.31, 2)
    assert (s.waiting, s.running, s.oldest_wait_s) == ({"PoRep": 3}, {"PoRep": 1}, 420.0)
    assert s.up == signals.utilization_up and s.down == signals.utilization_down
    assert (s.changed, s.image) == (True, "abababababab")
    assert s.queue(now) == QueueSnapshot({"PoRep": 3}, {"PoRep": 1}, now - timedelta(minutes=7), upcoming=None)


def test_a_tile_counts_each_heartbeat_interval_whole_where_it_ends() -> None:
    reports = [serving("a", "rtx4090-0", [True, True, False, False, True, True, True, True])]
    assert tile(reports, at(36), timedelta(minutes=5)) == Tile(300.0, 300.0, 4)  # the beat at 36 only
    assert tile(reports, at(36), timedelta(minutes=35.5)) == Tile(1500.0, 2100.0, 24)  # all eight (the first opens)
    assert tile(reports, at(33), timedelta(minutes=1)) == Tile()  # no beat ends in (32, 33]
    # Tiles of any length add up to the same covered time.
    ends = [at(m) for m in range(2, 38)]
    per_minute = [tile(reports, e, timedelta(minutes=1)) for e in ends]
    assert sum(t.wall_s for t in per_minute) == 2100.0 and sum(t.busy_s for t in per_minute) == 1500.0


def _sample(minute: float, **kw: object) -> PoolSample:
    base = dict(pool="rtx4090", at=at(minute), span_s=60.0, desired=2, slots=2, draining=0, serving=2, on_the_way=0,
                stopped=0, draining_serving=0, busy_s=0.0, wall_s=120.0, proofs=0, usd_per_hour=1.0, unpriced=0,
                waiting={}, running={})
    base.update(kw)
    return PoolSample(**base)  # type: ignore[arg-type]


def test_steady_tiles_merge_and_a_decision_or_any_change_starts_a_new_line() -> None:
    idle = [_sample(m) for m in (1, 2, 3)]
    merged = compact(idle)
    assert len(merged) == 1 and (merged[0].at, merged[0].span_s, merged[0].wall_s) == (at(3), 180.0, 360.0)
    busy = _sample(4, busy_s=120.0)
    decided = _sample(5, changed=True)
    waiting = _sample(6, waiting={"PoRep": 1})
    assert [s.at for s in compact([*idle, busy, decided, waiting])] == [at(3), at(4), at(5), at(6)]
    # The same pass sampled twice (a retried publish): one line, the later word.
    assert compact([_sample(1), _sample(1, proofs=3)]) == [_sample(1, proofs=3)]


def test_a_day_file_reads_back_what_was_written() -> None:
    samples = [_sample(1, busy_s=30.5, proofs=2, waiting={"PoRep": 3, "WdPost": 1}, oldest_wait_s=90.0,
                       upcoming=4),
               _sample(2, waiting=None, running=None, paused=True, exhausted=True, image="abcdef012345",
                       heard_s=12.5, back_s=300.0, silent_s=900.0, unheard=True, memory_s=1800.0, quiet_s=450.0,
                       overdue=True, market={"fil_per_proof": 0.0021, "usd_per_proof": 0.011, "served": 40,
                                             "error": None, "revenue_basis": "mean of 40 paid proofs"}),
               _sample(3, queue_error=True, waiting=None, running=None, changed=True,
                       up=signals_for(POOL, _reports(), None, SPEC.serving, {}, at(36)).utilization_up)]
    text = render_day(samples)
    back, problems = parse_day(text, "rtx4090", "demand/rtx4090/2026-12-01.csv")
    assert problems == [] and back == samples


def test_an_unreadable_line_is_named_and_skipped_and_unknown_columns_are_kept() -> None:
    text = render_day([_sample(1), _sample(2, busy_s=5.0)])
    lines = text.splitlines()
    lines[3] = lines[3].replace(",60,", ",-60,", 1)  # the first data line: a negative span
    lines[2] += ",market_usd"
    lines[4] += ",1.25"
    back, problems = parse_day("\n".join(lines) + "\n", "rtx4090", "demand/rtx4090/2026-12-01.csv")
    assert [s.at for s in back] == [at(2)] and back[0].extra == {"market_usd": "1.25"}
    assert problems == ["demand/rtx4090/2026-12-01.csv: data line 1: span_s '-60' is not a finite number >= 0"]
    assert "market_usd" in render_day(back).splitlines()[2]


def test_a_line_reads_as_its_cells_under_the_header_whatever_the_header_holds() -> None:
    """An older writer's file (columns missing), a short line, a column named twice: each line reads as its cells
    zipped with the header would (a missing cell is its column's default, a column named twice is its last cell)."""
    samples = [_sample(1, busy_s=30.5, proofs=2, waiting={"PoRep": 3}), _sample(2, busy_s=5.0, proofs=1)]
    lines = render_day(samples).splitlines()
    header = lines[2].split(",")
    kept = [i for i, name in enumerate(header) if name not in ("waiting", "quiet_s", "overdue")]
    older = [",".join(line.split(",")[i] for i in kept) for line in lines[2:]]
    back, problems = parse_day("\n".join(older) + "\n", "rtx4090", "x.csv")
    # (a file without a `waiting` column has no queue reading: None, not the empty one written)
    assert problems == [] and back == [replace(s, waiting=None) for s in samples]

    short = lines[2:]
    short[1] = ",".join(short[1].split(",")[:-2])  # the first data line without its last two cells
    back, problems = parse_day("\n".join(short) + "\n", "rtx4090", "x.csv")
    assert problems == [] and back == samples

    twice = [lines[2] + ",busy_s,note"] + [line + ",99.5," for line in lines[3:]]
    back, problems = parse_day("\n".join(twice) + "\n", "rtx4090", "x.csv")
    assert problems == [] and [s.busy_s for s in back] == [99.5, 99.5] and [s.extra for s in back] == [{}, {}]
    twice[2] = twice[2].removesuffix(",99.5,")  # a line too short for the second busy_s: its first one is read
    back, problems = parse_day("\n".join(twice) + "\n", "rtx4090", "x.csv")
    assert problems == [] and [s.busy_s for s in back] == [99.5, 5.0]

    bad = lines[2:]
    bad[1] = bad[1].replace(",2,", ",x,", 1).replace(",60,", ",-60,", 1)  # two bad cells: the first one is named
    back, problems = parse_day("\n".join(bad) + "\n", "rtx4090", "x.csv")
    assert back == samples[1:] and problems == ["x.csv: data line 1: span_s '-60' is not a finite number >= 0"]


def test_a_pool_name_that_cannot_name_a_file_is_refused() -> None:
    with pytest.raises(DemandFileError, match=re.escape("'../x'")):
        day_path("../x", at(0).date())


def test_load_demand_reads_the_window_of_every_pool(tmp_path: Path) -> None:
    for minute in (1, 2, 3):
        path = tmp_path / day_path("rtx4090", at(minute).date())
        path.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / day_path("rtx4090", at(0).date())).write_text(
        render_day([_sample(1), _sample(2, busy_s=60.0), _sample(3)]))
    history = load_demand(tmp_path, at(1), at(3))
    assert history.files == 1 and [s.at for s in history.samples["rtx4090"]] == [at(2), at(3)]
    tree = {day_path("rtx4090", at(0).date()): (tmp_path / day_path("rtx4090", at(0).date())).read_text()}
    assert last_sample_at(tree.get, "rtx4090", at(10)) == at(3)


def names(tree: dict[str, str]) -> Callable[[str], list[str]]:
    """The spec directory's files under a directory, as the pass's tree view lists them."""
    return lambda directory: sorted(p for p in tree if p.startswith(directory + "/"))


def test_the_recorder_samples_at_most_once_per_resolution_and_commits_when_due() -> None:
    recorder = DemandRecorder(resolution_s=60.0, spacing_s=60.0, flush_s=300.0)
    records = RecordSet()
    tree: dict[str, str] = {}
    first = recorder.take(SPEC, tree.get, _reports(), records, (), (), {}, None, at(36))
    assert [s.span_s for s in first] == [60.0]  # nothing earlier: one resolution
    assert recorder.changes(tree.get, names(tree), "fleet-spec", first, at(36), committing=False) == ()  # not due yet
    recorder.done(first, flushed=False)
    assert recorder.take(SPEC, tree.get, _reports(), records, (), (), {}, None, at(36.5)) == ()  # within 60 s
    later = recorder.take(SPEC, tree.get, _reports(), records, (), (), {}, None, at(37.5))
    assert [s.span_s for s in later] == [90.0]
    files = recorder.changes(tree.get, names(tree), "fleet-spec", later, at(37.5), committing=True)  # a commit anyway
    assert [c.path for c in files] == ["fleet-spec/" + day_path("rtx4090", at(0).date())]
    assert demand_trailers(files) == (("Fleet-Demand", day_path("rtx4090", at(0).date())),)
    written, _ = parse_day(files[0].content or "", "rtx4090", "x")
    assert [s.at for s in written] == [at(36), at(37.5)]
    recorder.done(later, flushed=True)
    assert recorder.pending == ()
    # Nothing committed for a while: the samples go out on their own once the oldest is flush_s old.
    recorder.done(recorder.take(SPEC, tree.get, _reports(), records, (), (), {}, None, at(39)), flushed=False)
    assert recorder.changes(tree.get, names(tree), "fleet-spec", (), at(43), committing=False) == ()
    assert len(recorder.changes(tree.get, names(tree), "fleet-spec", (), at(44), committing=False)) == 1


def test_a_new_leader_starts_its_tile_where_the_day_file_ends() -> None:
    tree = {day_path("rtx4090", at(0).date()): render_day([_sample(30)])}
    taken = DemandRecorder(spacing_s=60.0).take(SPEC, tree.get, _reports(), RecordSet(), (), (), {}, None, at(36))
    assert [s.span_s for s in taken] == [360.0]


def test_the_recorder_remembers_prices_of_instances_the_provisioner_has_forgotten() -> None:
    recorder = DemandRecorder()
    assert recorder.known_prices({"a": 0.3, "b": 0.4}) == {"a": 0.3, "b": 0.4}
    # "a" was replaced (gone from the slot state) before the pass that judges it: its price is still known.
    assert recorder.known_prices({"b": 0.45, "c": 0.5}) == {"a": 0.3, "b": 0.45, "c": 0.5}


def test_between_its_spacing_a_pool_is_sampled_only_when_something_a_decision_turns_on_moved() -> None:
    earlier = _sample(1, busy_s=60.0, up=Utilization(540.0, 600.0, 1, 600.0), waiting={})
    assert _sample(2, busy_s=60.0, up=Utilization(545.0, 600.0, 1, 600.0), waiting={}).differs_from(
        earlier) is None  # 0.90 -> 0.908
    assert _sample(2, up=Utilization(560.0, 600.0, 1, 600.0), waiting={}).differs_from(
        earlier) == "utilization (up)"  # 0.90 -> 0.93
    assert _sample(2, up=earlier.up, waiting={}, serving=3).differs_from(earlier) == "serving"
    assert _sample(2, up=earlier.up, waiting={}, changed=True).differs_from(earlier) == "a capacity decision"
    assert _sample(2, up=earlier.up, waiting={}, unheard=True).differs_from(earlier) == "unheard"
    # While work waits, every pass the recorder may sample is taken: the decision reads each ("demand that lasted").
    assert _sample(2, up=earlier.up, waiting={"PoRep": 10}).differs_from(earlier) == "work waiting"
    assert _sample(3, up=earlier.up, waiting={}).differs_from(_sample(2, up=earlier.up, waiting={"PoRep": 1})) == \
        "queue"  # to empty


def test_the_recorder_skips_a_pass_where_nothing_moved_until_its_spacing() -> None:
    recorder = DemandRecorder(resolution_s=60.0, spacing_s=600.0)
    tree: dict[str, str] = {}
    first = recorder.take(SPEC, tree.get, _reports(), RecordSet(), (), (), {}, None, at(36))
    recorder.done(first, flushed=False)
    assert recorder.take(SPEC, tree.get, _reports(), RecordSet(), (), (), {}, None, at(38)) == ()  # nothing moved
    later = recorder.take(SPEC, tree.get, _reports(), RecordSet(), (), (), {}, None, at(46))  # 10 min: spacing
    assert [s.span_s for s in later] == [600.0]  # its tile covers the skipped passes too


def test_day_files_past_the_retention_are_the_ones_deleted() -> None:
    files = [day_path("rtx4090", at(0).date() - timedelta(days=d)) for d in (0, 39, 40, 41)] + ["demand/README"]
    keep_from = at(0).date() - timedelta(days=40)
    assert stale_days(files, keep_from) == [day_path("rtx4090", at(0).date() - timedelta(days=41))]
