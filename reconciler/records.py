"""Machine and image records under `fleet-spec/`: the reconciler's memory, kept in git.

One YAML file per machine (`machines/<machine_id>.yaml`) holds its benchmark history and verdicts; one
file per suspect image (`images/<digest-hex>.yaml`) holds a tripped circuit breaker. Everything the
planner needs (bad-machine set, perf history) is derived from these files, so a human PR that edits or
deletes a record is the whole pardon mechanism. Pure functions plus small file helpers; git is elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

import jsonschema
import yaml

from reconciler import SCHEMA_DIR

MACHINES_DIR = "machines"
IMAGES_DIR = "images"

VERDICTS = ("ok", "below-min-rate", "benchmark-error", "params-failed", "timeout", "stale-image")
BLAMES = ("none", "machine", "image", "network", "unknown")

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class RecordError(ValueError):
    """A record file or id that cannot be used. Names the file, field and value."""


def check_machine_id(machine_id: object) -> str:
    """Return `machine_id` as a string if it is safe as a file name; raise RecordError otherwise.

    Marketplace ids are numeric on vast.ai, but anything that reaches a path must not escape the
    records directory (`../x`, `a/b`, hidden files, NUL).
    """
    text = str(machine_id) if isinstance(machine_id, int) and not isinstance(machine_id, bool) else machine_id
    if not isinstance(text, str) or not _SAFE_ID.match(text) or ".." in text:
        raise RecordError(f"machine_id {machine_id!r} is not a safe id (expected [A-Za-z0-9][A-Za-z0-9_.-]*, "
                          "at most 64 characters, no '..')")
    return text


def check_image_digest(digest: object) -> str:
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise RecordError(f"image digest {digest!r} is not of the form sha256:<64 hex>")
    return digest


@dataclass(frozen=True)
class BenchmarkEntry:
    """One judged benchmark attempt of one instance on a machine, with the evidence behind the verdict."""

    instance_id: str
    at: str
    verdict: str
    blame: str
    marks_bad: bool
    reason: str
    contract_id: str | None = None
    pool: str | None = None
    image_digest: str | None = None
    signature: str | None = None
    proofs_per_hour: float | None = None
    seconds_per_proof: float | None = None
    min_rate_proofs_per_hour: float | None = None
    price_usd_per_hour: float | None = None
    held_by: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def to_yaml_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None and v != {}}
        if self.evidence:
            out["evidence"] = _plain(self.evidence)
        return out


@dataclass(frozen=True)
class MachineRecord:
    machine_id: str
    status: str = "ok"
    host_id: str | None = None
    gpu_name: str | None = None
    note: str | None = None
    benchmarks: tuple[BenchmarkEntry, ...] = ()

    @property
    def is_bad(self) -> bool:
        return self.status == "bad"

    def judged_instances(self) -> frozenset[str]:
        return frozenset(b.instance_id for b in self.benchmarks)

    def with_entry(self, entry: BenchmarkEntry, *, host_id: str | None, gpu_name: str | None) -> MachineRecord:
        """The record after a new verdict: appended history; status follows the newest machine evidence.

        A verdict that marks the machine bad makes it bad; a passing benchmark makes it ok (a pardoned
        machine that proves again is simply ok); verdicts blamed on the image or held by a breaker leave
        the status as humans or earlier evidence set it.
        """
        status = self.status
        if entry.marks_bad:
            status = "bad"
        elif entry.verdict == "ok":
            status = "ok"
        return replace(self, status=status, host_id=host_id or self.host_id, gpu_name=gpu_name or self.gpu_name,
                       benchmarks=(*self.benchmarks, entry))

    def to_yaml_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"machine_id": self.machine_id, "host_id": self.host_id, "gpu_name": self.gpu_name,
                               "status": self.status}
        if self.note:
            out["note"] = self.note
        out["benchmarks"] = [b.to_yaml_dict() for b in self.benchmarks]
        return out


@dataclass(frozen=True)
class ImageSuspectRecord:
    image_digest: str
    signature: str
    status: str
    machines: tuple[str, ...]
    tripped_at: str
    pools: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()
    reason: str = ""
    note: str | None = None

    @property
    def active(self) -> bool:
        return self.status == "suspect"

    def to_yaml_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"image_digest": self.image_digest, "signature": self.signature,
                               "status": self.status, "pools": list(self.pools), "machines": list(self.machines),
                               "instances": list(self.instances), "tripped_at": self.tripped_at,
                               "reason": self.reason}
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class MachinePerf:
    """Measured throughput of one machine, from its passing and below-rate benchmarks."""

    machine_id: str
    gpu_name: str | None
    samples: int
    median_proofs_per_hour: float
    last_proofs_per_hour: float


@dataclass(frozen=True)
class RecordSet:
    """All records of a spec directory, plus the files that could not be read (never overwritten).

    The derived views (bad machines, perf history) are computed on first use and kept: a RecordSet is not
    changed after it is built, and the slot inputs ask for them once per slot (10,000 records: ~80 ms each).
    """

    machines: Mapping[str, MachineRecord] = field(default_factory=dict)
    images: Mapping[str, ImageSuspectRecord] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    unreadable_machine_ids: frozenset[str] = frozenset()
    _derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def bad_machine_ids(self) -> frozenset[str]:
        """Machines no offer query may return. A record we cannot read is excluded too: when in doubt, the
        cheap mistake is skipping one offer, not renting a machine a human may have just marked bad."""
        if "bad" not in self._derived:
            self._derived["bad"] = (frozenset(m for m, r in self.machines.items() if r.is_bad)
                                    | self.unreadable_machine_ids)
        return cast(frozenset[str], self._derived["bad"])

    def suspect_images(self) -> Mapping[str, ImageSuspectRecord]:
        return {d: r for d, r in self.images.items() if r.active}

    def perf_history(self) -> dict[str, MachinePerf]:
        """Per machine with measured rates; a fresh dict each call (the callers' to keep or change)."""
        if "perf" not in self._derived:
            self._derived["perf"] = perf_history(self.machines.values())
        return dict(self._derived["perf"])


def perf_history(records: Iterable[MachineRecord]) -> dict[str, MachinePerf]:
    out: dict[str, MachinePerf] = {}
    for rec in records:
        rates = [b.proofs_per_hour for b in rec.benchmarks
                 if b.proofs_per_hour is not None and b.verdict in ("ok", "below-min-rate")]
        if rates:
            out[rec.machine_id] = MachinePerf(rec.machine_id, rec.gpu_name, len(rates),
                                              statistics.median(rates), rates[-1])
    return out


# --- files ---------------------------------------------------------------------------------------------

# libyaml parses and emits a 17 KB record ~8x faster than pure-Python PyYAML; the results are the same
# documents (and, for what the reconciler writes, the same text). Pure Python stays the fallback for a PyYAML
# built without libyaml.
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMA_DIR / name).read_text()))


