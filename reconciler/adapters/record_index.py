"""Parsed-record index: the record files of a spec directory, parsed once per git blob, kept in SQLite.

Place in the flow: the read-only commands (`fleet records`, `status`, `plan`, `apply`) load their `RecordSet`
through `RecordIndex.load(spec_dir)` instead of parsing every file on every start; the reconcile loop does for
its first pass (`load_for_pass`), then keeps the records in its RecordCache.
The index is a cache, never the source of truth: the files in the work tree are. Delete it at any time
(it lives in the checkout's git directory, `.git/fleet/records.sqlite`, or under `$XDG_CACHE_HOME/gpu-fleet/`
for a spec directory outside git) and the next command rebuilds it; a corrupt one is rebuilt on the spot.

How a load stays correct and cheap:
- Every `*.yaml` under `machines/` and `images/` is stat()ed. A file whose (device, inode, size, mtime, ctime)
  equals what the index saw, and that had settled (last changed more than RACY_NS before it was read, as git
  treats "racily clean" index entries), has the blob id the index recorded. Any other file is read and hashed
  as git hashes a blob (`sha1("blob <size>\\0" + bytes)`): a human edit, a `git checkout` of another branch, a
  revert, a rewrite by the reconciler all change the stat and so the blob looked up.
- A blob the index has not seen is parsed (GC paused for the bulk; entries decoded and schema-checked by
  msgspec one line each, evidence not decoded: record_files.parse_machine_rows), and stored: the record's
  summary (`domain.records.summarize`: what every view reads of it), its entries without evidence, or the
  problem text if it is unreadable. The same content under the same name is never parsed twice, across
  processes. A cold build (thousands of files to read) is split over two processes: a forked child reads,
  parses and stores a share of the files through its own connection while the parent does the rest
  (_read_forked).
- The RecordSet aggregates the stored summaries: this module decides nothing about a record, it stores what
  the domain computed and reads it back. A machine's full record (entries) is built only when a caller asks
  for it, and an entry's evidence (log tails, phase times: most of the bytes) only when read, from the file,
  checked against the blob id it was indexed under.
- Snapshot: when every listed file had settled, the listing (machine -> blob, problems) is stored under a
  hash of the listing (every path with its stat), and the aggregates the RecordSet computes from it (bad set,
  counts, perf history, kill-budget marks, bad-machine views, prices) are kept with it as they are first
  computed (the RecordSet's `memo`). The next load whose listing hashes the same - no file added, removed,
  rewritten or touched - answers from those rows instead of reading 10,000 summaries. Any change of any stat
  means another hash: the per-file path above.
Unreadable files are reported in `problems` exactly as `load_records` reports them (same text).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import marshal
import os
import pickle
import sqlite3
import sys
import time
import weakref
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar, cast

import reconciler.domain.records
import reconciler.domain.verdicts
from reconciler import SCHEMA_DIR
from reconciler.adapters.cache_files import cache_file
from reconciler.adapters.closing import Closing
from reconciler.adapters.collector import collector_paused
from reconciler.adapters.record_files import (
    RecordCache,
    check_record_name,
    decode_record_text,
    git_blob_id,
    load_records,
    machine_record,
    parse_image_record,
    parse_machine_record,
    parse_machine_rows,
    parser_sources,
    prepare_machine_parse,
)
from reconciler.domain.records import (
    ENTRY_VALUE_FIELDS,
    IMAGES_DIR,
    MACHINES_DIR,
    BadMachine,
    BenchmarkEntry,
    EntryFacts,
    ImageSuspectRecord,
    InstanceVerdict,
    MachinePerf,
    MachineRecord,
    RecordError,
    RecordSet,
    RecordSummary,
    looks_like_machine_id,
    summarize,
)

#: Bump when what a parse stores changes for a reason the sources hashed into the version (`_version`) miss.
FORMAT = 10
_PLACEHOLDER = "\x00record-file\x00"
_PLACEHOLDER_FILE = Path(f"{_PLACEHOLDER}.yaml")
_NO_STAT = (0, 0, -1, 0, 0)  # the stat of a file that could not be stat()ed: equal to no indexed file's
_V = TypeVar("_V")
#: An entry's stored row (`BenchmarkEntry.field_values`) read by field name, as `summarize` reads entries.
_EntryValues = namedtuple("_EntryValues", ENTRY_VALUE_FIELDS)  # type: ignore[misc]
_tuple_new = tuple.__new__

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
  path TEXT PRIMARY KEY, dir TEXT NOT NULL, kind TEXT NOT NULL, dev INTEGER, ino INTEGER, size INTEGER,
  mtime_ns INTEGER, ctime_ns INTEGER, settled INTEGER NOT NULL, blob TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS files_dir ON files (dir);
CREATE TABLE IF NOT EXISTS blobs (
  blob TEXT NOT NULL, kind TEXT NOT NULL, problem TEXT, key TEXT, summary BLOB, data BLOB,
  PRIMARY KEY (blob, kind));
CREATE TABLE IF NOT EXISTS snapshots (
  dir TEXT NOT NULL, shown TEXT NOT NULL, token TEXT NOT NULL, listing BLOB NOT NULL, PRIMARY KEY (dir, shown));
CREATE TABLE IF NOT EXISTS aggregates (
  dir TEXT NOT NULL, shown TEXT NOT NULL, token TEXT NOT NULL, name TEXT NOT NULL, value BLOB NOT NULL,
  PRIMARY KEY (dir, shown, name));
"""


#: Every table of the index: a version change drops them all (aggregates of a snapshot whose listing is unchanged
#: would otherwise outlive the code that computed them).
_TABLES = ("meta", "files", "blobs", "snapshots", "aggregates")


