"""Why: the audit trail of one machine, read from git.

Every commit whose `Fleet-Machine` trailer names the machine, newest first, with the evidence of its
verdict (the entry whose instance id the commit's `Fleet-Instance` trailer names), plus the record's current
status on the checked-out branch. Works in any plain clone: it reads the checked-out branch, not the bot's
remote-tracking ref.

Where the evidence comes from: entries are append-only, so a verdict's entry is in today's record unless a
human removed it (or the record was deleted). The shell parses the current record once (`parsed_record`) and
each verdict takes its entries from it; only a verdict whose entries are gone is read from the record as of
its own commit (`commits_to_read` names those commits, the shell reads them in one `git cat-file --batch` and
parses them). Everything here works on parsed records: a record's text is parsed once, where it is read.
Reading every historical version instead grew with the square of the verdict count (each version one entry
longer). Long histories are paged: the newest `shown` verdicts (the cli's default 20; `--all` for every one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from reconciler.adapters.git import LastChange, VerdictCommit
from reconciler.adapters.record_files import parse_machine_record
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordError
from reconciler.domain.redact import escape_controls
from reconciler.domain.retests import HELD_FOR_RETEST

DEFAULT_TAIL = 20
#: Verdicts `fleet why` shows unless asked for `--all` (newest first).
DEFAULT_SHOWN = 20

#: Where a verdict's entries were read: today's record, or the record as of the verdict's commit.
FROM_CURRENT = "current record"
FROM_COMMIT = "record at the commit"


@dataclass(frozen=True)
class VerdictEvidence:
    commit: VerdictCommit
    entries: tuple[BenchmarkEntry, ...]
    problem: str | None  # why no entry could be shown
    source: str | None = None  # FROM_CURRENT | FROM_COMMIT (None: no entries)


@dataclass(frozen=True)
class MachineHistory:
    machine_id: str
    record_path: str
    status: str  # ok | bad | pardoned | deleted | unreadable | unknown
    status_detail: str | None
    last_change: LastChange | None
    verdicts: tuple[VerdictEvidence, ...]  # the newest `shown` of them
    verdicts_total: int = 0

    @property
    def verdicts_hidden(self) -> int:
        return self.verdicts_total - len(self.verdicts)


def _wanted(commit: VerdictCommit) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The commit's admission instances and its serving instances (verdicts while serving: degraded, lost)."""
    return commit.trailers.get("Fleet-Instance", ()), commit.trailers.get("Fleet-Serving-Instance", ())


def _entries_for(record: MachineRecord, commit: VerdictCommit) -> tuple[BenchmarkEntry, ...]:
    instances, serving = _wanted(commit)
    return tuple(b for b in record.benchmarks
                 if (b.instance_id in instances and b.stage != "serving")
                 or (b.instance_id in serving and b.stage == "serving"))


#: A record as git had it: parsed, unreadable (why), or absent (None).
ReadRecord = MachineRecord | RecordError | None


def parsed_record(text: str | None, parse: Callable[[str], MachineRecord]) -> ReadRecord:
    """The record in `text` (None: no such file), or the RecordError that says why it cannot be read."""
    if text is None:
        return None
    try:
        return parse(text)
    except RecordError as exc:
        return exc


def commits_to_read(commits: Sequence[VerdictCommit], current: ReadRecord, shown: int | None) -> list[str]:
    """Pure: the shown commits whose entries are not in the current record (removed, or no readable current
    record): only their historical record versions need reading."""
    page = commits if shown is None else commits[:shown]
    if not isinstance(current, MachineRecord):
        return [c.sha for c in page]
    return [c.sha for c in page if not _entries_for(current, c)]


def historical_wanted(record_path: str, commits: Sequence[VerdictCommit], current_text: str | None,
                      shown: int | None) -> list[str]:
    """`commits_to_read` for a caller that holds the current record's text, not the record."""
    current = parsed_record(current_text, lambda text: parse_machine_record(text, Path(record_path)))
    return commits_to_read(commits, current, shown)


