"""Machine and image records: the reconciler's memory, as pure data.

One record per machine (benchmark history and verdicts) and one per suspect image (a tripped circuit
breaker). Everything the planner needs (bad-machine set, perf history) is derived from these, so a human
PR that edits or deletes a record file is the whole pardon mechanism. The files themselves are read and
written by `reconciler.adapters.record_files`.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar, cast

from reconciler.domain import errors
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


def check_image_digest(digest: object) -> str:
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
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
    stage: str | None = None  # None (older records) = admission
    expires_at: str | None = None  # a bad entry without it never expires (all records before expiry existed)
    probation_until: str | None = None
    probation: bool | None = None  # True: this failure came on probation, so it is permanent

    def expiry(self) -> datetime | None:
        return _time_or_none(self.expires_at)

    def field_values(self) -> tuple[Any, ...]:
        """Every field but the evidence, in field order: what `from_field_values` takes back (the record index
        stores entries so, and reads the evidence from the record file when it is asked for)."""
        values = self.__dict__
        return tuple(values[name] for name in _ENTRY_FIELDS)

    @classmethod
    def from_field_values(cls, values: Sequence[Any], evidence: Mapping[str, Any]) -> BenchmarkEntry:
        """The entry whose `field_values()` are `values`, with this evidence: equal to
        `BenchmarkEntry(**dict(zip(names, values)), evidence=evidence)`, its fields set in one go as pickle sets
        them, not one guarded setattr per field (a pass builds 100,000 entries from the record index: ~1/3 of
        the cost). For values that were checked already (a schema-checked record): nothing is validated here,
        so a check added to this class belongs in `__post_init__` and here too."""
        entry = _new_object(cls)
        fields_of = entry.__dict__
        fields_of.update(zip(_BEFORE_EVIDENCE, values, strict=False))  # up to the evidence
        fields_of["evidence"] = evidence
        fields_of.update(zip(_AFTER_EVIDENCE, values[len(_BEFORE_EVIDENCE):], strict=True))
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
_EVIDENCE_AT = [f.name for f in fields(BenchmarkEntry)].index("evidence")
_BEFORE_EVIDENCE, _AFTER_EVIDENCE = _ENTRY_FIELDS[:_EVIDENCE_AT], _ENTRY_FIELDS[_EVIDENCE_AT:]
_new_object = object.__new__


class RecordedVerdict(NamedTuple):
    """An instance's recorded verdict in the fields the views triage and count by."""

    machine_id: str
    verdict: str
    proofs_per_hour: float | None
    price_usd_per_hour: float | None


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
    until = _time_or_none(last.probation_until) if last else None
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