def default_index_path(spec_dir: Path, cache_home: Path | None = None) -> Path:
    """`<git dir>/fleet/records.sqlite` of the checkout holding `spec_dir` (a worktree's own git dir), else
    `<cache_home>/gpu-fleet/records-<hash of the directory>.sqlite` (reconciler.adapters.cache_files)."""
    return cache_file(spec_dir, "records", ".sqlite", cache_home)


def _version() -> str:
    """What the stored rows depend on: the schemas, the code that parses a record and the code that summarises
    it (a change to `summarize` makes every stored summary stale: the index is started afresh)."""
    h = hashlib.sha256(f"{FORMAT}".encode())
    for name in ("machine-record.schema.json", "image-suspect.schema.json"):
        h.update((SCHEMA_DIR / name).read_bytes())
    for source in (*parser_sources(), Path(reconciler.domain.records.__file__ or ""),
                   Path(reconciler.domain.verdicts.__file__ or ""), Path(__file__)):
        h.update(source.read_bytes())
    return h.hexdigest()


class _Listed(NamedTuple):  # a tuple: 10,000 of them are made on every load
    path: str  # absolute
    file: str  # as the caller named it (problem texts name it so, like load_records)
    kind: str  # "m" | "i"
    stat: tuple[int, int, int, int, int]


@dataclass
class _Parsed:
    """One blob's parse, as stored: a problem, or (a machine record) its summary and its entries without
    evidence, or (an image record) the record."""

    problem: str | None
    key: str | None = None  # the machine id or the image digest
    summary: bytes | None = None  # marshal `_summary_row` (machines)
    data: bytes | None = None  # marshal (id, status, host, GPU, note, entries' field values) | pickle (images)
    #: The summary itself, when this process parsed the blob (the views need not decode the row).
    parsed_summary: RecordSummary | None = None


#: What reading and parsing files gives: their index rows, path -> blob, path -> read problem, the parsed blobs.
_ReadParsed = tuple[list[tuple[Any, ...]], dict[str, str], dict[str, str], dict[tuple[str, str], _Parsed]]


class StoredEvidence(Mapping[str, Any]):
    """An entry's evidence, read from its record file on first use (checked against the indexed blob id).
    `blob`, `index`: where it is (the record's blob, the entry's place in it)."""

    __slots__ = ("_source", "_value", "blob", "index")

    def __init__(self, source: _EvidenceSource, blob: str, index: int) -> None:
        self._source, self.blob, self.index = source, blob, index
        self._value: Mapping[str, Any] | None = None

    def _get(self) -> Mapping[str, Any]:
        if self._value is None:
            self._value = self._source.evidence(self.blob, self.index)
        return self._value

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __eq__(self, other: object) -> bool:
        return dict(self._get()) == other if isinstance(other, Mapping) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(dict(self._get()))

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:  # dataclasses.asdict deep-copies fields
        import copy

        return copy.deepcopy(dict(self._get()), memo)


class _EvidenceSource:
    """Re-reads a record file for its entries' evidence; keeps the last few parsed blobs."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}  # blob -> a file that had this content when the index was read
        self._docs: dict[str, list[Any]] = {}

    def evidence(self, blob: str, index: int) -> Mapping[str, Any]:
        entries = self._docs.get(blob)
        if entries is None:
            file = Path(self.files[blob])
            raw = file.read_bytes()
            if git_blob_id(raw) != blob:
                raise RecordError(f"{file}: changed while it was being read (the record was indexed as blob "
                                  f"{blob[:12]}); run the command again")
            record = parse_machine_record(decode_record_text(raw), file, check_name=False)
            entries = [dict(e.evidence) for e in record.benchmarks]
            if len(self._docs) >= 64:
                self._docs.pop(next(iter(self._docs)))
            self._docs[blob] = entries
        return entries[index]


class _SnapshotMemo:
    """The RecordSet's memo (domain.records.ViewMemo) for one snapshot: each aggregate the RecordSet computes is
    kept with the snapshot, so that the next command with the same files reads it in one row. `token` names the
    snapshot (None: no snapshot, nothing kept). Values are kept as pickle writes them, bad-machine views as
    rows (their entries' evidence stays in the record files)."""

    def __init__(self, index: RecordIndex, key: tuple[str, str], token: str | None) -> None:
        self._index, self._key, self._token = index, key, token

    def value(self, name: str, compute: Callable[[], _V]) -> _V:
        return self._kept(name, compute, lambda value: pickle.dumps(value, protocol=5), pickle.loads)

    def bad_machines(self, name: str, compute: Callable[[], list[BadMachine]]) -> list[BadMachine]:
        source = self._index._evidence

        def load(raw: bytes) -> list[BadMachine]:
            rows = marshal.loads(raw)  # noqa: S302 - our own index rows
            return [view for row in rows if (view := _bad_machine_of(row, source)) is not None]

        return self._kept(name, compute, lambda views: marshal.dumps([_bad_machine_row(b) for b in views]), load)

    def _kept(self, name: str, compute: Callable[[], _V], dump: Callable[[_V], bytes],
              load: Callable[[bytes], _V]) -> _V:
        db = self._index._db
        if self._token is not None:
            row = db.execute("SELECT value FROM aggregates WHERE dir = ? AND shown = ? AND name = ? AND token = ?",
                             (*self._key, name, self._token)).fetchone()
            if row is not None:
                return load(row[0])
        value = compute()
        if self._token is not None:
            # Another process writing: the next command keeps it instead.
            with contextlib.suppress(sqlite3.OperationalError):
                db.execute("INSERT OR REPLACE INTO aggregates VALUES (?,?,?,?,?)",
                           (*self._key, self._token, name, dump(value)))
        return value


class BuiltOnUse(Mapping[str, _V], Generic[_V]):
    """machine id -> a value built from the index on first access (its record, its summary); iterating values
    or items, or many single look-ups (`dict(records.machines)`), build them all in a few queries."""

    _SINGLE_LOOKUPS = 32

    def __init__(self, blobs: dict[str, str], build: Callable[[set[str]], dict[str, _V]]) -> None:
        self.blobs = blobs  # machine id -> blob id, in file-name order
        self._build = build  # blob ids -> blob id -> value
        self._built: dict[str, _V] = {}
        self._misses = 0

    def __getitem__(self, machine_id: str) -> _V:
        value = self._built.get(machine_id)
        if value is None:
            blob = self.blobs[machine_id]
            self._misses += 1
            if self._misses > self._SINGLE_LOOKUPS:
                self._build_all()
                return self._built[machine_id]
            value = self._build({blob})[blob]
            self._built[machine_id] = value
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.blobs)

    def __len__(self) -> int:
        return len(self.blobs)

    def __contains__(self, key: object) -> bool:
        return key in self.blobs

    def _build_all(self) -> None:
        if len(self._built) == len(self.blobs):
            return
        built = self._build({b for m, b in self.blobs.items() if m not in self._built})
        self._built = {m: self._built[m] if m in self._built else built[b] for m, b in self.blobs.items()}

    def many(self, machine_ids: list[str]) -> list[_V]:
        """The values of these machines, the missing ones built in one go."""
        missing = {self.blobs[m] for m in machine_ids if m not in self._built}
        if missing:
            built = self._build(missing)
            for m in machine_ids:
                if m not in self._built:
                    self._built[m] = built[self.blobs[m]]
        return [self._built[m] for m in machine_ids]

    def values(self) -> Any:
        self._build_all()
        return self._built.values()

    def items(self) -> Any:
        self._build_all()
        return self._built.items()