def explain(machine_id: str, record_path: str, commits: list[VerdictCommit], current: ReadRecord,
            last_change: LastChange | None, now: datetime | None = None, *,
            historical: Mapping[str, ReadRecord] | None = None, shown: int | None = None) -> MachineHistory:
    """Pure: the commits and records git gave us -> what to tell the human. `current`: the record on the
    checked-out branch; `historical`: the record as of each commit whose entries are not in the current
    record (`commits_to_read`). With `now`, the status says where the machine stands (bad until its expiry,
    on probation, permanent, banned). `shown`: only the newest so many verdicts (None: all)."""
    historical = historical or {}
    page = commits if shown is None else commits[:shown]
    verdicts = tuple(_evidence(record_path, c, current, historical) for c in page)
    detail = None
    if isinstance(current, RecordError):
        status, detail = "unreadable", str(current)
    elif current is not None:
        status = current.status
        if now is not None:
            standing = current.standing(now)
            if standing.state != current.status:
                status = f"{current.status}, {standing.state} now"
            if standing.state != current.status or standing.until is not None:
                detail = standing.detail  # expiry, probation, permanence: the rest is said by the status
    elif commits or last_change is not None:
        status = "deleted"
        detail = "pardoned by deletion: the reconciler records this machine again only on a new failure"
    else:
        status = "unknown"
    return MachineHistory(machine_id, record_path, status, detail, last_change, verdicts, len(commits))


def _evidence(record_path: str, commit: VerdictCommit, current: ReadRecord,
              historical: Mapping[str, ReadRecord]) -> VerdictEvidence:
    if isinstance(current, MachineRecord):
        entries = _entries_for(current, commit)
        if entries:
            return VerdictEvidence(commit, entries, None, FROM_CURRENT)
    record = historical.get(commit.sha)
    if record is None:
        return VerdictEvidence(commit, (), f"{record_path} does not exist in this commit")
    if isinstance(record, RecordError):
        return VerdictEvidence(commit, (), f"record unreadable in this commit: {record}")
    entries = _entries_for(record, commit)
    if entries:
        return VerdictEvidence(commit, entries, None, FROM_COMMIT)
    named = ", ".join((*_wanted(commit)[0], *_wanted(commit)[1])) or "none"
    return VerdictEvidence(commit, (), f"no benchmark entry in the record for the commit's instance(s): {named}")


def to_json(h: MachineHistory) -> dict[str, Any]:
    return {
        "machine_id": h.machine_id,
        "record_path": h.record_path,
        "status": h.status,
        "status_detail": h.status_detail,
        "last_change": None if h.last_change is None else vars(h.last_change).copy(),
        "verdicts_total": h.verdicts_total,
        "verdicts_shown": len(h.verdicts),
        "verdicts": [{"commit": v.commit.sha, "date": v.commit.date, "author": v.commit.author,
                      "summary": v.commit.summary, "trailers": {k: list(vs) for k, vs in v.commit.trailers.items()},
                      "entries": [e.to_yaml_dict() for e in v.entries], "problem": v.problem,
                      "evidence_from": v.source}
                     for v in h.verdicts],
    }


def render_text(h: MachineHistory, tail: int) -> str:
    lines = [f"machine {h.machine_id}: {h.status} ({h.record_path})"]
    if h.status_detail:
        lines.append(f"  {h.status_detail}")
    newest_verdict = h.verdicts[0].commit.sha if h.verdicts else None
    if h.last_change is not None and h.last_change.sha != newest_verdict:  # e.g. a human's pardon
        what = "deleted" if h.last_change.deleted else "last changed"
        lines.append(f"  record {what} in {h.last_change.sha[:12]} {h.last_change.date} by {h.last_change.author}: "
                     f"{h.last_change.summary}")
    if not h.verdicts:
        lines.append("no verdict commits")
    elif h.verdicts_hidden:
        lines.append(f"{h.verdicts_total} verdict commit(s); the newest {len(h.verdicts)} shown, newest first "
                     f"(--all for the other {h.verdicts_hidden}):")
    else:
        lines.append(f"{len(h.verdicts)} verdict commit(s), newest first:")
    for v in h.verdicts:
        c = v.commit
        lines += ["", f"commit {c.sha[:12]}  {c.date}  {c.author}", f"  {c.summary}"]
        if v.problem:
            lines.append(f"  ({v.problem})")
        elif v.source == FROM_COMMIT:
            lines.append("  (entry no longer in the current record: shown as of this commit)")
        for e in v.entries:
            lines += _entry_lines(e, tail)
    if h.verdicts_hidden:
        lines += ["", f"... {h.verdicts_hidden} older verdict commit(s) not shown: fleet why {h.machine_id} --all"]
    return "\n".join(lines) + "\n"


