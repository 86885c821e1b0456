"""Why: the audit trail of one machine, read from git.

Every commit whose `Fleet-Machine` trailer names the machine, newest first, with the evidence of its
verdict taken from the machine record as of that commit (the entry whose instance id the commit's
`Fleet-Instance` trailer names), plus the record's current status on the checked-out branch. Works in
any plain clone: it reads the checked-out branch, not the bot's remote-tracking ref.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.adapters.git import LastChange, VerdictCommit
from reconciler.adapters.record_files import parse_machine_record
from reconciler.domain.records import BenchmarkEntry, RecordError

DEFAULT_TAIL = 20


@dataclass(frozen=True)
class VerdictEvidence:
    commit: VerdictCommit
    entries: tuple[BenchmarkEntry, ...]
    problem: str | None  # why no entry could be shown


@dataclass(frozen=True)
class MachineHistory:
    machine_id: str
    record_path: str
    status: str  # ok | bad | pardoned | deleted | unreadable | unknown
    status_detail: str | None
    last_change: LastChange | None
    verdicts: tuple[VerdictEvidence, ...]


def explain(machine_id: str, record_path: str, commits: list[VerdictCommit], current_text: str | None,
            last_change: LastChange | None) -> MachineHistory:
    """Pure: the commits and record texts git gave us -> what to tell the human."""
    verdicts = tuple(_evidence(machine_id, record_path, c) for c in commits)
    detail = None
    if current_text is not None:
        try:
            status = parse_machine_record(current_text, Path(record_path)).status
        except RecordError as exc:
            status, detail = "unreadable", str(exc)
    elif commits or last_change is not None:
        status = "deleted"
        detail = "pardoned by deletion: the reconciler records this machine again only on a new failure"
    else:
        status = "unknown"
    return MachineHistory(machine_id, record_path, status, detail, last_change, verdicts)


def _evidence(machine_id: str, record_path: str, commit: VerdictCommit) -> VerdictEvidence:
    instances = commit.trailers.get("Fleet-Instance", ())
    if commit.record_text is None:
        return VerdictEvidence(commit, (), f"{record_path} does not exist in this commit")
    try:
        record = parse_machine_record(commit.record_text, Path(record_path))
    except RecordError as exc:
        return VerdictEvidence(commit, (), f"record unreadable in this commit: {exc}")
    entries = tuple(b for b in record.benchmarks if b.instance_id in instances)
    if entries:
        return VerdictEvidence(commit, entries, None)
    named = ", ".join(instances) or "none"
    return VerdictEvidence(commit, (), f"no benchmark entry in the record for the commit's instance(s): {named}")


def to_json(h: MachineHistory) -> dict[str, Any]:
    return {
        "machine_id": h.machine_id,
        "record_path": h.record_path,
        "status": h.status,
        "status_detail": h.status_detail,
        "last_change": None if h.last_change is None else vars(h.last_change).copy(),
        "verdicts": [{"commit": v.commit.sha, "date": v.commit.date, "author": v.commit.author,
                      "summary": v.commit.summary, "trailers": {k: list(vs) for k, vs in v.commit.trailers.items()},
                      "entries": [e.to_yaml_dict() for e in v.entries], "problem": v.problem}
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
    lines.append(f"{len(h.verdicts)} verdict commit(s), newest first:" if h.verdicts else "no verdict commits")
    for v in h.verdicts:
        c = v.commit
        lines += ["", f"commit {c.sha[:12]}  {c.date}  {c.author}", f"  {c.summary}"]
        if v.problem:
            lines.append(f"  ({v.problem})")
        for e in v.entries:
            lines += _entry_lines(e, tail)
    return "\n".join(lines) + "\n"


def _entry_lines(e: BenchmarkEntry, tail: int) -> list[str]:
    ev = e.evidence
    held = f", held by {e.held_by}" if e.held_by else ""
    marks = "marks the machine bad" if e.marks_bad else "does not mark the machine bad"
    out = [f"  instance {e.instance_id}" + (f" (contract {e.contract_id})" if e.contract_id else "")
           + (f", pool {e.pool}" if e.pool else "") + f", judged {e.at}",
           f"    verdict:   {e.verdict} (blame: {e.blame}{held}; {marks})",
           f"    reason:    {e.reason}"]
    rate = "-" if e.proofs_per_hour is None else f"{e.proofs_per_hour:g} proofs/h"
    spp = f" ({e.seconds_per_proof:g} s/proof)" if e.seconds_per_proof is not None else ""
    minimum = "-" if e.min_rate_proofs_per_hour is None else f"{e.min_rate_proofs_per_hour:g}"
    out.append(f"    rate:      {rate}{spp} vs min {minimum}")
    out.append(f"    exit code: {_show(ev.get('exit_code'))}   phase: {_show(ev.get('phase'))}"
               + (f"   signature: {e.signature}" if e.signature else ""))
    out.append(f"    image:     {_show(e.image_digest or ev.get('image_digest'))}")
    log_tail = ev.get("log_tail")
    if isinstance(log_tail, list) and log_tail and tail:
        shown = log_tail[-tail:]
        out.append(f"    log tail ({len(shown)} of {len(log_tail)} line(s)):")
        out += [f"      | {line}" for line in shown]
    return out


def _show(value: object) -> str:
    return "-" if value is None else str(value)
