"""RecordCache: between passes only changed record files are parsed, and the result is always what a load
without a cache returns (changed, rewritten, deleted, unreadable, racy files; anchors and aliases refused).
Last, the cache in the loop: a human's edit merged between two cached passes is what the next pass builds on.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.record_files import (
    RecordCache,
    image_record_path,
    load_records,
    machine_record_path,
    parse_machine_record,
    render_image_record,
    render_machine_record,
)
from reconciler.adapters.record_index import default_index_path, load_for_pass
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.records import ImageSuspectRecord, MachineRecord, RecordSet
from reconciler.flows.judge import run_pass
from tests.fakes import Sleeps
from tests.gitrepos import clone, git, human_commit, make_origin, origin_file
from tests.loop_support import FakeReports
from tests.record_support import rated_entry, rated_record, write_record
from tests.scenarios import LATER, SPEC_YAML, completed_report

DIGEST = "sha256:" + "c3" * 32


def ahead() -> int:
    """A clock for the cache by which every file on disk was written long ago (none is "racy")."""
    return time.time_ns() + 10 * RecordCache.RACY_NS


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    for rec in (rated_record("111", 45.0, 41.0), rated_record("222", 20.0, bad=True), rated_record("333", 50.0)):
        write_record(tmp_path, rec)
    image = ImageSuspectRecord(image_digest=DIGEST, signature="cuda-999", status="suspect", machines=("1", "2", "3"),
                               tripped_at="2026-12-02T11:00:00Z", reason="3 machines")
    write_text_atomic(image_record_path(tmp_path, DIGEST), render_image_record(image))
    return tmp_path


def _load(spec_dir: Path, cache: RecordCache) -> RecordSet:
    """A cached load, checked against a load without a cache (the contract: the same result)."""
    records = load_records(spec_dir, cache)
    assert records == load_records(spec_dir)
    return records


def test_unchanged_files_are_served_from_the_cache_as_the_same_objects(spec_dir: Path) -> None:
    cache = RecordCache(clock_ns=ahead)
    first = _load(spec_dir, cache)
    assert (cache.parsed, cache.reused) == (4, 0) and len(cache) == 4
    second = _load(spec_dir, cache)
    assert (cache.parsed, cache.reused, cache.read) == (0, 4, 0)  # stat only: nothing read, nothing parsed
    assert all(second.machines[m] is first.machines[m] for m in ("111", "222", "333"))
    assert second.images[DIGEST] is first.images[DIGEST]
    assert second.bad_machine_ids() == {"222"}


def test_a_changed_file_is_parsed_again_and_only_it(spec_dir: Path) -> None:
    cache = RecordCache(clock_ns=ahead)
    first = _load(spec_dir, cache)
    changed = rated_record("111", 45.0, 41.0, 12.0, bad=True)
    write_record(spec_dir, changed)  # as git checkout does: a new file in place of the old one
    second = _load(spec_dir, cache)
    assert (cache.parsed, cache.reused) == (1, 3)
    assert second.machines["111"] == changed and second.bad_machine_ids() == {"111", "222"}
    assert second.machines["333"] is first.machines["333"]


def test_a_file_rewritten_in_place_with_the_same_size_is_parsed_again(spec_dir: Path) -> None:
    cache = RecordCache(clock_ns=ahead)
    _load(spec_dir, cache)
    path = machine_record_path(spec_dir, "333")
    text = path.read_text(encoding="utf-8")
    assert "status: ok" in text
    with open(path, "r+", encoding="utf-8") as fh:  # same inode, same size: only the timestamps differ
        fh.write(text.replace("status: ok", "status: no"))
    records = load_records(spec_dir, cache)
    assert cache.parsed == 1 and "333" not in records.machines
    assert any("333.yaml" in p and "status" in p for p in records.problems)


def test_a_rewrite_with_the_same_bytes_is_read_but_not_parsed(spec_dir: Path) -> None:
    cache = RecordCache(clock_ns=ahead)
    first = _load(spec_dir, cache)
    path = machine_record_path(spec_dir, "111")
    write_text_atomic(path, path.read_text(encoding="utf-8"))  # new inode and times, same content
    second = _load(spec_dir, cache)
    assert (cache.parsed, cache.read) == (0, 1)
    assert second.machines["111"] is first.machines["111"]


def test_a_deleted_record_disappears(spec_dir: Path) -> None:
    cache = RecordCache(clock_ns=ahead)
    assert "222" in _load(spec_dir, cache).bad_machine_ids()
    machine_record_path(spec_dir, "222").unlink()  # the pardon by deletion
    image_record_path(spec_dir, DIGEST).unlink()
    records = _load(spec_dir, cache)
    assert "222" not in records.machines and records.bad_machine_ids() == frozenset()
    assert records.images == {} and len(cache) == 2


def test_an_unreadable_file_is_reported_every_pass_and_never_served_from_the_cache(spec_dir: Path) -> None:
    cache = RecordCache(clock_ns=ahead)
    path = machine_record_path(spec_dir, "333")
    good_text = path.read_text(encoding="utf-8")
    good = _load(spec_dir, cache).machines["333"]
    path.write_text("machine_id: '333'\nstatus: maybe\nbenchmarks: []\n", encoding="utf-8")
    for _ in range(3):
        records = _load(spec_dir, cache)
        assert cache.parsed == 1  # a bad file is parsed, and reported, on every pass
        assert "333" not in records.machines and "333" in records.bad_machine_ids()
        assert any("333.yaml" in p and "maybe" in p for p in records.problems)
    path.write_bytes(b"\xff\xfe not utf-8")
    records = _load(spec_dir, cache)
    assert any("333.yaml: cannot read" in p for p in records.problems) and "333" in records.bad_machine_ids()
    path.write_text(good_text, encoding="utf-8")  # the very bytes that were cached once
    records = _load(spec_dir, cache)
    assert cache.parsed == 1 and records.machines["333"] == good and records.problems == ()


def test_a_file_that_changed_just_before_it_was_read_is_compared_by_content_next_time(spec_dir: Path) -> None:
    cache = RecordCache(clock_ns=time.time_ns)  # the files were written a moment ago: "racy"
    first = _load(spec_dir, cache)
    second = _load(spec_dir, cache)
    assert (cache.read, cache.parsed) == (4, 0)  # stat alone is not trusted yet; the bytes are compared
    assert second.machines["111"] is first.machines["111"]
    settled = RecordCache(clock_ns=ahead)
    _load(spec_dir, settled)
    _load(spec_dir, settled)
    assert settled.read == 0


@pytest.mark.parametrize(("text", "found"), [
    ("machine_id: '444'\nstatus: &s ok\nbenchmarks: []\n", "&s"),
    ("machine_id: '444'\nstatus: ok\nnote: *n\nbenchmarks: []\n", "*n"),
    ("machine_id: '444'\nstatus: ok\nbenchmarks: []\nx0: &x0 [a, a, a, a, a, a, a, a, a]\n"
     + "".join(f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]\n" for i in range(1, 10)), "&x0"),
])
def test_anchors_and_aliases_are_refused_as_record_problems(spec_dir: Path, text: str, found: str) -> None:
    path = spec_dir / "machines" / "444.yaml"
    path.write_text(text, encoding="utf-8")
    records = _load(spec_dir, RecordCache())
    assert "444" not in records.machines and "444" in records.bad_machine_ids()
    (problem,) = [p for p in records.problems if "444.yaml" in p]
    assert "anchors and aliases are not allowed" in problem and found in problem


def test_stars_and_ampersands_in_values_are_not_aliases(spec_dir: Path) -> None:
    rec = MachineRecord("555", note="checked *all* fans & PSU; see *ticket 12* &x").with_entry(
        rated_entry("p-555-0", 44.0), host_id="7", gpu_name="RTX 4090")
    write_record(spec_dir, rec)
    assert _load(spec_dir, RecordCache()).machines["555"] == rec


def test_derived_views_are_computed_once_and_perf_history_is_the_callers_copy() -> None:
    records = RecordSet(machines={"1": rated_record("1", 40.0, 44.0), "2": rated_record("2", 10.0, bad=True)})
    assert records.bad_machine_ids() is records.bad_machine_ids() == {"2"}
    perf = records.perf_history()
    perf.clear()
    assert records.perf_history()["1"].median_proofs_per_hour == 42.0


def test_a_first_pass_loads_through_the_record_index_and_primes_the_cache(spec_dir: Path) -> None:
    """A loop's first pass (a restart) builds its records from the record index, then trusts no stat it has
    not seen: the next pass reads every file once and parses only the one edited in between."""
    index_path = default_index_path(spec_dir)
    cache = RecordCache(clock_ns=ahead)
    first = load_for_pass(spec_dir, cache)
    assert index_path.exists() and cache.started and cache.parsed == 0
    assert first == load_records(spec_dir)
    edited = write_record(spec_dir, rated_record("333", 50.0, 12.0, bad=True))
    second = load_for_pass(spec_dir, cache)
    # 3 primed records: 2 kept (content is still the blob indexed), 1 parsed again; the image was not primed
    assert (cache.read, cache.parsed, cache.reused) == (4, 2, 2)
    assert second == load_records(spec_dir) and second.bad_machine_ids() == {"222", "333"}
    assert second.machines["111"] is first.machines["111"]
    assert second.machines["111"].benchmarks[0].evidence["exit_code"] == 0  # read from the file on use
    load_for_pass(spec_dir, cache)
    assert (cache.read, cache.parsed, cache.reused) == (0, 0, 4)  # stat only from then on
    assert edited.exists()


def test_a_first_pass_with_an_unreadable_index_still_loads_every_record(spec_dir: Path) -> None:
    index_path = default_index_path(spec_dir)
    index_path.parent.mkdir(parents=True, exist_ok=True)
    index_path.write_bytes(b"not a database")
    cache = RecordCache(clock_ns=ahead)
    assert load_for_pass(spec_dir, cache) == load_records(spec_dir)
    assert load_for_pass(spec_dir, cache) == load_records(spec_dir) and cache.parsed == 1  # the image only


def test_the_loop_with_a_cache_builds_on_a_human_edit_merged_between_passes(tmp_path: Path) -> None:
    origin, _seed = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    git(tmp_path, "clone", "--quiet", str(origin), str(tmp_path / "bot"))
    store = GitStore(tmp_path / "bot", sleep=Sleeps(), rng=random.Random(3), max_attempts=2)
    cache = RecordCache(clock_ns=ahead)
    source = FakeReports([completed_report("pro-0-a", "123", 20.0), completed_report("pro-1-a", "456", 35.0)])
    assert run_pass(GitFleetTree(store, record_cache=cache), source, LATER).pushed
    assert run_pass(GitFleetTree(store, record_cache=cache), source, LATER).commit is None
    assert (cache.parsed, cache.reused) == (2, 0)  # written by pass 1 after its load: new to the cache

    human = clone(origin, tmp_path / "human")
    path = "fleet-spec/machines/123.yaml"
    edited = (origin_file(origin, path) or "").replace("status: bad", "status: pardoned\nnote: PSU replaced")
    human_commit(human, {path: edited}, "pardon machine 123: PSU replaced")
    source.items.append(completed_report("pro-0-b", "123", 21.0))
    result = run_pass(GitFleetTree(store, record_cache=cache), source, LATER)
    assert [v.instance_id for v in result.verdicts] == ["pro-0-b"]
    assert (cache.parsed, cache.reused) == (1, 1)  # only the human's edit was parsed again
    record = parse_machine_record(origin_file(origin, path) or "", Path(path))
    assert record.note == "PSU replaced" and record.status == "bad"  # built on the edit, not a stale copy
    assert [b.instance_id for b in record.benchmarks] == ["pro-0-a", "pro-0-b"]
    store.close()


class _Tree:
    """Record files edited as git and humans do, each write stamped with a distinct mtime (as on a file
    system with fine timestamps), so the cache's stat path, not only its content check, is exercised."""

    def __init__(self, spec_dir: Path) -> None:
        self.spec_dir = spec_dir
        self.stamp = 1_700_000_000 * 10**9

    def apply(self, op: str, machine_id: str, rate: float) -> None:
        path = self.spec_dir / "machines" / f"{machine_id}.yaml"
        if op == "delete":
            path.unlink(missing_ok=True)
            return
        if op in ("same-bytes", "in-place") and not path.exists():
            return
        if op == "record":
            write_text_atomic(path, render_machine_record(rated_record(machine_id, rate, bad=rate < 30)))
        elif op == "broken":
            write_text_atomic(path, f"machine_id: '{machine_id}'\nstatus: {rate}\nbenchmarks: []\n")
        elif op == "alias":
            write_text_atomic(path, f"machine_id: '{machine_id}'\nstatus: &s ok\nnote: *s\nbenchmarks: []\n")
        elif op == "same-bytes":
            write_text_atomic(path, path.read_text(encoding="utf-8"))
        elif op == "in-place":
            raw = path.read_bytes()
            swapped = raw.replace(b"status: ok", b"status: no") if b"status: ok" in raw else \
                raw.replace(b"status: no", b"status: ok").replace(b"status: bad", b"status: ok ")
            with open(path, "r+b") as fh:
                fh.write(swapped)
        self.stamp += 10**9
        os.utime(path, ns=(self.stamp, self.stamp))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["record", "broken", "alias", "delete", "same-bytes", "in-place"]),
                          st.sampled_from(["1", "2", "3"]), st.sampled_from([12.0, 45.0])), max_size=25))