def _plain(value: Any) -> Any:
    """Mappings/tuples -> dicts/lists so yaml.safe_dump can write them."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def machine_record_path(spec_dir: Path, machine_id: str) -> Path:
    return spec_dir / MACHINES_DIR / f"{check_machine_id(machine_id)}.yaml"


def image_record_path(spec_dir: Path, digest: str) -> Path:
    return spec_dir / IMAGES_DIR / f"{check_image_digest(digest).removeprefix('sha256:')}.yaml"


_HEADER = "# Written by the fleet reconciler. Pardon: set status: pardoned (or delete this file) in a PR.\n"


def _dump(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_YAML_DUMPER, sort_keys=False, allow_unicode=True, width=120)


def render_machine_record(record: MachineRecord) -> str:
    return _HEADER + _dump(record.to_yaml_dict())


def render_image_record(record: ImageSuspectRecord) -> str:
    header = "# Written by the fleet reconciler (circuit breaker). Clear: set status: cleared in a PR.\n"
    return header + _dump(record.to_yaml_dict())


def _schema_errors(doc: Any, schema: str, file: Path) -> list[str]:
    out = []
    for err in sorted(_validator(schema).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        out.append(f"{file}: {path}: {err.message}")
    return out


def _load_yaml(text: str, file: Path) -> Any:
    """The YAML document in `text`, or RecordError naming the file (never another exception)."""
    try:
        _refuse_aliases(text, file)
        return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 (CSafeLoader or SafeLoader)
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
    for event in yaml.parse(text, Loader=_YAML_LOADER):
        if isinstance(event, yaml.AliasEvent):
            found = f"*{event.anchor}"
        elif isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            found = f"&{event.anchor}"
        else:
            continue
        line = f"line {event.start_mark.line + 1}: " if event.start_mark is not None else ""
        raise RecordError(f"{file}: {line}YAML anchors and aliases are not allowed in a record (found {found}); "
                          "write the values out")


def parse_machine_record(text: str, file: Path) -> MachineRecord:
    doc = _load_yaml(text, file)
    if isinstance(doc, dict) and isinstance(doc.get("machine_id"), int):
        doc["machine_id"] = str(doc["machine_id"])
    errors = _schema_errors(doc, "machine-record.schema.json", file)
    if errors:
        raise RecordError("; ".join(errors))
    if file.stem != doc["machine_id"]:
        raise RecordError(f"{file}: $.machine_id: {doc['machine_id']!r} does not match the file name "
                          f"{file.name!r}")
    entries = tuple(BenchmarkEntry(**b) for b in doc["benchmarks"])
    return MachineRecord(machine_id=doc["machine_id"], status=doc["status"], host_id=_str_or_none(doc.get("host_id")),
                         gpu_name=doc.get("gpu_name"), note=doc.get("note"), benchmarks=entries)


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


@dataclass(frozen=True)
class _Cached:
    key: _StatKey
    digest: bytes
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
        self.parsed = 0
        self.reused = 0
        self.read = 0

    def __len__(self) -> int:
        return len(self._entries)

    def begin(self) -> None:
        self._seen = set()
        self.parsed = self.reused = self.read = 0

    def end(self) -> None:
        for gone in self._entries.keys() - self._seen:
            del self._entries[gone]

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
        digest = hashlib.blake2b(raw, digest_size=16).digest()
        if cached is not None and cached.digest == digest:
            record = cast(_Record, cached.record)
            self.reused += 1
        else:
            self.parsed += 1
            record = parse(_decode(raw), file)
        settled = max(st.st_mtime_ns, st.st_ctime_ns) < read_at - self.RACY_NS
        self._entries[key] = _Cached(_stat_key(st), digest, record, settled)
        return record


def _decode(raw: bytes) -> str:
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
    for file in _yaml_files(spec_dir / MACHINES_DIR, problems):
        try:
            rec = _read_record(file, parse_machine_record, cache)
        except (RecordError, OSError, UnicodeDecodeError, TypeError) as exc:
            problems.append(str(exc) if isinstance(exc, RecordError) else f"{file}: cannot read: {exc}")
            if _SAFE_ID.match(file.stem):
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
    if cache is not None:
        cache.end()
    return RecordSet(machines, images, tuple(problems), frozenset(unreadable))


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temp file + fsync + rename: a crash or a full disk never leaves a partial record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