def _entry_lines(e: BenchmarkEntry, tail: int) -> list[str]:
    ev = e.evidence
    held = ", retest pending" if e.held_by == HELD_FOR_RETEST else f", held by {e.held_by}" if e.held_by else ""
    marks = "marks the machine bad" if e.marks_bad else "does not mark the machine bad"
    setting = ev.get("setting")
    change = f"    change:    {setting}" if isinstance(setting, str) else None
    out = [f"  instance {e.instance_id}" + (f" (contract {e.contract_id})" if e.contract_id else "")
           + (f", pool {e.pool}" if e.pool else "") + f", judged {e.at}",
           f"    root cause: {e.reason}",  # first (issue 14): phase, exit code, proofs, the error line
           f"    verdict:   {e.verdict} (blame: {e.blame}{held}; {marks})",
           *([change] if change else []), *_fleet_lines(ev)]
    rate = "-" if e.proofs_per_hour is None else f"{e.proofs_per_hour:g} proofs/h"
    spp = f" ({e.seconds_per_proof:g} s/proof)" if e.seconds_per_proof is not None else ""
    minimum = "-" if e.min_rate_proofs_per_hour is None else f"{e.min_rate_proofs_per_hour:g}"
    out.append(f"    rate:      {rate}{spp} vs min {minimum}")
    out.append(f"    exit code: {_show(ev.get('exit_code'))}   phase: {_show(ev.get('phase'))}"
               + (f"   signature: {e.signature}" if e.signature else ""))
    out.append(f"    image:     {_show(e.image_digest or ev.get('image_digest'))}")
    out += _after_admission_lines(e)
    daemon_log = ev.get("daemon_log")
    if isinstance(daemon_log, list) and daemon_log and tail:
        out.append(f"    daemon log ({len(daemon_log[-tail:])} line(s), timing noise filtered):")
        out += [f"      | {escape_controls(str(line))}" for line in daemon_log[-tail:]]
    log_tail = ev.get("log_tail")
    if isinstance(log_tail, list) and log_tail and tail:
        shown = log_tail[-tail:]
        out.append(f"    log tail ({len(shown)} of {len(log_tail)} line(s)):")
        # One shipped line stays one quoted line, whatever an older record holds (a newline inside it would print
        # a line of its own at column 0).
        out += [f"      | {escape_controls(str(line))}" for line in shown]
    return out


def _fleet_lines(ev: Mapping[str, Any]) -> list[str]:
    """Which correlation across the fleet decided an unknown failure (or that a retest is pending), and a retest's
    outcome (domain/correlation.py)."""
    out = []
    correlation = ev.get("correlation")
    if isinstance(correlation, Mapping):
        rule, detail = correlation.get("rule"), correlation.get("detail")
        head = "retest:    pending" if rule == "retest" else f"decided:   by the fleet ({rule})" \
            if correlation.get("decided") else "fleet:     undecided"
        out.append(f"    {head}: {_show(detail)}")
    retest = ev.get("retest")
    if isinstance(retest, Mapping):
        out.append(f"    retest:    of {_show(retest.get('of'))} ({_show(retest.get('signature'))}, requested "
                   f"{_show(retest.get('requested_at'))}): {_show(retest.get('outcome'))}")
    return out


def _after_admission_lines(e: BenchmarkEntry) -> list[str]:
    """Stage, expiry/probation, an early verdict's savings, a serving verdict's window and GPUs."""
    ev = e.evidence
    out = []
    if e.stage == "serving":
        window = ev.get("window")
        if isinstance(window, dict):
            out.append(f"    serving:   {window.get('completed')} proofs in {_show(window.get('busy_s'))} busy s over "
                       f"{_show(ev.get('window_minutes'))} min; below since {_show(ev.get('below_since'))}; last "
                       f"heartbeat {_show(ev.get('last_heartbeat'))}")
        if ev.get("last_signal"):
            out.append(f"    serving:   last signal {ev.get('last_signal')}, silent {_show(ev.get('silent_minutes'))} "
                       f"min (deadline {_show(ev.get('lost_after_minutes'))} min)")
        gpus = ev.get("gpus")
        if isinstance(gpus, list) and gpus:
            out.append("    gpus:      " + "; ".join(
                f"GPU{g.get('index', '?')} {_show(g.get('temperature_c'))} C, SM {_show(g.get('sm_clock_mhz'))}/"
                f"{_show(g.get('max_sm_clock_mhz'))} MHz" for g in gpus if isinstance(g, dict)))
    saved = ev.get("saved")
    if isinstance(saved, dict):
        out.append(f"    saved:     ~{_show(saved.get('minutes'))} min of benchmark, "
                   f"<= ${_show(saved.get('usd_at_most'))} ({_show(saved.get('price_basis'))})")
    if e.marks_bad:
        if e.probation:
            out.append("    expiry:    never: failed again while on probation (permanent)")
        elif e.expires_at:
            out.append(f"    expiry:    {e.expires_at}, then probation until {_show(e.probation_until)}")
        else:
            out.append("    expiry:    none (no expiry for this blame, or recorded before expiry existed)")
    return out


def _show(value: object) -> str:
    return "-" if value is None else str(value)
