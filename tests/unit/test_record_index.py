"""The record index never serves a stale record: what it answers is what parsing the files answers now.

Against a real git checkout: a human's uncommitted edit, the same edit committed, a revert, a branch switch,
a deleted record and a rewrite within the same clock tick are each seen by the next load; a new index
(another process) reuses what an earlier one parsed; a corrupt index file is rebuilt. Over random spec
directories (good, broken, misnamed, image records) the indexed RecordSet equals `load_records`.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.record_files import (
    image_record_path,
    load_records,
    machine_record_path,
    render_image_record,
    render_machine_record,
)
from reconciler.adapters.record_index import RecordIndex, default_index_path, git_blob_id, read_evidence
from reconciler.domain.forecast import _known, known_machines
from reconciler.domain.records import BenchmarkEntry, ImageSuspectRecord, MachineRecord, RecordError, RecordSet
from tests.gitrepos import git
from tests.record_support import rated_record, write_record

DIGEST = "sha256:" + "c3" * 32


def ahead() -> int:
    """A clock by which every file on disk was written long ago (none is "racy")."""
    return time.time_ns() + 10 * RecordIndex.RACY_NS


def assert_same(indexed: RecordSet, spec_dir: Path) -> None:
    """The contract: the same RecordSet, views included, as parsing every file."""
    plain = load_records(spec_dir)
    assert indexed.bad_machine_ids() == plain.bad_machine_ids()
    assert indexed.bad_marks() == plain.bad_marks()
    assert indexed.status_counts() == plain.status_counts()
    assert indexed.bad_records() == plain.bad_records()
    assert indexed.bad_machines() == plain.bad_machines()
    assert indexed.bad_machine_gpus() == plain.bad_machine_gpus()
    assert indexed.passed_on_probation() == plain.passed_on_probation()
    assert indexed.last_prices() == plain.last_prices()
    # The views' per-instance look-ups (fleet status, the page): every entry's instance, and one that is none.
    wanted = {m: {b.instance_id for b in r.benchmarks} | {"no-such-instance"} for m, r in plain.machines.items()}
    wanted["no-such-machine"] = {"x"}
    assert indexed.instance_verdicts(wanted) == plain.instance_verdicts(wanted)
    assert indexed.instance_entries(wanted) == plain.instance_entries(wanted)
    for gpu in ("RTX 4090", "H100"):  # the plan's forecast from views equals the walk over every record
        from_views = sorted(known_machines(indexed, gpu), key=lambda k: k.machine_id)
        walked = [k for r in plain.machines.values() if (k := _known(r, gpu)) is not None]
        assert from_views == sorted(walked, key=lambda k: k.machine_id)
    assert indexed.perf_history() == plain.perf_history()
    assert indexed.problems == plain.problems
    assert indexed.unreadable_machine_ids == plain.unreadable_machine_ids
    assert dict(indexed.images) == dict(plain.images)
    assert list(indexed.machines) == list(plain.machines)
    assert dict(indexed.machines.items()) == dict(plain.machines.items())
    assert indexed == plain
    # Entries built from index rows (their fields set as pickle sets them) are what __init__ would build.
    for rec in indexed.machines.values():
        for entry in rec.benchmarks:
            assert list(vars(entry)) == [f.name for f in fields(BenchmarkEntry)]
            rebuilt = BenchmarkEntry(**{f.name: getattr(entry, f.name) for f in fields(BenchmarkEntry)})
            assert rebuilt == entry and repr(rebuilt) == repr(entry)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    root.mkdir()
    git(root, "init", "--quiet", "--initial-branch=main")
    spec = root / "fleet-spec"
    for rec in (rated_record("111", 45.0, 41.0), rated_record("222", 20.0, bad=True), rated_record("333", 50.0)):
        write_record(spec, rec)
    image = ImageSuspectRecord(image_digest=DIGEST, signature="cuda-999", status="suspect", machines=("1", "2", "3"),
                               tripped_at="2026-12-02T11:00:00Z", reason="3 machines")
    write_text_atomic(image_record_path(spec, DIGEST), render_image_record(image))
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "records")
    return root


def _index(repo: Path) -> RecordIndex:
    return RecordIndex(default_index_path(repo / "fleet-spec"), clock_ns=ahead)


def test_the_index_lives_in_the_checkouts_git_dir_and_a_second_process_parses_nothing(repo: Path) -> None:
    spec = repo / "fleet-spec"
    assert default_index_path(spec) == repo / ".git" / "fleet" / "records.sqlite"
    first = _index(repo)
    assert_same(first.load(spec), spec)
    assert (first.parsed, first.hashed) == (4, 4)
    again = _index(repo)  # a new process: only stat()s
    records = again.load(spec)
    assert (again.parsed, again.hashed, again.reused) == (0, 0, 4)
    assert_same(records, spec)
    assert git(repo, "status", "--porcelain") == ""  # nothing in the work tree


def test_a_human_edit_uncommitted_then_committed_then_reverted_is_seen_by_the_next_load(repo: Path) -> None:
    spec = repo / "fleet-spec"
    index = _index(repo)
    assert "222" in index.load(spec).bad_machine_ids()
    path = machine_record_path(spec, "222")
    path.write_text(path.read_text().replace("status: bad", "status: pardoned\nnote: PSU replaced"))
    records = _index(repo).load(spec)
    assert "222" not in records.bad_machine_ids() and records.machines["222"].note == "PSU replaced"
    assert_same(records, spec)
    git(repo, "commit", "--quiet", "-am", "pardon 222")
    assert "222" not in _index(repo).load(spec).bad_machine_ids()
    git(repo, "revert", "--no-edit", "HEAD")
    records = index.load(spec)  # the first index object, kept across all of it (the loop's case)
    assert "222" in records.bad_machine_ids() and records.machines["222"].status == "bad"
    assert_same(records, spec)


def test_a_branch_switch_and_a_deleted_record_are_seen(repo: Path) -> None:
    spec = repo / "fleet-spec"
    index = _index(repo)
    index.load(spec)
    git(repo, "checkout", "--quiet", "-b", "other")
    write_record(spec, rated_record("111", 45.0, 41.0, 9.0, bad=True))
    machine_record_path(spec, "333").unlink()
    git(repo, "commit", "--quiet", "-am", "other branch")
    records = index.load(spec)
    assert records.bad_machine_ids() == {"111", "222"} and "333" not in records.machines
    assert_same(records, spec)
    git(repo, "checkout", "--quiet", "main")
    records = index.load(spec)
    assert records.bad_machine_ids() == {"222"} and "333" in records.machines
    assert_same(records, spec)
    assert index.parsed == 0  # main's blobs were parsed before the switch


def test_a_rewrite_within_the_same_clock_tick_is_seen(tmp_path: Path) -> None:
    """Same size, same mtime (coarse clock): the file was "racy" when first read, so it is hashed again."""
    spec = tmp_path / "spec"
    path = write_record(spec, rated_record("333", 50.0))
    stamp = os.stat(path).st_mtime_ns
    index = RecordIndex(tmp_path / "index.sqlite", clock_ns=lambda: stamp)  # read in the tick it was written
    assert index.load(spec).machines["333"].status == "ok"
    text = path.read_text()
    with open(path, "r+", encoding="utf-8") as fh:
        fh.write(text.replace("status: ok", "status: no"))
    os.utime(path, ns=(stamp, stamp))
    records = index.load(spec)
    assert "333" not in records.machines and any("333.yaml" in p for p in records.problems)
    assert_same(records, spec)


def test_a_corrupt_index_is_rebuilt(repo: Path) -> None:
    spec = repo / "fleet-spec"
    _index(repo).load(spec)
    path = default_index_path(spec)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    index = _index(repo)
    records = index.load(spec)
    assert index.rebuilt is not None and index.parsed == 4
    assert_same(records, spec)
    with sqlite3.connect(path) as db:  # a real index again
        assert db.execute("SELECT count(*) FROM files").fetchone()[0] == 4


def test_a_file_whose_blob_left_the_index_is_read_again(repo: Path) -> None:
    spec = repo / "fleet-spec"
    _index(repo).load(spec)
    with sqlite3.connect(default_index_path(spec)) as db:  # as pruning leaves it: the file row, no blob row
        db.execute("DELETE FROM blobs WHERE kind = 'm'")
        db.execute("DELETE FROM snapshots")  # (pruning drops every snapshot: none may name a pruned blob)
    index = _index(repo)
    assert_same(index.load(spec), spec)
    assert index.parsed == 3


def test_evidence_is_read_from_the_file_it_was_indexed_from(repo: Path) -> None:
    spec = repo / "fleet-spec"
    records = _index(repo).load(spec)
    entry = records.machines["111"].benchmarks[1]
    assert entry.evidence == {"log_tail": ["throughput:    0.683 proofs/min"], "exit_code": 0}
    later = _index(repo).load(spec)
    write_record(spec, rated_record("111", 45.0, 41.0, 30.0))  # changed after the load, before the evidence was read
    with pytest.raises(RecordError, match="changed while it was being read"):
        dict(later.machines["111"].benchmarks[0].evidence)


def test_read_evidence_reads_it_now_not_on_first_use(repo: Path) -> None:
    spec = repo / "fleet-spec"
    records, unread = _index(repo).load(spec), _index(repo).load(spec)
    read_evidence(records.machines.values())
    write_record(spec, rated_record("111", 45.0, 41.0, 30.0))  # changed after the evidence was read
    assert records.machines["111"].benchmarks[1].evidence == {"log_tail": ["throughput:    0.683 proofs/min"],
                                                             "exit_code": 0}
    with pytest.raises(RecordError, match="changed while it was being read"):  # read on first use: too late
        dict(unread.machines["111"].benchmarks[1].evidence)


def test_a_cold_build_split_with_a_forked_child_gives_the_same_records(tmp_path: Path) -> None:
    spec = tmp_path / "spec"
    for i in range(9):
        write_record(spec, rated_record(f"{i}00", 40.0 + i, 10.0, bad=i % 3 == 0))
    (spec / "machines" / "broken.yaml").write_text("machine_id: 'broken'\nstatus: maybe\nbenchmarks: []\n")
    (spec / "machines" / "0dir.yaml").mkdir()  # cannot be read: the child reports it
    index = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead)
    index.PARALLEL_FROM, index.parallel = 2, True  # the child reads and parses half of the 11 files
    records = index.load(spec)
    assert index.split and index.parsed == 10 and index.hashed == 10
    assert any("0dir.yaml: cannot read" in p for p in records.problems)
    assert_same(records, spec)
    unsplit = RecordIndex(tmp_path / "other.sqlite", clock_ns=ahead)
    unsplit.PARALLEL_FROM, unsplit.parallel = 2, False
    assert unsplit.load(spec) == records and not unsplit.split
    assert_same(RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead).load(spec), spec)  # what was stored
    again = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead)
    again._db.execute("DELETE FROM snapshots")  # file by file: each blob, the child's share too, was stored
    assert_same(again.load(spec), spec)
    assert again.parsed == 0 and again.hashed == 0 and again.reused == 10  # 0dir.yaml: a problem again


def test_a_process_running_other_threads_does_not_fork(tmp_path: Path) -> None:
    """A lock another thread held at the fork would stay locked in the child: such a process parses alone."""
    import threading

    spec = tmp_path / "spec"
    for i in range(4):
        write_record(spec, rated_record(f"{i}00", 40.0 + i))
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        index = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead)
        index.PARALLEL_FROM = 2
        assert_same(index.load(spec), spec)
        assert not index.split and index.parsed == 4
    finally:
        release.set()
        other.join()
    if (os.cpu_count() or 1) >= 2 and threading.active_count() == 1:  # alone again: the child takes its share
        index = RecordIndex(tmp_path / "other.sqlite", clock_ns=ahead)
        index.PARALLEL_FROM = 2
        assert_same(index.load(spec), spec)
        assert index.split


def test_no_fork_while_another_connection_of_this_process_has_the_index_open(tmp_path: Path) -> None:
    """SQLite's lock bookkeeping is per process and per file: a child forked while another connection of the
    parent has the file open would inherit it. The split waits until that connection is closed."""
    spec = tmp_path / "spec"
    for i in range(4):
        write_record(spec, rated_record(f"{i}00", 40.0 + i))
    other = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead)
    index = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead)
    index.PARALLEL_FROM, index.parallel = 2, True
    assert_same(index.load(spec), spec)
    assert not index.split and index.parsed == 4
    other.close()
    index._db.execute("DELETE FROM files")
    index._db.execute("DELETE FROM snapshots")
    assert_same(index.load(spec), spec)
    assert index.split


def test_records_parsed_but_not_stored_are_still_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process held the write lock: nothing was stored, and the machines are built from the parse."""
    spec = tmp_path / "spec"
    for i in range(3):
        write_record(spec, rated_record(f"{i}00", 40.0 + i, 10.0, bad=i == 1))
    index = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead)
    monkeypatch.setattr("reconciler.adapters.record_index._store_rows", lambda *a, **k: False)
    records = index.load(spec)
    assert index._db.execute("SELECT count(*) FROM blobs").fetchone()[0] == 0
    assert_same(records, spec)