def test_a_cached_load_always_equals_a_load_without_a_cache(ops: list[tuple[str, str, float]]) -> None:
    with tempfile.TemporaryDirectory(prefix="record-cache-") as tmp:
        tree = _Tree(Path(tmp))
        (tree.spec_dir / "machines").mkdir()
        cache = RecordCache(clock_ns=ahead)
        for op, machine_id, rate in ops:
            tree.apply(op, machine_id, rate)
            assert load_records(tree.spec_dir, cache) == load_records(tree.spec_dir), (op, machine_id)
            assert len(cache) <= 3


def test_fleet_reconcile_loop_mode_passes_over_its_records_with_a_cache_until_sigterm(tmp_path: Path) -> None:
    origin, _seed = make_origin(tmp_path, {
        "fleet-spec/fleet.yaml": SPEC_YAML,
        "fleet-spec/machines/123.yaml": render_machine_record(rated_record("123", 45.0))})
    db = tmp_path / "controller.db"
    SqliteStore(db).close()
    argv = [sys.executable, "-m", "reconciler.cli", "reconcile", "--repo", str(origin), "--workdir",
            str(tmp_path / "bot"), "--controller-db", str(db), "--interval", "0.05", "--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        passes = [json.loads(proc.stdout.readline()) for _ in range(3)]
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert [p["headline"] for p in passes] == ["nothing new; 0 pending"] * 3 and all(p["ok"] for p in passes)
    assert proc.returncode == 0 and "Traceback" not in err
