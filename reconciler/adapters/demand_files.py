"""fleet-spec/demand/<pool>/<YYYY-MM-DD>.csv: the leader's demand samples, one compacted file per pool per day.

Place in the flow: `flows.demand.DemandRecorder` merges each pass's samples (`domain.demand`) into the day's file
of the freshly synced tree and commits it with the pass (at most once per flush interval when nothing else is
committed); `fleet plan --what-if` reads the files of its window. Bot-owned: humans do not edit them.

Why in git: the PR job that answers "what would this PR have done?" has the repository and no controller
database. A day of one pool at one sample a minute is at most 1,440 lines of ~100 bytes (steady minutes merge
into one line), and files older than the retention are deleted, so the tree stays bounded.

One line per tile, CSV with a header (a missing column reads as its default, an unknown one is kept):

    at,span_s,desired,slots,draining,serving,on_the_way,stopped,draining_serving,busy_s,wall_s,proofs,usd_h,...
    2026-12-01T10:05:00Z,60,6,6,0,5,1,0,0,297.5,300,12,2.7,0,PoRep=3,PoRep=5,420,ok,,...
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from operator import itemgetter
from pathlib import Path, PurePosixPath

from reconciler.domain.capacity import Utilization
from reconciler.domain.demand import PoolSample, compact
from reconciler.domain.observations import format_time, parse_time

DEMAND_DIR = "demand"
COLUMNS = ("at", "span_s", "desired", "slots", "draining", "serving", "on_the_way", "stopped", "draining_serving",
           "busy_s", "wall_s", "proofs", "usd_h", "unpriced", "waiting", "running", "oldest_s", "queue", "upcoming",
           "up", "down", "paused", "exhausted", "image", "changed", "heard_s", "back_s", "silent_s", "unheard",
           "memory_s", "market", "quiet_s", "overdue")
HEADER = ("# Demand samples of one pool for one UTC day, written by the fleet's leader (bot); read by `fleet plan "
          "--what-if`.\n# One line per tile since the previous sample; steady tiles are merged. Do not edit.\n")
_POOL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_DAY = re.compile(r"(\d{4}-\d\d-\d\d)\.csv\Z")


class DemandFileError(ValueError):
    """A line or value of a demand file that cannot be read; names the file, line and column."""


def day_path(pool: str, day: date) -> str:
    """The file of `pool` for `day`, relative to the spec directory."""
    if ".." in pool or not _POOL.fullmatch(pool):
        raise DemandFileError(f"pool name {pool!r} cannot name a demand file")
    return f"{DEMAND_DIR}/{pool}/{day.isoformat()}.csv"


def _num(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _counts(values: Mapping[str, int] | None) -> str:
    if values is None:
        return "-"
    return ";".join(f"{k}={v}" for k, v in sorted(values.items()))


def _use(u: Utilization | None) -> str:
    return "" if u is None else f"{_num(u.busy_s)}/{_num(u.wall_s)}/{u.machines}/{_num(u.window_s)}"


def _row(s: PoolSample) -> list[str]:
    queue = "" if s.waiting is None and not s.queue_error else ("error" if s.queue_error else "ok")
    return [format_time(s.at), _num(s.span_s), str(s.desired), str(s.slots), str(s.draining), str(s.serving),
           str(s.on_the_way), str(s.stopped), str(s.draining_serving), _num(s.busy_s), _num(s.wall_s), str(s.proofs),
           _num(s.usd_per_hour), str(s.unpriced), _counts(s.waiting), _counts(s.running),
           "" if s.oldest_wait_s is None else _num(s.oldest_wait_s), queue,
           "" if s.upcoming is None else str(s.upcoming), _use(s.up), _use(s.down), str(int(s.paused)),
           str(int(s.exhausted)), s.image, str(int(s.changed)), _opt(s.heard_s), _opt(s.back_s), _opt(s.silent_s),
           str(int(s.unheard)), _opt(s.memory_s),
           "" if s.market is None else json.dumps(dict(s.market), sort_keys=True, separators=(",", ":")),
           _opt(s.quiet_s), str(int(s.overdue))]


def _opt(value: float | None) -> str:
    return "" if value is None else _num(value)


def render_day(samples: Iterable[PoolSample]) -> str:
    """The text of one day file (the samples compacted, in time order)."""
    rows = compact(samples)
    extra = sorted({k for s in rows for k in s.extra})
    out = io.StringIO()
    out.write(HEADER)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COLUMNS, *extra])
    for s in rows:
        writer.writerow(_row(s) + [s.extra.get(k, "") for k in extra])
    return out.getvalue()


def parse_day(text: str, pool: str, file: str) -> tuple[list[PoolSample], list[str]]:
    """The samples of one day file, and a problem (file, line, what) for each line that cannot be read: such a
    line is skipped, never guessed (the replay counts it)."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    if not lines:
        return [], []
    reader = csv.reader(lines)
    header = next(reader)
    if header[:2] != ["at", "span_s"]:
        return [], [f"{file}: no header line starting with at,span_s: not a demand file"]
    samples: list[PoolSample] = []
    problems: list[str] = []
    # A line reads as dict(zip(header, cells)) would: a column named twice is its last cell, a short line's missing
    # cells are their columns' defaults, a long line's extra cells are not read. The columns' places are found once
    # per file; a line with every header cell (the writer's) takes them in one step.
    place = {name: i for i, name in enumerate(header)}
    extra_places = [(k, place[k]) for k in dict.fromkeys(header) if k not in _COLUMN_SET]
    width = len(header)
    take = itemgetter(*(place[k] for k in COLUMNS)) if all(k in place for k in COLUMNS) else None
    for number, cells in enumerate(reader, start=2):
        if take is not None and len(cells) >= width:
            values = take(cells)
            extra = {k: cells[i] for k, i in extra_places if cells[i]} if extra_places else {}
        else:
            doc = dict(zip(header, cells, strict=False))
            values = tuple(doc.get(k, _MISSING.get(k, "")) for k in COLUMNS)
            extra = {k: doc[k] for k, _ in extra_places if doc.get(k)}
        try:
            samples.append(_sample(pool, values, extra))
        except (DemandFileError, ValueError, KeyError) as exc:
            problems.append(f"{file}: data line {number - 1}: {exc}")
    return samples, problems