@pytest.mark.parametrize("where", ["in memory", "child could not store"])
def test_when_the_child_cannot_store_its_share_the_parent_stores_it(tmp_path: Path, where: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "spec"
    for i in range(9):
        write_record(spec, rated_record(f"{i}00", 40.0 + i, 10.0, bad=i % 3 == 0))
    if where == "in memory":  # the cache directory cannot be made: an in-memory index the child cannot reach
        (tmp_path / "file").write_text("")
        index = RecordIndex(tmp_path / "file" / "index.sqlite", clock_ns=ahead)
        assert index.rebuilt is not None and "in-memory" in index.rebuilt
    else:  # the child's store fails (another writer held the lock): it sends its entries back instead
        monkeypatch.setattr(RecordIndex, "_store_from_child", lambda *a: False)
        index = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead)
    index.PARALLEL_FROM, index.parallel = 2, True
    assert_same(index.load(spec), spec)
    assert index.split
    index._db.execute("DELETE FROM snapshots")
    assert_same(index.load(spec), spec)
    assert index.parsed == 0 and index.reused == 9  # the parent stored the child's share


def test_an_unchanged_listing_is_answered_from_the_snapshot_and_every_change_leaves_it(repo: Path) -> None:
    """The snapshot (the whole answer for one listing) is used only while every file's stat is what it was;
    its derived views (kill-budget marks, bad-machine entries, prices) are kept on first use."""
    spec = repo / "fleet-spec"
    first = _index(repo)
    assert_same(first.load(spec), spec)
    assert not first.from_snapshot
    for _ in range(2):  # the first computes the derived views and keeps them, the second reads them
        again = _index(repo)
        records = again.load(spec)
        assert again.from_snapshot and (again.parsed, again.hashed) == (0, 0)
        assert_same(records, spec)
    path = machine_record_path(spec, "222")
    changes = [
        lambda: path.write_text(path.read_text().replace("status: bad", "status: pardoned")),  # a human edit
        lambda: git(repo, "checkout", "--quiet", "--", "fleet-spec"),  # a revert of it
        lambda: write_record(spec, rated_record("444", 10.0, bad=True)),  # a new record
        lambda: machine_record_path(spec, "111").unlink(),  # a deleted one
        lambda: os.utime(path),  # touched, same content: hashed again, nothing parsed
    ]
    for change in changes:
        change()
        index = _index(repo)
        records = index.load(spec)
        assert not index.from_snapshot
        assert_same(records, spec)
        again = _index(repo)
        assert_same(again.load(spec), spec)
        assert again.from_snapshot


