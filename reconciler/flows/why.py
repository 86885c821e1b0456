"""Why: the audit trail of one machine, read from git.

Every commit whose `Fleet-Machine` trailer names the machine, newest first, with the evidence of its
verdict taken from the machine record as of that commit (the entry whose instance id the commit's
`Fleet-Instance` trailer names), plus the record's current status on the checked-out branch. Works in
any plain clone: it reads the checked-out branch, not the bot's remote-tracking ref.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from reconciler.adapters.git import LastChange, VerdictCommit
from reconciler.adapters.record_history import RecordHistoryParser
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
            last_change: LastChange | None, now: datetime | None = None) -> MachineHistory:
    """Pure: the commits and record texts git gave us -> what to tell the human. With `now`, the status says
    where the machine stands (bad until its expiry, on probation, permanent, banned)."""
    # The versions (and the current text, usually the newest version again) share most lines: each is parsed once.
    history = RecordHistoryParser(Path(record_path))
    verdicts = tuple(_evidence(history, record_path, c) for c in commits)
    detail = None
    if current_text is not None:
        try:
            record = history.parse(current_text)
        except RecordError as exc:
            status, detail = "unreadable", str(exc)
        else:
            status = record.status
            if now is not None:
                standing = record.standing(now)
                if standing.state != record.status:
                    status = f"{record.status}, {standing.state} now"
                if standing.state != record.status or standing.until is not None:
                    detail = standing.detail  # expiry, probation, permanence: the rest is said by the status
    elif commits or last_change is not None:
        status = "deleted"
        detail = "pardoned by deletion: the reconciler records this machine again only on a new failure"
    else:
        status = "unknown"
    return MachineHistory(machine_id, record_path, status, detail, last_change, verdicts)


def _evidence(history: RecordHistoryParser, record_path: str, commit: VerdictCommit) -> VerdictEvidence:
    instances = commit.trailers.get("Fleet-Instance", ())
    serving = commit.trailers.get("Fleet-Serving-Instance", ())  # verdicts while serving (degraded, lost)
    if commit.record_text is None:
        return VerdictEvidence(commit, (), f"{record_path} does not exist in this commit")
    try:
        record = history.parse(commit.record_text)
    except RecordError as exc:
        return VerdictEvidence(commit, (), f"record unreadable in this commit: {exc}")
    entries = tuple(b for b in record.benchmarks
                    if (b.instance_id in instances and b.stage != "serving")
                    or (b.instance_id in serving and b.stage == "serving"))
    if entries:
        return VerdictEvidence(commit, entries, None)
    named = ", ".join((*instances, *serving)) or "none"
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
    setting = ev.get("setting")
    change = f"    change:    {setting}" if isinstance(setting, str) else None
    out = [f"  instance {e.instance_id}" + (f" (contract {e.contract_id})" if e.contract_id else "")
           + (f", pool {e.pool}" if e.pool else "") + f", judged {e.at}",
           f"    root cause: {e.reason}",  # first (issue 14): phase, exit code, proofs, the error line
           f"    verdict:   {e.verdict} (blame: {e.blame}{held}; {marks})",
           *([change] if change else [])]
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
        out += [f"      | {line}" for line in daemon_log[-tail:]]
    log_tail = ev.get("log_tail")
    if isinstance(log_tail, list) and log_tail and tail:
        shown = log_tail[-tail:]
        out.append(f"    log tail ({len(shown)} of {len(log_tail)} line(s)):")
        out += [f"      | {line}" for line in shown]
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