_COLUMN_SET = frozenset(COLUMNS)
#: What a column the file does not have reads as (every other one: "").
_MISSING = {"waiting": "-", "running": "-"}


def _integer(text: str, key: str) -> int:
    if text == "":
        return 0
    value = int(text)
    if value < 0:
        raise DemandFileError(f"{key} {text!r} is negative")
    return value


def _number(text: str, key: str) -> float:
    if text == "":
        return 0.0
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise DemandFileError(f"{key} {text!r} is not a finite number >= 0")
    return value


def _optional(text: str, key: str) -> float | None:
    return _number(text, key) if text != "" else None


def _task_counts(text: str, key: str) -> dict[str, int] | None:
    if text == "-":
        return None
    out: dict[str, int] = {}
    for part in filter(None, text.split(";")):
        kind, _, n = part.partition("=")
        if not kind or not n.isdigit():
            raise DemandFileError(f"{key} {text!r}: expected Type=count;Type=count")
        out[kind] = int(n)
    return out


def _utilization(text: str, key: str) -> Utilization | None:
    if not text:
        return None
    parts = text.split("/")
    if len(parts) != 4:
        raise DemandFileError(f"{key} {text!r}: expected busy_s/wall_s/machines/window_s")
    values = [float(p) for p in parts]
    if any(not v >= 0 for v in values):
        raise DemandFileError(f"{key} {text!r}: negative")
    return Utilization(values[0], values[1], int(values[2]), values[3])