def test_no_snapshot_is_kept_of_a_file_that_had_not_settled(tmp_path: Path) -> None:
    spec = tmp_path / "spec"
    path = write_record(spec, rated_record("333", 50.0))
    stamp = os.stat(path).st_mtime_ns
    for _ in range(2):  # read in the tick it was written: its stat proves nothing yet
        index = RecordIndex(tmp_path / "index.sqlite", clock_ns=lambda: stamp)
        assert_same(index.load(spec), spec)
        assert not index.from_snapshot and index.hashed == 1


def test_git_blob_ids_match_git(repo: Path) -> None:
    path = machine_record_path(repo / "fleet-spec", "111")
    assert git_blob_id(path.read_bytes()) == git(repo, "hash-object", str(path)).strip()


_texts = st.sampled_from([
    "machine_id: '{m}'\nstatus: ok\nbenchmarks: []\n",
    "machine_id: '{m}'\nstatus: bad\nbenchmarks: []\n",
    "machine_id: '{m}'\nstatus: maybe\nbenchmarks: []\n",
    "machine_id: 'other'\nstatus: ok\nbenchmarks: []\n",
    "{not yaml",
    "machine_id: '{m}'\nstatus: ok\nnote: &a x\nbenchmarks: []\n",
    "RENDER",
    "RENDER_BAD",
])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["1", "2", "3", "4", ".h", "x y"]), _texts), max_size=6),
       st.lists(st.tuples(st.sampled_from(["1", "2", "3"]), _texts), max_size=3))
