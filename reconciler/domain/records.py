"""Machine and image records: the reconciler's memory, as pure data.

One record per machine (benchmark history and verdicts) and one per suspect image (a tripped circuit
breaker). Everything the planner needs (bad-machine set, perf history) is derived from these, so a human
PR that edits or deletes a record file is the whole pardon mechanism. The files themselves are read and
written by `reconciler.adapters.record_files`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, NamedTuple, Protocol, TypeVar, cast

from reconciler.domain import errors
from reconciler.domain.quick_init import quick_init
from reconciler.domain.verdicts import RATE_VERDICTS

MACHINES_DIR = "machines"
IMAGES_DIR = "images"


#: Record statuses: `bad` excludes the machine until its newest bad entry expires (then probation);
#: `banned` (an operator's PR) never expires; `pardoned` (an operator's PR) is rentable.
RECORD_STATUSES = ("ok", "bad", "pardoned", "banned")
#: Set only by an operator's PR; a verdict never lifts a ban, and only a new failure ends a pardon.
OPERATOR_STATUSES = ("banned", "pardoned")
#: Entry stages: a verdict on the admission benchmark, or on a machine that was serving.
STAGES = ("admission", "serving")
#: The statuses of a machine recorded bad (`bad` until its expiry, `banned` for good): `MachineRecord.is_bad`.
BAD_RECORD_STATUSES = ("bad", "banned")

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")


class RecordError(errors.PermanentError, ValueError):
    """A record file or id that cannot be used. Names the file, field and value."""

    reason = errors.RECORD_INVALID


def check_machine_id(machine_id: object) -> str:
    """Return `machine_id` as a string if it is safe as a file name; raise RecordError otherwise.

    Marketplace ids are numeric on vast.ai, but anything that reaches a path must not escape the
    records directory (`../x`, `a/b`, hidden files, NUL).
    """
    text = str(machine_id) if isinstance(machine_id, int) and not isinstance(machine_id, bool) else machine_id
    if not isinstance(text, str) or not _SAFE_ID.fullmatch(text) or ".." in text:
        raise RecordError(f"machine_id {machine_id!r} is not a safe id (expected [A-Za-z0-9][A-Za-z0-9_.-]*, "
                          "at most 64 characters, no '..')")
    return text


def looks_like_machine_id(text: str) -> bool:
    """`text` (a record file's name without `.yaml`) has the shape of a machine id: a record file of that name
    that cannot be read excludes the machine (RecordSet.unreadable_machine_ids)."""
    return _SAFE_ID.fullmatch(text) is not None


def check_image_digest(digest: object) -> str:
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise RecordError(f"image digest {digest!r} is not of the form sha256:<64 hex>")
    return digest


@quick_init
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
    stage: str | None = None  # None (older records) = admission
    expires_at: str | None = None  # a bad entry without it never expires (all records before expiry existed)
    probation_until: str | None = None
    probation: bool | None = None  # True: this failure came on probation, so it is permanent

    def expiry(self) -> datetime | None:
        return record_time(self.expires_at)

    def field_values(self) -> tuple[Any, ...]:
        """Every field but the evidence, in field order: what `from_field_values` takes back (the record index
        stores entries so, and reads the evidence from the record file when it is asked for)."""
        return _field_values_of(self.__dict__)

    @classmethod
    def from_field_values(cls, values: Sequence[Any], evidence: Mapping[str, Any]) -> BenchmarkEntry:
        """The entry whose `field_values()` are `values`, with this evidence: equal to
        `BenchmarkEntry(**dict(zip(names, values)), evidence=evidence)`, its fields set in one go as pickle sets
        them, not one guarded setattr per field (a pass builds 100,000 entries from the record index). For
        values that were checked already (a schema-checked record): nothing is validated here, so a check added
        to this class belongs in `__post_init__` and here too."""
        entry = _new_object(cls)
        entry.__dict__.update(zip(_ALL_FIELDS, (*values[:_EVIDENCE_AT], evidence, *values[_EVIDENCE_AT:]), strict=True))
        return entry

    def to_yaml_dict(self) -> dict[str, Any]:
        # Field by field rather than asdict(): asdict deep-copies the evidence only to have it replaced below
        # (that copy was most of the cost of rendering a record).
        out: dict[str, Any] = {}
        for name in _ENTRY_FIELDS:
            value = getattr(self, name)
            if type(value) in _SCALARS:  # most fields: no `isinstance(.., Mapping)` (an ABC check, ~0.5 us)
                if value is not None:
                    out[name] = value
            elif value != {}:
                out[name] = _plain(value) if isinstance(value, Mapping | list | tuple) else value
        if self.evidence:
            out["evidence"] = _plain(self.evidence)
        return out


_T = TypeVar("_T")

#: BenchmarkEntry's fields but the evidence (written last), in order: `fields()` per entry cost a tenth of a render.
_ENTRY_FIELDS = tuple(f.name for f in fields(BenchmarkEntry) if f.name != "evidence")
#: The fields `BenchmarkEntry.field_values` gives, in that order.
ENTRY_VALUE_FIELDS = _ENTRY_FIELDS
_field_values_of = itemgetter(*_ENTRY_FIELDS)
_ALL_FIELDS = tuple(f.name for f in fields(BenchmarkEntry))
_EVIDENCE_AT = _ALL_FIELDS.index("evidence")
_new_object = object.__new__


class RecordedVerdict(NamedTuple):
    """An instance's recorded verdict in the fields the views triage and count by."""

    machine_id: str
    verdict: str
    proofs_per_hour: float | None
    price_usd_per_hour: float | None


@quick_init
@dataclass(frozen=True)
class MachineRecord:
    machine_id: str
    status: str = "ok"
    host_id: str | None = None
    gpu_name: str | None = None
    note: str | None = None
    benchmarks: tuple[BenchmarkEntry, ...] = ()
    _derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def derived(self, key: str, compute: Callable[[MachineRecord], _T]) -> _T:
        """`compute(self)`, remembered on this record object under `key`. A record never changes, and a loop's
        RecordCache keeps the records of unchanged files from pass to pass: a pass summarises 10,000 records
        (judged instances, failures for the breaker) from what the earlier passes computed."""
        try:
            return cast(_T, self._derived[key])
        except KeyError:
            value = self._derived[key] = compute(self)
            return value

    @property
    def is_bad(self) -> bool:
        """Recorded bad (or banned), whatever the expiry says; `standing(now)` applies the expiry."""
        return self.status in BAD_RECORD_STATUSES

    def is_bad_at(self, now: datetime | None) -> bool:
        """Excluded from offers at `now`: banned, or bad and its newest bad entry not expired yet. Without a
        `now` nothing expires (the safe reading)."""
        return self.standing(now).excluded

    def last_bad_entry(self) -> BenchmarkEntry | None:
        return next((b for b in reversed(self.benchmarks) if b.marks_bad), None)

    def standing(self, now: datetime | None) -> Standing:
        """Where the machine stands at `now`: ok, bad (until its expiry, or permanent), probation, pardoned,
        banned. Probation: the newest bad entry expired less than its probation period ago; the machine may
        be rented again, and its next bad verdict is permanent."""
        return standing_of(self.status, self.last_bad_entry(), now)

    def judged_instances(self) -> frozenset[str]:
        return frozenset(b.instance_id for b in self.benchmarks)

    def with_entry(self, entry: BenchmarkEntry, *, host_id: str | None, gpu_name: str | None) -> MachineRecord:
        """The record after a new verdict: appended history; status follows the newest machine evidence.

        A verdict that marks the machine bad makes it bad; a passing benchmark makes a bad machine ok;
        verdicts blamed on the image or held by a breaker leave the status as humans or earlier evidence set
        it. The operators' states are theirs: `banned` stays banned whatever the verdict (an instance rented
        before the ban may still pass), `pardoned` stays pardoned until a NEW failure marks the machine bad.
        """
        status = self.status
        if status == "banned" or (status == "pardoned" and not entry.marks_bad):
            pass  # the operator's word stands
        elif entry.marks_bad:
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


@quick_init
@dataclass(frozen=True)
class Standing:
    """A machine's place at one moment: `state` ok|bad|permanent|probation|pardoned|banned."""

    state: str
    excluded: bool
    detail: str
    until: datetime | None = None


def standing_of(status: str, last: BenchmarkEntry | None, now: datetime | None) -> Standing:
    """A record's standing from its status and its newest entry that marked the machine bad."""
    if status == "banned":
        return Standing("banned", True, "banned by an operator (never expires)")
    if status == "pardoned":
        return Standing("pardoned", False, "pardoned by an operator")
    expires = last.expiry() if last else None
    until = record_time(last.probation_until) if last else None
    on_probation = (f"probation since {last.expires_at}" + (f" until {last.probation_until}" if last
                                                            and last.probation_until else "")) if last else ""
    if status == "bad":
        if last is None:
            return Standing("bad", True, "marked bad (no bad entry: set by hand)")
        if expires is None:
            if last.probation:
                return Standing("permanent", True, "permanent: failed again on probation")
            return Standing("bad", True, "no expiry (a record written before expiry existed, or a blame that never "
                                         "expires)")
        if now is None or now < expires:
            return Standing("bad", True, f"bad until {last.expires_at}", expires)
        if until is not None and now >= until:
            # As for any other status: past its probation the machine stands ok (a new failure starts over).
            return Standing("ok", False, f"ok: probation ended {last.probation_until}")
        return Standing("probation", False, on_probation, until)
    if expires is not None and now is not None and expires <= now and (until is None or now < until):
        return Standing("probation", False, on_probation, until)
    return Standing("ok", False, "ok")


def record_time(text: str | None, *, naive_as_utc: bool = True) -> datetime | None:
    """A record's RFC 3339 time, None when absent or unreadable (a hand-edited record): `standing_of` reads an
    unreadable expiry as "no expiry" (stays bad: the safe side). A time without an offset is UTC, or unreadable
    with `naive_as_utc=False` (the replay's reading)."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC) if naive_as_utc else None


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
class BadMachine:
    """A machine its record says is bad, with the two entries the views show: the newest entry that marked it
    bad (None: set bad by hand) and its newest entry (the pool it counts against)."""

    machine_id: str
    host_id: str | None
    gpu_name: str | None
    note: str | None
    marking: BenchmarkEntry | None
    last: BenchmarkEntry | None
    status: str = "bad"  # bad | banned (or ok | pardoned: a machine that passed again on probation)

    @classmethod
    def of(cls, record: MachineRecord) -> BadMachine:
        last = record.benchmarks[-1] if record.benchmarks else None
        return cls(record.machine_id, record.host_id, record.gpu_name, record.note, record.last_bad_entry(), last,
                   record.status)

    def standing(self, now: datetime | None) -> Standing:
        return standing_of(self.status, self.marking, now)


#: (pool, at) of an entry that marked its machine bad: the kill budget's input.
Mark = tuple[str | None, str]
#: (instance id, verdict, proofs/hour, $/hour) of one entry: what the views triage and count an instance by.
InstanceVerdict = tuple[str, str, float | None, float | None]


class RecordSummary(NamedTuple):
    """What every view reads of one machine record, without its entries: `summarize(record)`.

    A RecordSet aggregates these (bad set, standings, kill-budget marks, perf history, prices, recorded
    verdicts); the record index stores one per record file it parsed and answers from them without building
    the record. A tuple: a load makes 10,000 of them."""

    machine_id: str
    status: str
    gpu_name: str | None
    #: Measured throughput from the passing and below-rate entries (None: no measured rate).
    perf: MachinePerf | None
    #: The price of the newest entry that has one.
    last_price: float | None
    #: Every entry that marked the machine bad, oldest first.
    marks: tuple[Mark, ...]
    #: Every entry, oldest first (an instance judged twice: its newest entry counts). A sequence: a loader may
    #: decode them on first use (a RecordSet reads them only for the instances a view asks about).
    verdicts: Sequence[InstanceVerdict]
    #: The machine as the bad-machine views list it (its marking and newest entries), for a record that is
    #: bad or banned, or that passed again while on probation (its standing depends on `now`); else None.
    listed: BadMachine | None

    @property
    def is_bad(self) -> bool:
        """Recorded bad or banned (`MachineRecord.is_bad`)."""
        return self.status in BAD_RECORD_STATUSES

    @property
    def passed_on_probation(self) -> bool:
        """Status ok, and its newest bad entry has a probation period: it passed again after a bad record
        expired (whether it is still on probation depends on `now`)."""
        return self.listed is not None and self.status == "ok"


class EntryFacts(Protocol):
    """What `summarize` reads of a benchmark entry: a BenchmarkEntry, or an entry read back another way whose
    fields have the same names (the record index's stored rows)."""

    @property
    def instance_id(self) -> str: ...
    @property
    def at(self) -> str: ...
    @property
    def verdict(self) -> str: ...
    @property
    def marks_bad(self) -> bool: ...
    @property
    def pool(self) -> str | None: ...
    @property
    def proofs_per_hour(self) -> float | None: ...
    @property
    def price_usd_per_hour(self) -> float | None: ...
    @property
    def probation_until(self) -> str | None: ...


def summarize(record: MachineRecord, entries: Sequence[EntryFacts] | None = None,
              entry: Callable[[int], BenchmarkEntry] | None = None) -> RecordSummary:
    """The one reading of a record's entries that the views share: standing (status and the bad-machine view),
    kill-budget marks, probation, last price, recorded verdicts, performance. A new standing or a new fact the
    views need of a record is added here, and every loader (the files, the record index) gives it.

    `entries`, `entry`: the record's entries read some other way than as `record.benchmarks` (the record index
    does not build 100,000 entries to summarise them), and `entry(i)` the i-th of them as a BenchmarkEntry
    (asked for the two the bad-machine view keeps)."""
    facts: Sequence[EntryFacts] = record.benchmarks if entries is None else entries
    built = record.benchmarks.__getitem__ if entry is None else entry
    rates: list[float] = []
    marks: list[Mark] = []
    verdicts: list[InstanceVerdict] = []
    marking = last_price = None
    for i, b in enumerate(facts):  # one pass: a cold record index summarises 10,000 records
        rate, price = b.proofs_per_hour, b.price_usd_per_hour
        verdicts.append((b.instance_id, b.verdict, rate, price))
        if rate is not None and b.verdict in RATE_VERDICTS:
            rates.append(rate)
        if price is not None:
            last_price = price
        if b.marks_bad:
            marks.append((b.pool, b.at))
            marking = i
    perf = (MachinePerf(record.machine_id, record.gpu_name, len(rates), _median(rates), rates[-1])
            if rates else None)
    listed = record.is_bad or (record.status == "ok" and marking is not None
                               and facts[marking].probation_until is not None)
    return RecordSummary(
        record.machine_id, record.status, record.gpu_name, perf, last_price, tuple(marks), tuple(verdicts),
        BadMachine(record.machine_id, record.host_id, record.gpu_name, record.note,
                   None if marking is None else built(marking), built(len(facts) - 1) if facts else None,
                   record.status) if listed else None)


def _median(values: list[float]) -> float:
    """statistics.median (the mean of the middle two for an even count), without its generality's cost."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


class ViewMemo(Protocol):
    """Keeps the aggregates a RecordSet computed for the next RecordSet of the same unchanged record files: the
    record index keeps them in its snapshot, so that a command reads a few stored values instead of 10,000
    summaries. Each is `compute()` the first time, or what it gave for an earlier RecordSet of these files."""

    def value(self, name: str, compute: Callable[[], _T]) -> _T:
        """A value that holds no benchmark entry (builtins, and dataclasses of them)."""
        ...

    def bad_machines(self, name: str, compute: Callable[[], list[BadMachine]]) -> list[BadMachine]:
        """Bad-machine views: their entries' evidence is read from the record files when it is asked for."""
        ...


@quick_init
@dataclass(frozen=True)
class RecordSet:
    """All records of a spec directory, plus the files that could not be read (never overwritten).

    Every view (bad set, standings, kill-budget marks, perf history, prices, recorded verdicts) aggregates the
    records' summaries (`summarize`): computed from `machines` on first use, or given by the loader (the record
    index answers from stored summaries without building records, and keeps the aggregates in its `memo`).
    The views are computed on first use and kept: a RecordSet is not changed after it is built, and the slot
    inputs ask for them once per slot.
    """

    machines: Mapping[str, MachineRecord] = field(default_factory=dict)
    images: Mapping[str, ImageSuspectRecord] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    unreadable_machine_ids: frozenset[str] = frozenset()
    #: machine id -> the summary of its record, in the order of `machines` (None: `summarize` each record).
    #: A mapping with a `many(machine_ids)` method is asked for several at once.
    summaries: Mapping[str, RecordSummary] | None = field(default=None, compare=False, repr=False)
    memo: ViewMemo | None = field(default=None, compare=False, repr=False)
    _derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def all_summaries(self) -> Mapping[str, RecordSummary]:
        """machine id -> summary of every readable machine record, in the order of `machines`."""
        if self.summaries is not None:
            return self.summaries
        if "summaries" not in self._derived:
            # Remembered on each record too: a loop's RecordCache keeps the records of unchanged files.
            self._derived["summaries"] = {m: rec.derived(_SUMMARY, summarize) for m, rec in self.machines.items()}
        return cast(Mapping[str, RecordSummary], self._derived["summaries"])

    def summaries_of(self, machine_ids: Iterable[str]) -> list[RecordSummary]:
        """The summaries of these machines (those that have a record), in the order given."""
        if self.summaries is None:
            machines = self.machines
            return [machines[m].derived(_SUMMARY, summarize) for m in machine_ids if m in machines]
        wanted = [m for m in machine_ids if m in self.summaries]
        many = getattr(self.summaries, "many", None)
        return list(many(wanted)) if many is not None else [self.summaries[m] for m in wanted]

    def _aggregate(self, name: str, compute: Callable[[], _T]) -> _T:
        """`compute()` once per RecordSet, kept by the memo across RecordSets."""
        if name not in self._derived:
            self._derived[name] = compute() if self.memo is None else self.memo.value(name, compute)
        return cast(_T, self._derived[name])

    def _listed(self, name: str, keep: Callable[[RecordSummary], bool]) -> list[BadMachine]:
        """The bad-machine views of the summaries `keep` selects, by machine id, kept by the memo."""
        if name not in self._derived:
            def compute() -> list[BadMachine]:
                return [s.listed for s in sorted(self.all_summaries().values(), key=_machine_id)
                        if s.listed is not None and keep(s)]
            self._derived[name] = compute() if self.memo is None else self.memo.bad_machines(name, compute)
        return cast(list[BadMachine], self._derived[name])

    def bad_machine_ids(self, now: datetime | None = None) -> frozenset[str]:
        """Machines no offer query may return at `now`: recorded bad or banned, except bad records whose
        expiry passed (probation: rentable again); without `now` nothing expires. A record we cannot read is
        excluded too: when in doubt, the cheap mistake is skipping one offer, not renting a machine a human
        may have just marked bad."""
        if "bad" not in self._derived:
            recorded = self._aggregate("recorded_bad", lambda: frozenset(
                m for m, s in self.all_summaries().items() if s.is_bad))
            self._derived["bad"] = frozenset(recorded) | self.unreadable_machine_ids
        if now is None:
            return cast(frozenset[str], self._derived["bad"])
        key = f"bad@{now.isoformat()}"
        if key not in self._derived:
            self._derived[key] = (frozenset(b.machine_id for b, standing in self.standings(now) if standing.excluded)
                                  | self.unreadable_machine_ids)
        return cast(frozenset[str], self._derived[key])

    def excluded_of(self, machine_ids: Iterable[str], now: datetime) -> frozenset[str]:
        """Those of `machine_ids` that `bad_machine_ids(now)` holds, reading only their own records (the guards
        ask this for one pass's verdicts; a replay asks it tens of thousands of times)."""
        wanted = set(machine_ids)
        if "bad" in self._derived and f"bad@{now.isoformat()}" in self._derived:
            return self.bad_machine_ids(now) & wanted
        return frozenset(s.machine_id for s in self.summaries_of(sorted(wanted))
                         if s.is_bad and s.listed is not None and s.listed.standing(now).excluded
                         ) | (self.unreadable_machine_ids & wanted)

    def standings(self, now: datetime | None, *,
                  passed_on_probation: bool = False) -> list[tuple[BadMachine, Standing]]:
        """Every machine recorded bad or banned, by id, with where it stands at `now` (`standing_of`): bad,
        permanent or banned (excluded from offers), probation (rentable again) or ok (past its probation). The
        one reading of a record's standing that the offer queries (`bad_machine_ids`) and every view (`fleet
        records`, `fleet plan`, `fleet status`, the page) share; `fleet why` and the directives call `standing_of`
        on the same record.

        `passed_on_probation` (the views): also the machines that passed again while on probation (status ok
        now, still on probation until its end: `passed_on_probation()`). Never excluded, so the offer queries
        need not read them."""
        key = f"standings@{now.isoformat() if now else None}"
        if key not in self._derived:
            self._derived[key] = [(b, b.standing(now)) for b in self.bad_machines()]
        rows = cast(list[tuple[BadMachine, Standing]], self._derived[key])
        if not passed_on_probation:
            return list(rows)
        wider = key + "+passed"
        if wider not in self._derived:
            passed = [(b, b.standing(now)) for b in self.passed_on_probation()]
            self._derived[wider] = sorted([*rows, *((b, st) for b, st in passed if st.state == "probation")],
                                          key=lambda row: row[0].machine_id)
        return list(self._derived[wider])

    def passed_on_probation(self) -> list[BadMachine]:
        """The machines with status ok whose newest bad entry has a probation period (they passed again after
        a bad record expired), by id, as `BadMachine`s: whether they are still on probation depends on `now`."""
        return list(self._listed("passed_on_probation", lambda s: s.passed_on_probation))

    def records_of(self, machine_ids: Iterable[str]) -> list[MachineRecord]:
        """The records of these machines (those that have one), in the order given. An indexed RecordSet
        builds them in one go instead of one look-up each."""
        wanted = [m for m in machine_ids if m in self.machines]
        many = getattr(self.machines, "many", None)
        return list(many(wanted)) if many is not None else [self.machines[m] for m in wanted]

    def instance_entries(self, wanted: Mapping[str, Collection[str]]) -> dict[str, tuple[str, BenchmarkEntry]]:
        """instance id -> (machine id, the newest entry for that instance in the machine's record), for the
        instance ids wanted of each machine id. A verdict is recorded in the record of the instance's own
        machine, so only those records are looked at (the views' root causes and states at 10,000 instances)."""
        out: dict[str, tuple[str, BenchmarkEntry]] = {}
        for rec in self.records_of(sorted(wanted)):
            ids = wanted[rec.machine_id]
            for entry in rec.benchmarks:
                if entry.instance_id in ids:
                    out[entry.instance_id] = (rec.machine_id, entry)
        return out

    def instance_verdicts(self, wanted: Mapping[str, Collection[str]]) -> dict[str, RecordedVerdict]:
        """`instance_entries` in the four fields the views triage and count by (verdict, rate, price), from the
        summaries: no record is built."""
        out: dict[str, RecordedVerdict] = {}
        for summary in self.summaries_of(sorted(wanted)):
            ids = wanted[summary.machine_id]
            for instance_id, verdict, rate, price in summary.verdicts:  # oldest first: the newest entry wins
                if instance_id in ids:
                    out[instance_id] = RecordedVerdict(summary.machine_id, verdict, rate, price)
        return out

    def bad_records(self) -> list[MachineRecord]:
        """The records with status bad, by machine id (not the unreadable ones: they have no record)."""
        return self.records_of(sorted(self.bad_machine_ids() - self.unreadable_machine_ids))

    def bad_machines(self) -> list[BadMachine]:
        """The bad machines by id, each with its marking and newest entries (not the unreadable ones)."""
        return list(self._listed("bad_machines", lambda s: s.is_bad))

    def bad_machine_gpus(self) -> dict[str, str | None]:
        """The GPU model of each machine `bad_machines` lists, by id."""
        return {b.machine_id: b.gpu_name for b in self.bad_machines()}

    def last_prices(self) -> dict[str, float | None]:
        """Per machine, the price of its newest benchmark entry that has one (None: no entry has a price)."""
        return dict(self._aggregate("last_prices", lambda: {m: s.last_price for m, s in self.all_summaries().items()}))

    def bad_marks(self) -> list[tuple[str, str | None, str]]:
        """(machine id, pool, at) of every recorded verdict that marked its machine bad (the kill budget's
        input), in record order."""
        return list(self._aggregate("bad_marks", lambda: [
            (m, pool, at) for m, s in self.all_summaries().items() for pool, at in s.marks]))

    def status_counts(self) -> dict[str, int]:
        """Machines per record status, by status name."""
        def count() -> dict[str, int]:
            counts: dict[str, int] = {}
            for s in self.all_summaries().values():
                counts[s.status] = counts.get(s.status, 0) + 1
            return dict(sorted(counts.items()))
        return dict(self._aggregate("status_counts", count))

    def suspect_images(self) -> Mapping[str, ImageSuspectRecord]:
        return {d: r for d, r in self.images.items() if r.active}

    def perf_history(self) -> dict[str, MachinePerf]:
        """Per machine with measured rates; a fresh dict each call (the callers' to keep or change)."""
        return dict(self._aggregate("perf_history", lambda: {
            m: s.perf for m, s in self.all_summaries().items() if s.perf is not None}))


#: The key a record remembers its summary under (MachineRecord.derived).
_SUMMARY = "records.summary"


def _machine_id(summary: RecordSummary) -> str:
    return summary.machine_id


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _plain(value: Any) -> Any:
    """Mappings/tuples -> dicts/lists so yaml.safe_dump can write them."""
    kind = type(value)
    if kind in _SCALARS:  # exact types first: the abc checks below cost more than the rest of a render
        return value
    # Scalars (most of an evidence's values: log lines) are taken without a call per value.
    if kind is dict:
        return {k if type(k) is str else str(k): v if type(v) in _SCALARS else _plain(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [v if type(v) in _SCALARS else _plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