class RecordIndex(Closing):
    """The index of one spec directory's record files (see the module docstring). One thread at a time;
    several processes may share the file (SQLite locking; a writer that cannot get the lock skips storing
    and the next command stores instead). `parsed`, `hashed`, `reused`: counts of the last load."""

    RACY_NS = 2_000_000_000

    def __init__(self, path: Path, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.path = path
        self._clock_ns = clock_ns
        self._evidence = _EvidenceSource()
        self.rebuilt: str | None = None  # why the index was started afresh, if it was
        self.parsed = self.hashed = self.reused = 0
        self.from_snapshot = False  # the last load answered from a snapshot (every file's stat unchanged)
        self.split = False  # the last load read and parsed half of the files in a forked child
        self._fresh: dict[str, _Parsed] = {}  # machine blobs the last load parsed (perhaps not stored)
        self._db = self._open()
        _LIVE.add(self)

    @classmethod
    def for_spec_dir(cls, spec_dir: Path, **kw: Any) -> RecordIndex:
        return cls(default_index_path(spec_dir), **kw)

    # --- storage ----------------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:  # corrupt, not a database, wrong version: start afresh
            self.rebuilt = f"{self.path}: {exc}; rebuilt"
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            try:
                return self._connect()
            except (sqlite3.DatabaseError, OSError) as again:
                self.rebuilt = f"{self.path}: {again}; using an in-memory index"
                return self._connect(memory=True)
        except OSError as exc:  # unwritable directory: still answer, from memory
            self.rebuilt = f"{self.path}: {exc}; using an in-memory index"
            return self._connect(memory=True)

    def _connect(self, memory: bool = False) -> sqlite3.Connection:
        if not memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(":memory:" if memory else str(self.path), timeout=2.0, isolation_level=None)
        self._on_disk = not memory  # another process (a forked child) can store into it
        try:
            # 16 KiB pages for a new index: a row holds a record's entries (~2-5 KB), which 4 KiB pages spill
            # into overflow chains; a cold build of 10,000 records stores in ~40% less CPU.
            db.execute("PRAGMA page_size=16384")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            version = _version()
            has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone() is not None
            stored = db.execute("SELECT value FROM meta WHERE key='version'").fetchone() if has_meta else None
            if stored is None or stored[0] != version:
                db.executescript("".join(f"DROP TABLE IF EXISTS {table};" for table in _TABLES) + _SCHEMA)
                db.execute("INSERT INTO meta VALUES ('version', ?)", (version,))
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        self._db.close()

    # --- loading ----------------------------------------------------------------------------------------

    def load(self, spec_dir: str | Path) -> RecordSet:
        """The RecordSet of `spec_dir`, equal to `record_files.load_records(spec_dir)`."""
        with collector_paused():
            try:
                return self._load(Path(spec_dir))
            except sqlite3.DatabaseError as exc:  # the file went bad under us: rebuild and answer once more
                self._db.close()
                self.rebuilt = f"{self.path}: {exc}; rebuilt"
                for suffix in ("", "-wal", "-shm", "-journal"):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                self._db = self._open()
                return self._load(Path(spec_dir))

    def _load(self, spec_dir: Path) -> RecordSet:
        self.parsed = self.hashed = self.reused = 0
        self.from_snapshot = self.split = False
        self._fresh = {}
        problems: list[str] = []
        dir_key = os.path.abspath(spec_dir)
        # Nothing indexed for this directory (a cold build): every file will be read, and reading gives its
        # stat; the stat() of the listing only serves to compare with what the index knows.
        empty = self._db.execute("SELECT NOT EXISTS (SELECT 1 FROM files WHERE dir = ?) AND NOT EXISTS "
                                 "(SELECT 1 FROM snapshots WHERE dir = ?)", (dir_key, dir_key)).fetchone()[0]
        listed = self._list(spec_dir, problems, with_stat=not empty)
        stats = {item.path: item.stat for item in listed}
        snapshot_key = (dir_key, str(spec_dir))
        if not problems and not empty:
            answer = self._snapshot(snapshot_key, stats)
            if answer is not None:
                self.reused = len(listed)
                self.from_snapshot = True
                return answer
        # One query: what the index knows of each file (stat, blob) and of its blob (what it names, or why not).
        known = {} if empty else {row[0]: row[1:] for row in self._db.execute(
            "SELECT f.path, f.dev, f.ino, f.size, f.mtime_ns, f.ctime_ns, f.settled, f.blob, b.blob, b.problem, "
            "b.key FROM files f LEFT JOIN blobs b ON b.blob = f.blob AND b.kind = f.kind WHERE f.dir = ?",
            (dir_key,))}
        blob_of: dict[str, str] = {}
        stored: dict[tuple[str, str], tuple[Any, ...]] = {}
        reads: list[_Listed] = []
        for item in listed:
            row = known.get(item.path)
            # Unchanged and settled, and its blob still indexed (a pruned or unstored blob is read again).
            if row is not None and row[5] and row[:5] == item.stat and row[7] is not None:
                blob_of[item.path] = row[6]
                stored[(row[6], item.kind)] = row[8:]
                self.reused += 1
            else:
                reads.append(item)
        unstored: tuple[list[tuple[Any, ...]], dict[tuple[str, str], _Parsed]] | None = None
        if self._in_two_processes(len(reads)):
            # A cold build (or thousands of changed files): two processes each read, hash, parse and store a
            # share of the files.
            file_rows, read_blobs, read_problems, new, unstored = self._read_forked(reads, dir_key)
            blob_of.update(read_blobs)
        else:
            file_rows, read_blobs, read_problems, raw_of = self._read(reads, dir_key)
            blob_of.update(read_blobs)
            wanted = {(blob_of[i.path], i.kind) for i in reads if i.path in blob_of} - stored.keys()
            stored.update(self._names(wanted))
            todo: dict[tuple[str, str], bytes] = {}
            for item in reads:
                found = blob_of.get(item.path)
                if found is not None and (found, item.kind) not in stored:
                    todo.setdefault((found, item.kind), raw_of[item.path])
            new = {(blob, kind): self._parse(raw, kind, blob) for (blob, kind), raw in todo.items()}
        self.hashed = len(file_rows)
        self.parsed = len(new)
        self._fresh = {blob: parsed for (blob, kind), parsed in new.items() if kind == "m" and parsed.problem is None}
        listed_paths = {i.path for i in listed}
        rows_to_store, new_to_store = (file_rows, new) if unstored is None else unstored
        complete = self._store(dir_key, rows_to_store, [p for p in known if p not in listed_paths], new_to_store)
        for key, parsed in new.items():
            stored[key] = (parsed.problem, parsed.key)
        listing_problems = bool(problems)
        listing = self._assemble(listed, blob_of, stored, read_problems, problems)
        # A snapshot only of files that had settled when read (their stat then proves their content) and of
        # a listing with no problem: the next load with the same stats answers from it.
        settled_stats: dict[str, tuple[int, int, int, int, int]] | None = {}
        read = {row[0]: row for row in file_rows}
        for item in listed:
            row = read.get(item.path)
            if row is None and item.path in blob_of:  # reused: unchanged and settled
                settled_stats[item.path] = item.stat  # type: ignore[index]
            elif row is not None and row[8]:
                settled_stats[item.path] = tuple(row[3:8])  # type: ignore[index]
            else:
                settled_stats = None
                break
        token = None
        if complete and settled_stats is not None and not listing_problems and not read_problems:
            token = self._store_snapshot(snapshot_key, settled_stats, listing)
        return self._record_set(listing, snapshot_key, token)

    def _list(self, spec_dir: Path, problems: list[str], *, with_stat: bool = True) -> list[_Listed]:
        """The record files, by kind and name; `with_stat`: each with its stat (else a stat no file has)."""
        out = []
        for sub, kind in ((MACHINES_DIR, "m"), (IMAGES_DIR, "i")):
            directory = spec_dir / sub
            shown = str(directory)  # problem texts name files as load_records does: spec_dir / sub / name
            absolute = os.path.abspath(directory)
            try:
                with os.scandir(directory) as entries:
                    names = sorted(e.name for e in entries if e.name.endswith(".yaml"))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                problems.append(f"{directory}: cannot list records: {exc}")
                continue
            stat = os.stat
            if not with_stat:
                out += [_Listed(f"{absolute}/{name}", f"{shown}/{name}", kind, _NO_STAT) for name in names]
                continue
            for name in names:
                path = f"{absolute}/{name}"
                try:
                    st = stat(path)
                    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                except OSError:
                    key = _NO_STAT
                out.append(_Listed(path, f"{shown}/{name}", kind, key))
        return out

    def _names(self, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], tuple[Any, ...]]:
        """(blob, kind) -> (problem, machine id or image digest) of these blobs, where the index has them."""
        out: dict[tuple[str, str], tuple[Any, ...]] = {}
        blobs = sorted({blob for blob, _ in wanted})
        for start in range(0, len(blobs), 500):
            chunk = blobs[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._db.execute(f"SELECT blob, kind, problem, key FROM blobs WHERE blob IN ({marks})",  # noqa: S608
                                        chunk):
                if (row[0], row[1]) in wanted:
                    out[(row[0], row[1])] = row[2:]
        return out

    def _read_each(self, items: list[_Listed], dir_key: str, file_rows: list[tuple[Any, ...]], blob_of: dict[str, str],
                   read_problems: dict[str, str]) -> Iterator[tuple[_Listed, bytes, str]]:
        """Read and hash these files one at a time: each file's index row goes to `file_rows` and its blob id to
        `blob_of` (a file that cannot be read: its problem to `read_problems`); yields (item, bytes, blob id)."""
        clock, racy = self._clock_ns, self.RACY_NS
        for item in items:
            path = item.path
            read_at = clock()
            try:
                st, raw = _read_file(path)
            except OSError as exc:
                read_problems[path] = f"{item.file}: cannot read: {exc}"
                continue
            blob = git_blob_id(raw)
            blob_of[path] = blob
            settled = int(max(st.st_mtime_ns, st.st_ctime_ns) < read_at - racy)
            file_rows.append((path, dir_key, item.kind, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                              st.st_ctime_ns, settled, blob))
            yield item, raw, blob

    def _read(self, items: list[_Listed], dir_key: str
              ) -> tuple[list[tuple[Any, ...]], dict[str, str], dict[str, str], dict[str, bytes]]:
        """Read and hash these files: their index rows, path -> blob, path -> read problem, path -> bytes."""
        file_rows: list[tuple[Any, ...]] = []
        blob_of: dict[str, str] = {}
        read_problems: dict[str, str] = {}
        raw_of = {item.path: raw for item, raw, _ in self._read_each(items, dir_key, file_rows, blob_of,
                                                                      read_problems)}
        return file_rows, blob_of, read_problems, raw_of

    def _read_and_parse(self, items: list[_Listed], dir_key: str) -> _ReadParsed:
        """`_read`, then every distinct blob read parsed (the bulk path: no look-up of blobs already indexed).
        Each file is parsed right after it is read, while its bytes are in the CPU's cache, and not kept."""
        file_rows: list[tuple[Any, ...]] = []
        blob_of: dict[str, str] = {}
        read_problems: dict[str, str] = {}
        new: dict[tuple[str, str], _Parsed] = {}
        parse = self._parse
        for item, raw, blob in self._read_each(items, dir_key, file_rows, blob_of, read_problems):
            key = (blob, item.kind)
            if key not in new:
                new[key] = parse(raw, item.kind, blob)
        return file_rows, blob_of, read_problems, new

    #: This many files to read or more (a cold build) are read, hashed, parsed and stored in two processes...
    PARALLEL_FROM = 2000
    #: ...if True (the caller knows its process has no other thread); if None, whenever the machine has two
    #: cores or more and this process runs one thread. Also on a busy machine: the split adds almost no work
    #: (the child hands back only summary columns, each process stores its own share), so two processes get
    #: more of the contended cores than one. Measured on 2 cores, cold `fleet records`, 10,000 files, forked /
    #: one process: 1.53-1.71 / 2.30-2.38 s (others' load ~1.3), 1.86-1.97 / 2.04-2.73 s with one busy loop
    #: running beside it, 2.73-3.12 / 2.87-3.86 s with two.
    parallel: bool | None = None

    def _in_two_processes(self, files: int) -> bool:
        if files < self.PARALLEL_FROM or not hasattr(os, "fork") or self.parallel is False:
            return False
        if self._file_open_elsewhere_here():
            return False
        if self.parallel:
            return True
        # Only from a process with one thread: a lock another thread holds at the fork (inside SQLite, say)
        # would stay locked forever in the child.
        threading = sys.modules.get("threading")
        if threading is not None and threading.active_count() > 1:
            return False
        return (os.cpu_count() or 1) >= 2

    def _file_open_elsewhere_here(self) -> bool:
        """Another index object of this process has a connection open to the same file. SQLite keeps its lock
        bookkeeping per process, per file: a child forked while such a connection is open inherits it and
        would take locks it does not hold (so the split is made only when this object's connection, closed
        before the fork, is the process's only one)."""
        mine = os.path.abspath(self.path)
        for other in list(_LIVE):
            if other is self or not other._on_disk or os.path.abspath(other.path) != mine:
                continue
            try:
                other._db.total_changes  # noqa: B018 - raises on a closed connection
            except sqlite3.ProgrammingError:
                continue
            return True
        return False

    #: The share of the files the child takes: it also stores its share before it answers, while the parent,
    #: which stores its own share after that, parses a little more (with the parse ~5x the store, ~0.45 has
    #: both finish together).
    CHILD_SHARE = 0.45

    def _read_forked(self, items: list[_Listed], dir_key: str
                     ) -> tuple[list[tuple[Any, ...]], dict[str, str], dict[str, str], dict[tuple[str, str], _Parsed],
                                tuple[list[tuple[Any, ...]], dict[tuple[str, str], _Parsed]]]:
        """`_read_and_parse` over two processes: a forked child reads, hashes, parses and stores (its own SQLite
        connection, its own transaction) a share of the files, then hands back their index rows and summary
        columns (marshal), not the stored entries; the parent does the rest meanwhile. Returns what
        `_read_and_parse` returns for all files, plus the rows and blobs the parent has still to store (the
        child's too if it could not store them: an in-memory index, the write lock held elsewhere). If the
        child fails, its share is done here.

        SQLite connections must not cross a fork: the parent closes its connection before forking and opens
        a new one after, and the child opens its own."""
        cut = int(len(items) * self.CHILD_SHARE)
        theirs, mine = items[:cut], items[cut:]
        prepare_machine_parse(evidence=False)  # once, before the fork: not in each process
        on_disk = self._on_disk
        read_end, write_end = os.pipe()
        if on_disk:
            self._db.close()
        try:
            pid = os.fork()
        except OSError:  # no fork (out of processes or memory): all here
            os.close(read_end)
            os.close(write_end)
            pid = None
        if pid == 0:  # the child: its share, stored, sent as plain values; leave without running any cleanup
            code = 1
            try:
                os.close(read_end)
                rows, blobs, problems, done = self._read_and_parse(theirs, dir_key)
                stored = on_disk and self._store_from_child(dir_key, rows, done)
                sent = (stored, rows, blobs, problems,
                        [(key, p.problem, p.key, p.summary, None if stored else p.data) for key, p in done.items()])
                with os.fdopen(write_end, "wb") as sink:
                    sink.write(marshal.dumps(sent))
                code = 0
            finally:
                os._exit(code)
        if on_disk:
            self._db = self._open()
        if pid is None:  # no fork: all here
            rows, blobs, problems, new = self._read_and_parse(items, dir_key)
            return rows, blobs, problems, new, (rows, new)
        os.close(write_end)
        try:
            file_rows, blob_of, read_problems, new = self._read_and_parse(mine, dir_key)
        finally:
            with os.fdopen(read_end, "rb") as pipe:
                data = pipe.read()
            _, status = os.waitpid(pid, 0)
        try:
            got = marshal.loads(data) if os.waitstatus_to_exitcode(status) == 0 else None  # noqa: S302 - our child
        except (EOFError, ValueError, TypeError):
            got = None
        self.split = got is not None
        to_store_rows, to_store = list(file_rows), dict(new)
        if got is None:  # the child failed: its share here
            got_stored = False
            got_rows, got_blobs, got_problems, got_parsed = self._read_and_parse(theirs, dir_key)
        else:
            got_stored, got_rows, got_blobs, got_problems, parsed_rows = got
            got_parsed = {tuple(key): _Parsed(*values) for key, *values in parsed_rows}
        if not got_stored:
            to_store_rows += got_rows
            for key, parsed in got_parsed.items():
                to_store.setdefault(key, parsed)
        for key, theirs_parsed in got_parsed.items():
            new.setdefault(key, theirs_parsed)
        return (got_rows + file_rows, {**got_blobs, **blob_of}, {**got_problems, **read_problems}, new,
                (to_store_rows, to_store))

    def _store_from_child(self, dir_key: str, file_rows: list[tuple[Any, ...]],
                          new: dict[tuple[str, str], _Parsed]) -> bool:
        """In the forked child: store its share through a connection of its own (never the parent's)."""
        try:
            db = sqlite3.connect(str(self.path), timeout=2.0, isolation_level=None)
        except sqlite3.Error:
            return False
        try:
            db.execute("PRAGMA synchronous=NORMAL")  # as the parent's connection (_connect): no fsync per commit
            return _store_rows(db, file_rows, [], new, prune=False)
        except sqlite3.Error:
            return False

    def _parse(self, raw: bytes, kind: str, blob: str) -> _Parsed:
        placeholder = _PLACEHOLDER_FILE
        try:
            text = decode_record_text(raw)
            if kind == "i":
                img = parse_image_record(text, placeholder)
                return _Parsed(None, key=img.image_digest, data=pickle.dumps(img, protocol=5))
            doc, rows = parse_machine_rows(text, placeholder, evidence=False)
        except (RecordError, UnicodeDecodeError, TypeError) as exc:
            message = str(exc) if isinstance(exc, RecordError) else f"{placeholder}: cannot read: {exc}"
            return _Parsed(message)
        record = machine_record(doc, ())
        source, values = self._evidence, _EntryValues

        def entry(i: int) -> BenchmarkEntry:
            return BenchmarkEntry.from_field_values(rows[i], StoredEvidence(source, blob, i))

        # The rows read by field name, without building an entry of each (only of the two the summary keeps).
        summary = summarize(record, cast(list[EntryFacts], [_tuple_new(values, row) for row in rows]), entry)
        data = marshal.dumps((record.machine_id, record.status, record.host_id, record.gpu_name, record.note,
                              tuple(rows)))
        return _Parsed(None, key=record.machine_id, summary=marshal.dumps(_summary_row(summary)), data=data,
                       parsed_summary=summary)

    def _store(self, dir_key: str, file_rows: list[tuple[Any, ...]], gone: list[str],
               new: dict[tuple[str, str], _Parsed]) -> bool:
        """Store the new blobs and file rows; False if another process held the write lock (nothing stored)."""
        return _store_rows(self._db, file_rows, gone, new, prune=True)

    def _assemble(self, listed: list[_Listed], blob_of: dict[str, str],
                  stored: dict[tuple[str, str], tuple[Any, ...]], read_problems: dict[str, str],
                  problems: list[str]) -> tuple[Any, ...]:
        """What a RecordSet is built from, in plain values (marshal stores it as a snapshot): problems,
        unreadable machine ids, machines [(id, blob, file)], image blobs."""
        machines: list[tuple[str, str, str]] = []
        image_blobs: list[str] = []
        unreadable: set[str] = set()
        for item in listed:
            is_machine = item.kind == "m"
            stem = item.file.rsplit("/", 1)[-1][:-5]
            if item.path in read_problems:
                problems.append(read_problems[item.path])
                if is_machine and looks_like_machine_id(stem):
                    unreadable.add(stem)
                continue
            blob = blob_of[item.path]
            problem, key = stored[(blob, item.kind)]
            if problem is None and is_machine and key != stem:
                try:
                    check_record_name(key, Path(item.file))
                except RecordError as exc:
                    problem = str(exc)
            if problem is not None:
                problems.append(problem.replace(_PLACEHOLDER + ".yaml", item.file))
                if is_machine and looks_like_machine_id(stem):
                    unreadable.add(stem)
                continue
            if is_machine:
                machines.append((key, blob, item.file))
            else:
                image_blobs.append(blob)
        return (problems, sorted(unreadable), machines, image_blobs)

    def _record_set(self, listing: tuple[Any, ...], snapshot_key: tuple[str, str], token: str | None) -> RecordSet:
        problems, unreadable, machine_rows, image_blobs = listing
        machines: dict[str, str] = {}
        files = self._evidence.files
        for mid, blob, file in machine_rows:
            machines[mid] = blob
            files[blob] = file
        images: dict[str, ImageSuspectRecord] = {}
        if image_blobs:
            marks = ",".join("?" * len(image_blobs))
            loaded = {b: pickle.loads(d) for b, d in self._db.execute(  # noqa: S301 - our own index rows
                f"SELECT blob, data FROM blobs WHERE kind = 'i' AND blob IN ({marks})", image_blobs)}  # noqa: S608
            for blob in image_blobs:
                img = loaded[blob]
                images[img.image_digest] = img
        return RecordSet(BuiltOnUse(machines, self._build_machines), images, tuple(problems), frozenset(unreadable),
                         summaries=BuiltOnUse(machines, self._summaries_of),
                         memo=_SnapshotMemo(self, snapshot_key, token))

    # --- snapshots: the listing of one unchanged set of files, and the aggregates kept with it -------------------

    def _snapshot(self, key: tuple[str, str], stats: dict[str, tuple[int, int, int, int, int]]) -> RecordSet | None:
        """The RecordSet of the snapshot stored for exactly these files with exactly these stats, if any."""
        token = _stats_token(stats)
        row = self._db.execute("SELECT listing FROM snapshots WHERE dir = ? AND shown = ? AND token = ?",
                               (*key, token)).fetchone()
        if row is None:
            return None
        return self._record_set(marshal.loads(row[0]), key, token)  # noqa: S302 - our own index rows

    def _store_snapshot(self, key: tuple[str, str], stats: dict[str, tuple[int, int, int, int, int]],
                        listing: tuple[Any, ...]) -> str | None:
        token = _stats_token(stats)
        try:
            self._db.execute("INSERT OR REPLACE INTO snapshots VALUES (?,?,?,?)", (*key, token, marshal.dumps(listing)))
        except sqlite3.OperationalError:  # another process is writing: the next command stores it
            return None
        with contextlib.suppress(sqlite3.OperationalError):  # those of the listing it replaced (never read again)
            self._db.execute("DELETE FROM aggregates WHERE dir = ? AND shown = ? AND token != ?", (*key, token))
        return token

    def _stored(self, column: str, blobs: list[str]) -> dict[str, Any]:
        """blob -> a machine blob's stored `column` (summary, data), in chunked queries."""
        assert column in ("summary", "data")
        out: dict[str, Any] = {}
        for start in range(0, len(blobs), 500):
            chunk = blobs[start:start + 500]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT blob, {column} FROM blobs WHERE kind = 'm' AND blob IN ({marks})"  # noqa: S608
            out.update(self._db.execute(query, chunk).fetchall())
        return out

    def _summaries_of(self, blobs: set[str]) -> dict[str, RecordSummary]:
        """The summaries of these machine blobs: those the last load parsed here as they are, the rest read
        back from their stored rows (a blob the last load parsed but could not store: from its row in memory)."""
        out: dict[str, RecordSummary] = {}
        rows: dict[str, bytes] = {}
        for blob in blobs:
            parsed = self._fresh.get(blob)
            if parsed is None:
                continue
            if parsed.parsed_summary is not None:
                out[blob] = parsed.parsed_summary
            elif parsed.summary is not None:
                rows[blob] = parsed.summary
        rows.update(self._stored("summary", [b for b in blobs if b not in out and b not in rows]))
        source, loads = self._evidence, marshal.loads
        with collector_paused():
            for blob, row in rows.items():
                out[blob] = _summary_of(loads(row), source)
        return out

    def _build_machines(self, blobs: set[str]) -> dict[str, MachineRecord]:
        """The MachineRecords of these blobs, from their stored rows. A reconcile pass builds all 10,000 (100,000
        entries): the GC is paused for it, and each entry is built from its field values in one go
        (`BenchmarkEntry.from_field_values`), its evidence read from the file on use."""
        out: dict[str, MachineRecord] = {}
        source, entry = self._evidence, BenchmarkEntry.from_field_values
        with collector_paused():
            rows = self._stored("data", list(blobs))
            for blob in blobs - rows.keys():  # parsed by the last load but not stored (the write lock was held)
                parsed = self._fresh.get(blob)
                if parsed is not None and parsed.data is not None:
                    rows[blob] = parsed.data
            for blob, data in rows.items():
                mid, status, host_id, gpu_name, note, entries = marshal.loads(data)  # noqa: S302 - our own index rows
                out[blob] = MachineRecord(mid, status=status, host_id=host_id, gpu_name=gpu_name, note=note,
                                          benchmarks=tuple(entry(e, StoredEvidence(source, blob, i))
                                                           for i, e in enumerate(entries)))
        return out



#: Every RecordIndex of this process (see RecordIndex._file_open_elsewhere_here).
_LIVE: weakref.WeakSet[RecordIndex] = weakref.WeakSet()


def _store_rows(db: sqlite3.Connection, file_rows: list[tuple[Any, ...]], gone: list[str],
                new: dict[tuple[str, str], _Parsed], *, prune: bool) -> bool:
    """Store new blobs and file rows in one transaction; False if another process held the write lock (nothing
    stored). `prune`: drop the blobs no file has any more when they have piled up."""
    if not file_rows and not gone and not new:
        return True
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:  # another process is writing: it or the next command stores
        return False
    try:
        db.executemany("INSERT OR REPLACE INTO blobs VALUES (?,?,?,?,?,?)",
                       [(blob, kind, p.problem, p.key, p.summary, p.data) for (blob, kind), p in new.items()])
        db.executemany("INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?,?,?,?,?)", file_rows)
        db.executemany("DELETE FROM files WHERE path = ?", [(p,) for p in gone])
        if prune:
            blobs, files = (db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("blobs", "files"))  # noqa: S608
            if blobs > 2 * files + 1000:  # contents no file has any more (old versions, other branches)
                db.execute("DELETE FROM blobs WHERE blob NOT IN (SELECT blob FROM files)")
                db.execute("DELETE FROM snapshots")  # none may name a blob that is gone
                db.execute("DELETE FROM aggregates")
        db.execute("COMMIT")
    except sqlite3.OperationalError:
        db.execute("ROLLBACK")
        return False
    return True


def _read_file(path: str) -> tuple[os.stat_result, bytes]:
    """The file's stat (taken before reading) and its bytes: plain os calls, no buffered file object (a third
    of the cost of reading 10,000 small files)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        data = os.read(fd, st.st_size + 1)
        if len(data) != st.st_size:  # grew or shrank since the stat, or a short read: read to the end
            parts = [data]
            while chunk := os.read(fd, 1 << 20):
                parts.append(chunk)
            data = b"".join(parts)
        return st, data
    except OSError as exc:  # named as open() names it (a directory fails at the read): the problem texts match
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, path) from None
        raise
    finally:
        os.close(fd)


def _stats_token(stats: dict[str, tuple[int, int, int, int, int]]) -> str:
    """Names one listing: every file's path and (device, inode, size, mtime, ctime), in listing order."""
    return hashlib.sha1(repr(stats).encode(), usedforsecurity=False).hexdigest()


# --- the stored form of a summary (marshal rows): what the domain computed, written and read back field by field


def _summary_row(summary: RecordSummary) -> tuple[Any, ...]:
    """The summary as marshal stores it; its verdicts (most of its bytes) marshalled apart, decoded on use."""
    perf = summary.perf
    return (summary.machine_id, summary.status, summary.gpu_name,
            None if perf is None else (perf.machine_id, perf.gpu_name, perf.samples, perf.median_proofs_per_hour,
                                       perf.last_proofs_per_hour),
            summary.last_price, summary.marks, marshal.dumps(tuple(summary.verdicts)),
            _bad_machine_row(summary.listed))


def _summary_of(row: tuple[Any, ...], source: _EvidenceSource) -> RecordSummary:
    machine_id, status, gpu_name, perf, last_price, marks, verdicts, listed = row
    return RecordSummary(machine_id, status, gpu_name, None if perf is None else MachinePerf(*perf), last_price,
                         marks, _StoredVerdicts(verdicts), _bad_machine_of(listed, source))


class _StoredVerdicts(Sequence[InstanceVerdict]):
    """A stored summary's verdicts, decoded on first use: most loads aggregate 10,000 summaries without reading
    them (a view reads those of the instances it shows)."""

    __slots__ = ("_raw", "_value")

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self._value: tuple[InstanceVerdict, ...] | None = None

    def _get(self) -> tuple[InstanceVerdict, ...]:
        if self._value is None:
            self._value = marshal.loads(self._raw)  # noqa: S302 - our own index rows
        return self._value

    def __getitem__(self, index: Any) -> Any:
        return self._get()[index]

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[InstanceVerdict]:
        return iter(self._get())

    def __eq__(self, other: object) -> bool:
        return self._get() == tuple(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._get())


def _bad_machine_row(view: BadMachine | None) -> tuple[Any, ...] | None:
    if view is None:
        return None
    return (view.machine_id, view.host_id, view.gpu_name, view.note, _entry_row(view.marking), _entry_row(view.last),
            view.status)


def _bad_machine_of(row: tuple[Any, ...] | None, source: _EvidenceSource) -> BadMachine | None:
    if row is None:
        return None
    machine_id, host_id, gpu_name, note, marking, last, status = row
    return BadMachine(machine_id, host_id, gpu_name, note, _entry_of(marking, source), _entry_of(last, source), status)


def _entry_row(entry: BenchmarkEntry | None) -> tuple[Any, ...] | None:
    """(blob, place in the record, field values) of an entry this index built (its evidence says where it is)."""
    if entry is None:
        return None
    evidence = entry.evidence
    if not isinstance(evidence, StoredEvidence):
        raise TypeError(f"entry {entry.instance_id}: not built by the record index (its evidence is not stored)")
    return evidence.blob, evidence.index, entry.field_values()


def _entry_of(row: tuple[Any, ...] | None, source: _EvidenceSource) -> BenchmarkEntry | None:
    if row is None:
        return None
    blob, index, values = row
    return BenchmarkEntry.from_field_values(values, StoredEvidence(source, blob, index))


def read_evidence(records: Iterable[MachineRecord]) -> None:
    """Reads now the evidence the entries of `records` would read from their files on first use (`StoredEvidence`):
    a caller that will read all of it reads it at a moment that suits it (the what-if, while git lists the window's
    commits, and once, before it forks). Each record file is read and checked once."""
    for rec in records:
        for entry in rec.benchmarks:
            if isinstance(entry.evidence, StoredEvidence):
                entry.evidence._get()


def load_indexed(spec_dir: str | Path, index: RecordIndex | None = None) -> RecordSet:
    """`load_records` through the record index of `spec_dir` (opened here unless given)."""
    if index is not None:
        return index.load(spec_dir)
    # Not closed here: the RecordSet builds machine records from it on demand (closed with the process).
    return RecordIndex.for_spec_dir(Path(spec_dir)).load(spec_dir)


def load_for_pass(spec_dir: str | Path, cache: RecordCache | None) -> RecordSet:
    """The records a reconcile pass judges against, equal to `load_records(spec_dir, cache)`.

    A pass needs every machine record built (decide and the directives walk them all). A long-running loop
    keeps them in its `RecordCache` and re-reads only changed files; but its first pass (a restart, or
    `--once`) would parse every file in full, ~3.5 s per 10,000 records. That pass loads through the record
    index instead (a restarted loop finds it as its last first pass or the last read-only command left it,
    and parses only what changed since; with no index yet, a cold build), and primes the cache with what it
    built: the next pass reads each file once to check it is still the blob indexed, parses none, and stats
    only from then on."""
    spec_dir = Path(spec_dir)
    if cache is not None and cache.started:
        return load_records(spec_dir, cache)
    # Not closed here: the RecordSet's derived views (perf rows, marks) are read from it on first use.
    index = RecordIndex.for_spec_dir(spec_dir)
    records = index.load(spec_dir)
    if cache is None:  # `--once`: decide builds the records it walks
        return records
    machines = records.machines
    with collector_paused():  # as load_records: 10,000 records that all stay alive
        blobs = machines.blobs if isinstance(machines, BuiltOnUse) else {}
        cache.prime(spec_dir, {mid: (blobs[mid], rec) for mid, rec in machines.items() if mid in blobs})
        # The loop keeps them for its lifetime: out of the collector's generations (see load_records).
        gc.freeze()
    return records