def test_the_indexed_recordset_equals_load_records_over_random_edits(
        tmp_path: Path, first: list[tuple[str, str]], second: list[tuple[str, str]]) -> None:
    with __import__("tempfile").TemporaryDirectory(dir=tmp_path) as tmp:
        spec = Path(tmp) / "spec"
        (spec / "machines").mkdir(parents=True)
        index = RecordIndex(Path(tmp) / "index.sqlite", clock_ns=ahead)
        for step in (first, second):
            for name, text in step:
                if text == "RENDER":
                    text = render_machine_record(rated_record(name, 40.0, 44.0))
                elif text == "RENDER_BAD":
                    text = render_machine_record(rated_record(name, 40.0, 10.0, bad=True))
                (spec / "machines" / f"{name}.yaml").write_text(text.replace("{m}", name), encoding="utf-8")
            assert_same(index.load(spec), spec)
            again = RecordIndex(Path(tmp) / "index.sqlite", clock_ns=ahead)  # the next command: from the snapshot
            assert_same(again.load(spec), spec)
            assert again.from_snapshot


def test_machines_that_passed_again_on_probation_come_from_the_index_as_from_the_files(tmp_path: Path) -> None:
    spec = tmp_path / "fleet-spec"
    marked = BenchmarkEntry("i-1", "2026-11-01T00:00:00Z", "below-min-rate", "machine", True, "slow", pool="p",
                            expires_at="2026-11-02T00:00:00Z", probation_until="2026-12-02T00:00:00Z")
    passed = BenchmarkEntry("i-2", "2026-11-03T00:00:00Z", "ok", "none", False, "fine", pool="p")
    write_record(spec, MachineRecord("501", "ok", gpu_name="RTX 4090", benchmarks=(marked, passed)))
    write_record(spec, MachineRecord("502", "bad", gpu_name="RTX 4090", benchmarks=(marked,)))
    write_record(spec, MachineRecord("503", "pardoned", gpu_name="RTX 4090", benchmarks=(marked, passed)))
    write_record(spec, rated_record("504", 50.0))
    indexed = RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead).load(spec)
    assert [b.machine_id for b in indexed.passed_on_probation()] == ["501"]
    assert_same(indexed, spec)
    assert_same(RecordIndex(tmp_path / "index.sqlite", clock_ns=ahead).load(spec), spec)  # from stored rows
