"""Record files under `fleet-spec/`: `machines/<machine_id>.yaml` and `images/<digest-hex>.yaml`.

Parses (the usual entry lines decoded and schema-checked by msgspec, record_codec; anything else libyaml + JSON
Schema) and renders the records of `reconciler.domain.records`, loads a whole spec
directory into a `RecordSet` (with a stat-keyed cache for the long-running loop), and writes files
atomically. Git is elsewhere (`reconciler.adapters.git`).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from dataclasses import fields as dataclass_fields
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from reconciler import SCHEMA_DIR
from reconciler.adapters import record_codec
from reconciler.adapters.collector import collector_paused
from reconciler.adapters.yaml_library import yaml_library
from reconciler.domain.records import (
    IMAGES_DIR,
    MACHINES_DIR,
    BenchmarkEntry,
    ImageSuspectRecord,
    MachineRecord,
    RecordError,
    RecordSet,
    check_image_digest,
    check_machine_id,
    looks_like_machine_id,
)

if TYPE_CHECKING:
    import jsonschema

# --- files ---------------------------------------------------------------------------------------------

# libyaml parses and emits a 17 KB record ~8x faster than pure-Python PyYAML; the results are the same
# documents (and, for what the reconciler writes, the same text). Pure Python stays the fallback for a PyYAML
# built without libyaml. PyYAML is imported on first use (adapters/yaml_library.py).


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    import jsonschema  # ~0.1 s to import: only when a record fails the compiled check (for the messages)

    return jsonschema.Draft202012Validator(json.loads((SCHEMA_DIR / name).read_text()))


@cache
def _fast_check(name: str) -> Callable[[Any], bool] | None:
    """The schema compiled once into a plain check (None if it uses a keyword the compiler lacks)."""
    return record_codec.compile_schema(json.loads((SCHEMA_DIR / name).read_text()))




def parser_sources() -> tuple[Path, ...]:
    """The source files whose code decides what parsing a record gives (this module and the codec): a store of
    parsed records is stale when one of them changes."""
    return Path(__file__), Path(record_codec.__file__ or "")


def machine_record_path(spec_dir: Path, machine_id: str) -> Path:
    return spec_dir / MACHINES_DIR / f"{check_machine_id(machine_id)}.yaml"


def image_record_path(spec_dir: Path, digest: str) -> Path:
    return spec_dir / IMAGES_DIR / f"{check_image_digest(digest).removeprefix('sha256:')}.yaml"


_HEADER = "# Written by the fleet reconciler. Pardon: set status: pardoned (or delete this file) in a PR.\n"


def _dump(doc: dict[str, Any]) -> str:
    return record_codec.dump_yaml(doc)


def render_machine_record(record: MachineRecord) -> str:
    """The record file: its own fields as block YAML, then one benchmark entry per line (record_codec)."""
    return record_codec.render_record(_HEADER, record.to_yaml_dict())


def render_image_record(record: ImageSuspectRecord) -> str:
    header = "# Written by the fleet reconciler (circuit breaker). Clear: set status: cleared in a PR.\n"
    return header + _dump(record.to_yaml_dict())


def _schema_errors(doc: Any, schema: str, file: Path) -> list[str]:
    fast = _fast_check(schema)
    if fast is not None and fast(doc):  # equal to jsonschema's is_valid (tests/unit/test_record_codec.py)
        return []
    out = []
    for err in sorted(_validator(schema).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        out.append(f"{file}: {path}: {err.message}")
    return out


def _load_yaml(text: str, file: Path) -> Any:
    """The YAML document in `text`, or RecordError naming the file (never another exception)."""
    try:
        return record_codec.parse_fast(text)
    except record_codec.NotFast:
        pass
    yaml, loader, _ = yaml_library()
    try:
        _refuse_aliases(text, file)
        return yaml.load(text, Loader=loader)
    except RecordError:
        raise
    except yaml.YAMLError as exc:
        raise RecordError(f"{file}: not valid YAML: {exc}") from None
    except RecursionError:
        raise RecordError(f"{file}: not valid YAML: nested too deeply") from None
    except (ValueError, IndexError, TypeError, AttributeError, OverflowError) as exc:  # bad explicit tags
        raise RecordError(f"{file}: not valid YAML: {type(exc).__name__}: {exc}") from None


def _refuse_aliases(text: str, file: Path) -> None:
    """RecordError if the text uses a YAML anchor or alias.

    Aliases let a few hundred bytes expand into gigabytes (an "alias bomb") in every reader of the records;
    the reconciler never writes them, so a record that has one came from a hand edit and is refused before
    anything expands. An alias needs a `*` and an anchor a `&`: most records have neither, so the event scan
    (as costly as the load itself) runs only when one of them appears somewhere in the text.
    """
    if "*" not in text and "&" not in text:
        return
    yaml, loader, _ = yaml_library()
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            found = f"*{event.anchor}"
        elif isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            found = f"&{event.anchor}"
        else:
            continue
        line = f"line {event.start_mark.line + 1}: " if event.start_mark is not None else ""
        raise RecordError(f"{file}: {line}YAML anchors and aliases are not allowed in a record (found {found}); "
                          "write the values out")


def parse_machine_record(text: str, file: Path, *, check_name: bool = True) -> MachineRecord:
    """The record in `text` (read from `file`). `check_name=False`: the caller checks the file name itself
    (`check_record_name`), as the record index does (it parses a blob once for whatever name it has)."""
    doc, rows = parse_machine_rows(text, file)
    if check_name:
        check_record_name(doc["machine_id"], file)
    return machine_record(doc, tuple(BenchmarkEntry(*row) for row in rows))


def machine_record(doc: Mapping[str, Any], entries: tuple[BenchmarkEntry, ...]) -> MachineRecord:
    """The record of a document `parse_machine_rows` gave (its own fields), with these entries."""
    return MachineRecord(machine_id=doc["machine_id"], status=doc["status"], host_id=_str_or_none(doc.get("host_id")),
                         gpu_name=doc.get("gpu_name"), note=doc.get("note"), benchmarks=entries)


#: BenchmarkEntry's fields with what an entry that omits one gets (a callable: a factory), in field order.
ENTRY_FIELDS: tuple[tuple[str, Any], ...] = tuple(
    (f.name, f.default_factory if f.default_factory is not MISSING else (None if f.default is MISSING else f.default))
    for f in dataclass_fields(BenchmarkEntry))
_MACHINE_SCHEMA = "machine-record.schema.json"


@cache
def _entry_decoder(evidence: bool) -> record_codec.EntryDecoder | None:
    schema = json.loads((SCHEMA_DIR / _MACHINE_SCHEMA).read_text())
    items = schema.get("properties", {}).get(record_codec.ENTRIES_KEY, {}).get("items", {})
    ref = items.get("$ref") if set(items) == {"$ref"} else None
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    return record_codec.entry_decoder(schema, ref, list(ENTRY_FIELDS), raw_field=None if evidence else "evidence")


def prepare_machine_parse(*, evidence: bool = True) -> None:
    """Build now what parsing machine records builds on first use (msgspec imported, the entry decoder, the
    compiled check, the codec's regexes): a caller about to fork parse workers builds it once, not per
    process."""
    _entry_decoder(evidence)
    _fast_check(_MACHINE_SCHEMA)
    record_codec.compile_lazy_patterns()


def parse_machine_rows(text: str, file: Path, *, evidence: bool = True) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """The schema-checked record in `text`: its own fields (machine_id as a string; `benchmarks` left out) and
    its entries as tuples in BenchmarkEntry field order (`BenchmarkEntry(*row)`), or RecordError.
    `evidence=False`: the tuples lack the evidence field (it is checked to be an object, not decoded).

    A record as the reconciler writes it is decoded and checked by msgspec (from the schema, one call per entry
    line); any other text - a hand edit in block YAML, an entry the schema refuses - takes the YAML/stdlib path
    and the compiled check, with jsonschema's messages for what is wrong."""
    decoder = _entry_decoder(evidence)
    if decoder is not None:
        try:
            own, body = record_codec.split_entries(text)
        except record_codec.NotFast:
            pass
        else:
            rows = decoder.decode_entries(body)
            if rows is not None:
                if isinstance(own.get("machine_id"), int):
                    own["machine_id"] = str(own["machine_id"])
                fast = _fast_check(_MACHINE_SCHEMA)
                if fast is not None and fast({**own, record_codec.ENTRIES_KEY: []}):
                    return own, rows
    doc = parse_machine_doc(text, file)
    entries = doc.pop(record_codec.ENTRIES_KEY)
    defaults = ENTRY_FIELDS if evidence else tuple(f for f in ENTRY_FIELDS if f[0] != "evidence")
    return doc, [tuple(e[name] if name in e else (d() if callable(d) else d) for name, d in defaults)
                 for e in entries]


def parse_machine_doc(text: str, file: Path) -> dict[str, Any]:
    """The schema-checked document of a machine record (machine_id as a string), or RecordError."""
    doc = _load_yaml(text, file)
    if isinstance(doc, dict) and isinstance(doc.get("machine_id"), int):
        doc["machine_id"] = str(doc["machine_id"])
    errors = _schema_errors(doc, _MACHINE_SCHEMA, file)
    if errors:
        raise RecordError("; ".join(errors))
    return cast(dict[str, Any], doc)


def check_record_name(machine_id: str, file: Path) -> None:
    if file.stem != machine_id:
        raise RecordError(f"{file}: $.machine_id: {machine_id!r} does not match the file name {file.name!r}")


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


def parse_image_record(text: str, file: Path) -> ImageSuspectRecord:
    doc = _load_yaml(text, file)
    errors = _schema_errors(doc, "image-suspect.schema.json", file)
    if errors:
        raise RecordError("; ".join(errors))
    return ImageSuspectRecord(
        image_digest=doc["image_digest"], signature=doc["signature"], status=doc["status"],
        machines=tuple(doc["machines"]), tripped_at=doc["tripped_at"], pools=tuple(doc.get("pools", ())),
        instances=tuple(doc.get("instances", ())), reason=doc.get("reason", ""), note=doc.get("note"))


_Record = TypeVar("_Record", MachineRecord, ImageSuspectRecord)
_StatKey = tuple[int, int, int, int, int]


def _stat_key(st: os.stat_result) -> _StatKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def git_blob_id(raw: bytes) -> str:
    """The id git gives these bytes as a blob (`git hash-object`), without running git."""
    digest = hashlib.sha1(b"blob %d\x00" % len(raw), usedforsecurity=False)
    digest.update(raw)  # not concatenated first: that copied every record once more
    return digest.hexdigest()


@dataclass(frozen=True)
class _Cached:
    key: _StatKey | None  # None: primed from the record index, not stat()ed by this cache yet
    digest: str  # the git blob id of the content the record was parsed from
    record: MachineRecord | ImageSuspectRecord
    settled: bool  # last changed well before it was read: an unchanged stat key proves unchanged content


class RecordCache:
    """Parsed records kept between passes of one long-running process (`fleet reconcile`'s loop).

    A pass parses only the record files that changed since the previous pass (a git checkout rewrites
    exactly those). Each file is stat()ed: the same device, inode, size, mtime and ctime as last time means
    the same content. A file whose stat changed is read and its content hash compared, so a rewrite with
    the same bytes is not parsed again either. Timestamps are coarse (a second write in the same clock tick
    can leave them equal), so, as in git's index, a file that had changed less than RACY_NS before it was
    read is not trusted on its stat alone the next time: its content is compared instead.

    Only good parses are kept: an unreadable file is read, parsed and reported again on every pass, and a
    file that is gone (pardon by deletion) drops out. For one spec directory, used by one thread.
    Counts for the last `load_records` call: `reused` files came from the cache, `parsed` were parsed, `read`
    had their bytes read (the rest were only stat()ed).
    """

    RACY_NS = 2_000_000_000

    def __init__(self, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self._entries: dict[str, _Cached] = {}
        self._seen: set[str] = set()
        #: A load went through this cache, or it was primed: the caller's first pass is over.
        self.started = False
        self.parsed = 0
        self.reused = 0
        self.read = 0

    def __len__(self) -> int:
        return len(self._entries)

    def begin(self) -> None:
        self.started = True
        self._seen = set()
        self.parsed = self.reused = self.read = 0

    def end(self) -> None:
        for gone in self._entries.keys() - self._seen:
            del self._entries[gone]

    def prime(self, spec_dir: Path, machines: Mapping[str, tuple[str, MachineRecord]]) -> None:
        """Take machine records parsed elsewhere (machine id -> (blob id of its file, record)): the record
        index's, on a process's first pass. Nothing is trusted on a stat it has not seen: the next load reads
        each file once and keeps the record if the content is that blob (no parse), else parses."""
        self.started = True
        for machine_id, (blob, record) in machines.items():
            key = os.path.abspath(machine_record_path(spec_dir, machine_id))
            self._entries[key] = _Cached(None, blob, record, settled=False)

    def load(self, key: str, file: Path, parse: Callable[[str, Path], _Record]) -> _Record:
        """The record in `file` (`key`: its absolute path), from the cache when the file is unchanged."""
        self._seen.add(key)
        cached = self._entries.pop(key, None)  # put back only once this pass has read the file successfully
        if cached is not None and cached.settled and _stat_key(os.stat(file)) == cached.key:
            self._entries[key] = cached
            self.reused += 1
            return cast(_Record, cached.record)
        read_at = self._clock_ns()
        with open(file, "rb") as fh:
            st = os.fstat(fh.fileno())
            raw = fh.read()
        self.read += 1
        digest = git_blob_id(raw)
        if cached is not None and cached.digest == digest:
            record = cast(_Record, cached.record)
            self.reused += 1
        else:
            self.parsed += 1
            record = parse(decode_record_text(raw), file)
        settled = max(st.st_mtime_ns, st.st_ctime_ns) < read_at - self.RACY_NS
        self._entries[key] = _Cached(_stat_key(st), digest, record, settled)
        return record


def decode_record_text(raw: bytes) -> str:
    """The text `Path.read_text(encoding="utf-8")` returns for these bytes (universal newlines)."""
    text = raw.decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _yaml_files(directory: Path, problems: list[str]) -> list[Path]:
    """The `*.yaml` entries of a records directory (hidden names too, as `Path.glob` lists them), by name."""
    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries if entry.name.endswith(".yaml")]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        problems.append(f"{directory}: cannot list records: {exc}")
        return []
    return [directory / name for name in sorted(names)]


def _read_record(file: Path, parse: Callable[[str, Path], _Record], cache: RecordCache | None) -> _Record:
    if cache is None:
        return parse(file.read_text(encoding="utf-8"), file)
    return cache.load(os.path.abspath(file), file, parse)


def load_records(spec_dir: str | Path, cache: RecordCache | None = None) -> RecordSet:
    """Read every record under `spec_dir`. Unreadable files are reported in `problems`, never dropped.

    With a `cache` (kept by the caller between calls) only the files that changed since the last call are
    parsed; the result is the same as without one.
    """
    spec_dir = Path(spec_dir)
    machines: dict[str, MachineRecord] = {}
    images: dict[str, ImageSuspectRecord] = {}
    problems: list[str] = []
    unreadable: set[str] = set()
    if cache is not None:
        cache.begin()
    with collector_paused():  # a bulk parse allocates millions of objects that all stay alive
        _load_into(spec_dir, cache, machines, images, problems, unreadable)
    if cache is not None:
        cache.end()
        if cache.parsed > 1000:
            # The loop keeps these records for its lifetime: out of the collector's generations, later
            # collections do not walk them again (objects still go when nothing refers to them).
            gc.freeze()
    return RecordSet(machines, images, tuple(problems), frozenset(unreadable))


def _load_into(spec_dir: Path, cache: RecordCache | None, machines: dict[str, MachineRecord],
               images: dict[str, ImageSuspectRecord], problems: list[str], unreadable: set[str]) -> None:
    for file in _yaml_files(spec_dir / MACHINES_DIR, problems):
        try:
            rec = _read_record(file, parse_machine_record, cache)
        except (RecordError, OSError, UnicodeDecodeError, TypeError) as exc:
            problems.append(str(exc) if isinstance(exc, RecordError) else f"{file}: cannot read: {exc}")
            if looks_like_machine_id(file.stem):
                unreadable.add(file.stem)
            continue
        machines[rec.machine_id] = rec
    for file in _yaml_files(spec_dir / IMAGES_DIR, problems):
        try:
            img = _read_record(file, parse_image_record, cache)
        except (RecordError, OSError, UnicodeDecodeError, TypeError) as exc:
            problems.append(str(exc) if isinstance(exc, RecordError) else f"{file}: cannot read: {exc}")
            continue
        images[img.image_digest] = img