def _time_or_none(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None  # a hand-edited, unreadable time: treated as "no expiry" (stays bad: the safe side)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


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
        marking = next((b for b in reversed(record.benchmarks) if b.marks_bad), None)
        last = record.benchmarks[-1] if record.benchmarks else None
        return cls(record.machine_id, record.host_id, record.gpu_name, record.note, marking, last, record.status)

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
    #: Every entry, oldest first (an instance judged twice: its newest entry counts).
    verdicts: tuple[InstanceVerdict, ...]
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


def summarize(record: MachineRecord) -> RecordSummary:
    """The one reading of a record's entries that the views share: standing (status and the bad-machine view),
    kill-budget marks, probation, last price, recorded verdicts, performance. A new standing or a new fact the
    views need of a record is added here, and every loader (the files, the record index) gives it."""
    entries = record.benchmarks
    rates = [b.proofs_per_hour for b in entries if b.proofs_per_hour is not None and b.verdict in RATE_VERDICTS]
    perf = (MachinePerf(record.machine_id, record.gpu_name, len(rates), statistics.median(rates), rates[-1])
            if rates else None)
    marking = record.last_bad_entry()
    listed = record.is_bad or (record.status == "ok" and marking is not None and marking.probation_until is not None)
    return RecordSummary(
        record.machine_id, record.status, record.gpu_name, perf,
        next((b.price_usd_per_hour for b in reversed(entries) if b.price_usd_per_hour is not None), None),
        tuple((b.pool, b.at) for b in entries if b.marks_bad),
        tuple((b.instance_id, b.verdict, b.proofs_per_hour, b.price_usd_per_hour) for b in entries),
        BadMachine.of(record) if listed else None)


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

    @classmethod
    def with_views(cls, machines: Mapping[str, MachineRecord], images: Mapping[str, ImageSuspectRecord],
                   problems: tuple[str, ...], unreadable_machine_ids: frozenset[str], *,
                   bad_machine_ids: frozenset[str],
                   perf: Mapping[str, MachinePerf] | Callable[[], Mapping[str, MachinePerf]],
                   status_counts: Mapping[str, int],
                   bad_marks: Callable[[], list[tuple[str, str | None, str]]] | None = None,
                   bad_machines: Callable[[], list[BadMachine]] | None = None,
                   bad_machine_gpus: Callable[[], dict[str, str | None]] | None = None,
                   last_prices: Callable[[], dict[str, float | None]] | None = None,
                   passed_on_probation: Callable[[], list[BadMachine]] | None = None,
                   instance_entries: Callable[[Mapping[str, Collection[str]]], dict[str, tuple[str, BenchmarkEntry]]]
                   | None = None,
                   instance_verdicts: Callable[[Mapping[str, Collection[str]]], dict[str, RecordedVerdict]]
                   | None = None) -> RecordSet:
        """A RecordSet whose derived views were computed elsewhere: the record index answers them from its
        indexed columns without building every record. They must equal what the methods would compute
        (tests/unit/test_record_index.py compares them)."""
        out = cls(machines, images, problems, unreadable_machine_ids)
        out._derived["bad"] = frozenset(bad_machine_ids) | unreadable_machine_ids
        if callable(perf):  # built on first use: most commands never read the 10,000 perf rows
            out._derived["perf_from"] = perf
        else:
            out._derived["perf"] = dict(perf)
        out._derived["counts"] = dict(sorted(status_counts.items()))
        if bad_marks is not None:
            out._derived["marks_from"] = bad_marks
        if bad_machines is not None:
            out._derived["bad_view_from"] = bad_machines
        if bad_machine_gpus is not None:
            out._derived["bad_gpus_from"] = bad_machine_gpus
        if last_prices is not None:
            out._derived["prices_from"] = last_prices
        if passed_on_probation is not None:
            out._derived["passed_from"] = passed_on_probation
        if instance_entries is not None:
            out._derived["instance_entries_from"] = instance_entries
        if instance_verdicts is not None:
            out._derived["instance_verdicts_from"] = instance_verdicts
        return out

    def bad_machine_ids(self, now: datetime | None = None) -> frozenset[str]:
        """Machines no offer query may return at `now`: recorded bad or banned, except bad records whose
        expiry passed (probation: rentable again); without `now` nothing expires. A record we cannot read is
        excluded too: when in doubt, the cheap mistake is skipping one offer, not renting a machine a human
        may have just marked bad."""
        if "bad" not in self._derived:
            self._derived["bad"] = (frozenset(m for m, r in self.machines.items() if r.is_bad)
                                    | self.unreadable_machine_ids)
        recorded = cast(frozenset[str], self._derived["bad"])
        if now is None:
            return recorded
        key = f"bad@{now.isoformat()}"
        if key not in self._derived:
            self._derived[key] = (frozenset(b.machine_id for b, standing in self.standings(now) if standing.excluded)
                                  | self.unreadable_machine_ids)
        return cast(frozenset[str], self._derived[key])

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
        a bad record expired), by id, as `BadMachine`s: whether they are still on probation depends on `now`.
        An indexed RecordSet reads them from a column, without building records."""
        if "passed" not in self._derived:
            source = self._derived.get("passed_from")
            self._derived["passed"] = source() if source is not None else [
                BadMachine.of(rec) for rec in self.records_of(sorted(self.machines))
                if rec.status == "ok" and (m := rec.last_bad_entry()) is not None and m.probation_until is not None]
        return list(self._derived["passed"])

    def records_of(self, machine_ids: Iterable[str]) -> list[MachineRecord]:
        """The records of these machines (those that have one), in the order given. An indexed RecordSet
        builds them in one go instead of one look-up each."""
        wanted = [m for m in machine_ids if m in self.machines]
        many = getattr(self.machines, "many", None)
        return list(many(wanted)) if many is not None else [self.machines[m] for m in wanted]

    def instance_entries(self, wanted: Mapping[str, Collection[str]]) -> dict[str, tuple[str, BenchmarkEntry]]:
        """instance id -> (machine id, the newest entry for that instance in the machine's record), for the
        instance ids wanted of each machine id. A verdict is recorded in the record of the instance's own
        machine, so only those records are looked at; the record index answers from its stored rows
        without building the records (the views' root causes and states at 10,000 instances)."""
        source = self._derived.get("instance_entries_from")
        if source is not None:
            return cast(dict[str, tuple[str, BenchmarkEntry]], source(wanted))
        out: dict[str, tuple[str, BenchmarkEntry]] = {}
        for rec in self.records_of(sorted(wanted)):
            ids = wanted[rec.machine_id]
            for entry in rec.benchmarks:
                if entry.instance_id in ids:
                    out[entry.instance_id] = (rec.machine_id, entry)
        return out

    def instance_verdicts(self, wanted: Mapping[str, Collection[str]]) -> dict[str, RecordedVerdict]:
        """`instance_entries` in the four fields the views triage and count by (verdict, rate, price): the record
        index answers from a column of a few short tuples per record instead of every entry's fields."""
        source = self._derived.get("instance_verdicts_from")
        if source is not None:
            return cast(dict[str, RecordedVerdict], source(wanted))
        return {iid: RecordedVerdict(mid, e.verdict, e.proofs_per_hour, e.price_usd_per_hour)
                for iid, (mid, e) in self.instance_entries(wanted).items()}

    def bad_records(self) -> list[MachineRecord]:
        """The records with status bad, by machine id (not the unreadable ones: they have no record)."""
        return self.records_of(sorted(self.bad_machine_ids() - self.unreadable_machine_ids))

    def bad_machines(self) -> list[BadMachine]:
        """The bad machines by id, each with its marking and newest entries (not the unreadable ones)."""
        if "bad_view" not in self._derived:
            source = self._derived.get("bad_view_from")
            self._derived["bad_view"] = source() if source is not None else [
                BadMachine.of(rec) for rec in self.bad_records()]
        return list(self._derived["bad_view"])

    def bad_machine_gpus(self) -> dict[str, str | None]:
        """The GPU model of each machine `bad_machines` lists, by id, without building their entries."""
        if "bad_gpus" not in self._derived:
            source = self._derived.get("bad_gpus_from")
            self._derived["bad_gpus"] = source() if source is not None else {
                b.machine_id: b.gpu_name for b in self.bad_machines()}
        return dict(self._derived["bad_gpus"])

    def last_prices(self) -> dict[str, float | None]:
        """Per machine, the price of its newest benchmark entry that has one (None: no entry has a price)."""
        if "prices" not in self._derived:
            source = self._derived.get("prices_from")
            self._derived["prices"] = source() if source is not None else {
                rec.machine_id: next((b.price_usd_per_hour for b in reversed(rec.benchmarks)
                                      if b.price_usd_per_hour is not None), None)
                for rec in self.machines.values()}
        return dict(self._derived["prices"])

    def bad_marks(self) -> list[tuple[str, str | None, str]]:
        """(machine id, pool, at) of every recorded verdict that marked its machine bad (the kill budget's
        input), in record order."""
        if "marks" not in self._derived:
            source = self._derived.get("marks_from")
            self._derived["marks"] = source() if source is not None else [
                mark for rec in self.machines.values() for mark in rec.derived("records.bad_marks", _bad_marks)]
        return list(self._derived["marks"])

    def status_counts(self) -> dict[str, int]:
        """Machines per record status, by status name."""
        if "counts" not in self._derived:
            counts: dict[str, int] = {}
            for rec in self.machines.values():
                counts[rec.status] = counts.get(rec.status, 0) + 1
            self._derived["counts"] = dict(sorted(counts.items()))
        return dict(self._derived["counts"])

    def suspect_images(self) -> Mapping[str, ImageSuspectRecord]:
        return {d: r for d, r in self.images.items() if r.active}

    def perf_history(self) -> dict[str, MachinePerf]:
        """Per machine with measured rates; a fresh dict each call (the callers' to keep or change)."""
        if "perf" not in self._derived:
            source = self._derived.get("perf_from")
            self._derived["perf"] = dict(source()) if source is not None else perf_history(self.machines.values())
        return dict(self._derived["perf"])


def perf_history(records: Iterable[MachineRecord]) -> dict[str, MachinePerf]:
    out: dict[str, MachinePerf] = {}
    for rec in records:
        rates = [b.proofs_per_hour for b in rec.benchmarks
                 if b.proofs_per_hour is not None and b.verdict in RATE_VERDICTS]
        if rates:
            out[rec.machine_id] = MachinePerf(rec.machine_id, rec.gpu_name, len(rates),
                                              statistics.median(rates), rates[-1])
    return out


def _bad_marks(record: MachineRecord) -> tuple[tuple[str, str | None, str], ...]:
    return tuple((record.machine_id, e.pool, e.at) for e in record.benchmarks if e.marks_bad)


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