def _sample(pool: str, values: tuple[str, ...], extra: Mapping[str, str]) -> PoolSample:
    """One line: `values` are its cells of COLUMNS, in that order; `extra`: the set cells of the file's columns
    beyond COLUMNS (kept)."""
    (at_text, span_s, desired, slots, draining, serving, on_the_way, stopped, draining_serving, busy_s, wall_s,
     proofs, usd_h, unpriced, waiting, running, oldest_s, queue, upcoming, up, down, paused, exhausted, image,
     changed, heard_s, back_s, silent_s, unheard, memory_s, market_text, quiet_s, overdue) = values
    try:
        at = parse_time(at_text)
    except ValueError:
        raise DemandFileError(f"at {at_text!r} is not an RFC 3339 time") from None
    market = None
    if market_text:
        try:
            market = json.loads(market_text)
        except ValueError:
            raise DemandFileError(f"market {market_text[:60]!r} is not JSON") from None
        if not isinstance(market, dict):
            raise DemandFileError("market: expected a JSON object")
    if queue not in ("", "ok", "error"):
        raise DemandFileError(f"queue {queue!r}: expected ok, error or nothing")
    return PoolSample(
        pool=pool, at=at, span_s=_number(span_s, "span_s"), desired=_integer(desired, "desired"),
        slots=_integer(slots, "slots"), draining=_integer(draining, "draining"), serving=_integer(serving, "serving"),
        on_the_way=_integer(on_the_way, "on_the_way"), stopped=_integer(stopped, "stopped"),
        draining_serving=_integer(draining_serving, "draining_serving"), busy_s=_number(busy_s, "busy_s"),
        wall_s=_number(wall_s, "wall_s"), proofs=_integer(proofs, "proofs"), usd_per_hour=_number(usd_h, "usd_h"),
        unpriced=_integer(unpriced, "unpriced"), waiting=_task_counts(waiting, "waiting"),
        running=_task_counts(running, "running"), oldest_wait_s=_number(oldest_s, "oldest_s") if oldest_s else None,
        queue_error=queue == "error", upcoming=_integer(upcoming, "upcoming") if upcoming else None,
        up=_utilization(up, "up"), down=_utilization(down, "down"), paused=paused == "1",
        exhausted=exhausted == "1", image=image, changed=changed == "1",
        heard_s=_optional(heard_s, "heard_s"), back_s=_optional(back_s, "back_s"),
        silent_s=_optional(silent_s, "silent_s"), unheard=unheard == "1", memory_s=_optional(memory_s, "memory_s"),
        market=market, quiet_s=_optional(quiet_s, "quiet_s"), overdue=overdue == "1", extra=extra)


def merged_day(existing: str | None, pool: str, file: str, new: Iterable[PoolSample]) -> str:
    """A day file's text with `new` samples added (an unreadable line of the old text is dropped: it is in
    git history, and a merge must not stop the leader's commits)."""
    old, _ = parse_day(existing, pool, file) if existing else ([], [])
    return render_day([*old, *new])


@dataclass(frozen=True)
class DemandHistory:
    """Every pool's samples in a window, read from the day files, with what could not be read."""

    samples: Mapping[str, tuple[PoolSample, ...]] = field(default_factory=dict)
    files: int = 0
    problems: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.samples.values())


def days_between(since: datetime, until: datetime) -> list[date]:
    first, last = since.date(), until.date()
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def load_demand(spec_dir: Path, since: datetime, until: datetime) -> DemandHistory:
    """The samples of every pool's day files that cover [since, until] (tiles ending in it)."""
    root = spec_dir / DEMAND_DIR
    if not root.is_dir():
        return DemandHistory()
    wanted = {d.isoformat() for d in days_between(since, until + timedelta(days=1))}
    texts: dict[str, list[tuple[str, str]]] = {}
    for pool_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for file in sorted(pool_dir.iterdir()):
            m = _DAY.fullmatch(file.name)
            if m and m.group(1) in wanted:
                texts.setdefault(pool_dir.name, []).append(
                    (f"{DEMAND_DIR}/{pool_dir.name}/{file.name}", file.read_text(encoding="utf-8")))
    return parse_history(texts, since, until)


def parse_history(texts: Mapping[str, Iterable[tuple[str, str]]], since: datetime, until: datetime) -> DemandHistory:
    """`load_demand` from (file name, text) pairs per pool (a working tree, or blobs read from git)."""
    samples: dict[str, tuple[PoolSample, ...]] = {}
    problems: list[str] = []
    files = 0
    for pool, items in texts.items():
        found: list[PoolSample] = []
        for name, text in items:
            files += 1
            got, bad = parse_day(text, pool, name)
            problems += bad
            found += [s for s in got if since < s.at <= until]
        samples[pool] = tuple(sorted(found, key=lambda s: s.at))
    return DemandHistory(samples, files, tuple(problems))


def stale_days(names: Iterable[str], keep_before: date) -> list[str]:
    """Of day-file paths (relative to the spec directory), those older than `keep_before`: the recorder deletes
    them (a bounded tree)."""
    out = []
    for name in names:
        path = PurePosixPath(name)
        m = _DAY.fullmatch(path.name)
        if m and path.parts[0] == DEMAND_DIR and m.group(1) < keep_before.isoformat():
            out.append(name)
    return sorted(out)


def last_sample_at(read: Callable[[str], str | None], pool: str, now: datetime) -> datetime | None:
    """The newest sample of `pool` in today's or yesterday's file (`read`: a file of the spec directory, None when
    absent): where a new leader's first tile starts."""
    for day in (now.date(), now.date() - timedelta(days=1)):
        text = read(day_path(pool, day))
        if text is not None:
            got, _ = parse_day(text, pool, day_path(pool, day))
            older = [s.at for s in got if s.at <= now]
            if older:
                return max(older)
    return None
