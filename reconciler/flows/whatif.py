"""`fleet plan --what-if`: load the last days of the fleet's history from git, replay them under the base spec and
the PR's spec (`domain.whatif`).

Place in the flow: the CLI (`cli/plan.py`) calls `what_if_of_repo`; it reads, through the git adapter, what the
base branch (`base_ref`) recorded in the window: the machine and image records (the working tree's, with any
record the PR edits read back from the base), every first-parent commit that changed the spec or a record (a
human's pardon, ban or cleared suspect is applied when it reached the branch; a deleted record keeps its last
version), the spec in force at the window's start and each change of it, capacity.yaml at the start and the
demand day files. All from git: the PR job has the repository and no controller database.

The replays take a core each for tens of seconds at fleet size: the specs as they were (the self-check's run) are
replayed in a forked child while this process replays the PR's spec (`adapters.forked`); the child sends back
what the comparison reads of its run (`domain.whatif.RecordedReplay`: its summary and the self-check), not the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath

from reconciler.adapters.capacity_files import CAPACITY_FILE, parse_capacity
from reconciler.adapters.collector import collector_paused
from reconciler.adapters.demand_files import DEMAND_DIR, days_between, parse_history
from reconciler.adapters.forked import ForkedCall
from reconciler.adapters.git import BOT_NAME, GitReader, GitStoreError
from reconciler.adapters.record_files import parse_image_record, parse_machine_record
from reconciler.adapters.record_index import load_indexed, read_evidence
from reconciler.adapters.spec_files import check_spec_text
from reconciler.domain.capacity import CapacityEntry
from reconciler.domain.records import IMAGES_DIR, MACHINES_DIR, ImageSuspectRecord, MachineRecord, RecordError
from reconciler.domain.replay import Attempt, History, RecordEdit, SpecVersion, attempts
from reconciler.domain.spec import FleetSpec
from reconciler.domain.whatif import (
    Runs,
    WhatIf,
    needs_policy_runs,
    policy_runs,
    recorded_replay,
    runs_of,
    summarize,
    what_if,
)


class WhatIfError(Exception):
    """The history cannot be read at all (no git checkout, no such ref, no spec at the window's start)."""


@dataclass(frozen=True)
class WhatIfInputs:
    """What `what_if_of_repo` read, for the output's header."""

    base_ref: str
    base_sha: str
    history: History
    base_spec: FleetSpec


def load_history(repo: GitReader, spec_dir: Path, base_ref: str, since: datetime,
                 until: datetime) -> tuple[History, FleetSpec, str]:
    """The window [since, until] of `base_ref`'s history, its spec (the base) and its commit."""
    spec_rel = PurePosixPath(spec_dir.resolve().relative_to(repo.workdir.resolve()).as_posix())
    try:
        sha = repo.resolve(base_ref)
    except GitStoreError as exc:
        raise WhatIfError(f"--base {base_ref}: not a commit here ({exc})") from None
    spec_file, capacity_file = f"{spec_rel}/fleet.yaml", f"{spec_rel}/{CAPACITY_FILE}"
    machines_dir, images_dir = f"{spec_rel}/{MACHINES_DIR}", f"{spec_rel}/{IMAGES_DIR}"
    problems: list[str] = []

    start = repo.commit_before(sha, since.timestamp())

    # git lists the window's commits (seconds at fleet size: a tree diff per commit) in a process of its own while
    # this one reads the records and the demand samples.
    with repo.start_window(sha, since.timestamp(), [spec_file, machines_dir, images_dir]) as listing:
        # Records as the base holds them: the working tree's, and the base's version of any the PR edits.
        records = load_indexed(spec_dir)
        record_problems = list(records.problems)
        machines: dict[str, MachineRecord] = {}
        for rec in records.machines.values():
            if any(_after(e.at, since) for e in rec.benchmarks):
                machines[rec.machine_id] = rec
        images: dict[str, ImageSuspectRecord] = dict(records.images)
        edited_by_pr = repo.changed_in_worktree(sha, [machines_dir, images_dir])
        base_texts = repo.blobs([f"{sha}:{p}" for p in edited_by_pr])
        for path in edited_by_pr:
            _put(path, base_texts.get(f"{sha}:{path}"), machines, images, machines_dir, record_problems, since)

        demand_paths = [p for p in repo.files_under(sha, f"{spec_rel}/{DEMAND_DIR}")
                        if PurePosixPath(p).stem in {d.isoformat() for d in days_between(since, until)}]
        demand_texts = repo.blobs([f"{sha}:{p}" for p in demand_paths])
        by_pool: dict[str, list[tuple[str, str]]] = {}
        for p in demand_paths:
            text = demand_texts.get(f"{sha}:{p}")
            if text is not None:
                by_pool.setdefault(PurePosixPath(p).parent.name, []).append((p, text))
        demand = parse_history(by_pool, since, until)
        # The window's entries' evidence (the attempts' phases, the rates the judge reads again) is read from the
        # record files on first use: read here, while git still lists, and once for both replays' processes.
        read_evidence(machines.values())
        # Commits after `until` (a replay "as of" an earlier time) are the future: not read.
        commits = [c for c in listing.result() if c.at <= until.timestamp()]

    first = start or (commits[0].sha if commits else sha)
    found = repo.blobs([f"{first}:{spec_file}", f"{first}:{capacity_file}", f"{sha}:{spec_file}"])
    base_spec = _spec(found.get(f"{sha}:{spec_file}"), f"{base_ref}:{spec_file}", problems)
    first_spec = _spec(found.get(f"{first}:{spec_file}"), f"{first[:12]}:{spec_file}", problems)
    if base_spec is None:
        raise WhatIfError(f"no readable spec at {base_ref}:{spec_file}: {'; '.join(problems)}")
    specs = [SpecVersion(since, first_spec or base_spec)]
    capacity_start: dict[str, CapacityEntry] = {}
    if found.get(f"{first}:{capacity_file}") is not None:
        entries, cap_problems = parse_capacity(found[f"{first}:{capacity_file}"], capacity_file)
        capacity_start = entries
        problems += [f"{p} (capacity at the window's start)" for p in map(str, cap_problems)]
    problems += record_problems

    # What changed in the window: spec versions, humans' record edits, deleted records.
    wanted = []
    for c in commits:
        for status, path in c.changes:
            if path == spec_file:
                wanted.append(f"{c.sha}:{path}")
            elif _record_path(path, machines_dir, images_dir) and (c.author != BOT_NAME or status == "D"):
                if status != "D":
                    wanted.append(f"{c.sha}:{path}")
                if status != "A" and c.parent:
                    wanted.append(f"{c.parent}:{path}")
    texts = repo.blobs(wanted)
    edits: list[RecordEdit] = []
    for c in commits:
        at = datetime.fromtimestamp(c.at, since.tzinfo)
        for status, path in c.changes:
            if path == spec_file:
                spec = _spec(texts.get(f"{c.sha}:{path}"), f"{c.sha[:12]}:{path}", problems)
                if spec is not None:
                    specs.append(SpecVersion(at, spec))
                continue
            if not _record_path(path, machines_dir, images_dir) or (c.author == BOT_NAME and status != "D"):
                continue
            before = _parse(path, texts.get(f"{c.parent}:{path}"), machines_dir, problems) if c.parent else None
            after = _parse(path, texts.get(f"{c.sha}:{path}"), machines_dir, problems) if status != "D" else None
            if status == "D" and isinstance(before, MachineRecord):
                _keep_deleted(before, machines, since)
            name = PurePosixPath(path).stem
            if path.startswith(machines_dir + "/"):
                edits.append(RecordEdit(at, name, None, before, after))
            else:
                edits.append(RecordEdit(at, None, f"sha256:{name}", before, after))
    problems += list(demand.problems)
    history = History(since=since, until=until, machines=machines, images=images, edits=tuple(edits),
                      specs=tuple(specs), capacity_start=capacity_start, demand=demand.samples,
                      problems=tuple(problems))
    return history, base_spec, sha


def what_if_of_repo(spec_path: Path, base_ref: str, days: float, until: datetime, *,
                    meanwhile: Callable[[], None] = lambda: None) -> tuple[WhatIf, WhatIfInputs]:
    """The PR's spec (the file at `spec_path`) against `base_ref`'s over the last `days` before `until`.
    `meanwhile`: the caller's own work, done once, while the forked child finishes its replay (where there is one;
    this process would only wait then)."""
    problems: list[str] = []
    try:
        text = spec_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WhatIfError(f"{spec_path}: cannot read: {exc}") from None
    pr_spec = _spec(text, str(spec_path), problems)
    if pr_spec is None:
        raise WhatIfError("; ".join(problems))
    # The history and three replays of it allocate millions of objects that live until the answer is out.
    with collector_paused():
        try:
            repo = GitReader.discover(spec_path.parent)
            since = until - timedelta(days=days)
            history, base_spec, sha = load_history(repo, spec_path.parent, base_ref, since, until)
        except GitStoreError as exc:
            raise WhatIfError(str(exc)) from None
        found, runs = replays_on_two_cores(history, base_spec, pr_spec, meanwhile=meanwhile)
        return what_if(history, base_spec, pr_spec, found=found, runs=runs), WhatIfInputs(base_ref, sha, history,
                                                                                           base_spec)


def replays_on_two_cores(history: History, base: FleetSpec, pr: FleetSpec, *, fork: bool | None = None,
                         meanwhile: Callable[[], None] = lambda: None) -> tuple[list[Attempt], Runs | None]:
    """The window's attempts, and its runs summarized: the recorded run replayed, summarized and self-checked in a
    forked child while this process replays the base's and the PR's specs (the PR's run then decides everything
    itself rather than take over the recorded run's decisions: the same answer). Runs None: one replay is all
    there is, or there is no child to run it (`what_if` replays them one after the other).

    The child sends back only what the comparison reads (`RecordedReplay`: its run's fates by instance id, the
    totals, the self-check), not its run. `meanwhile` is called once on every path: after this process's replays
    and their summaries, before waiting for the child's."""
    if not needs_policy_runs(history, base, pr):
        meanwhile()
        return attempts(history), None
    with ForkedCall(lambda: recorded_replay(history, base, pr, attempts(history)), fork=fork) as child:
        found = attempts(history)
        if child.ran_here is not None:
            meanwhile()
            return found, None
        base_run, pr_run = policy_runs(history, base, pr, found, recorded=None)
        base_summary, pr_summary = (None if run is None else summarize(run, history, base, pr)
                                    for run in (base_run, pr_run))
        del base_run, pr_run  # (what the comparison reads of them is in their summaries)
        meanwhile()
        recorded = child.result()
    return found, runs_of(recorded, base_summary, pr_summary)


def _spec(text: str | None, name: str, problems: list[str]) -> FleetSpec | None:
    if text is None:
        return None
    spec, found = check_spec_text(text, name)
    if spec is None:
        problems.append(f"{name}: unreadable spec version, the one before it stays in force: "
                        + "; ".join(str(p) for p in found if p.severity == "error")[:300])
    return spec


def _record_path(path: str, machines_dir: str, images_dir: str) -> bool:
    return path.endswith(".yaml") and (path.startswith(machines_dir + "/") or path.startswith(images_dir + "/"))


def _parse(path: str, text: str | None, machines_dir: str,
           problems: list[str]) -> MachineRecord | ImageSuspectRecord | None:
    if text is None:
        return None
    try:
        if path.startswith(machines_dir + "/"):
            return parse_machine_record(text, Path(path))
        return parse_image_record(text, Path(path))
    except RecordError as exc:
        problems.append(f"{path}: {exc}")
        return None


def _put(path: str, text: str | None, machines: dict[str, MachineRecord], images: dict[str, ImageSuspectRecord],
         machines_dir: str, problems: list[str], since: datetime) -> None:
    """The base's version of a record the PR edits (None: the PR added it; the base has none)."""
    name = PurePosixPath(path).stem
    rec = _parse(path, text, machines_dir, problems)
    if path.startswith(machines_dir + "/"):
        machines.pop(name, None)
        if isinstance(rec, MachineRecord) and any(_after(e.at, since) for e in rec.benchmarks):
            machines[name] = rec
    else:
        images.pop(f"sha256:{name}", None)
        if isinstance(rec, ImageSuspectRecord):
            images[rec.image_digest] = rec


def _keep_deleted(rec: MachineRecord, machines: dict[str, MachineRecord], since: datetime) -> None:
    """A record deleted in the window (a pardon): its last version's entries are history too."""
    if not any(_after(e.at, since) for e in rec.benchmarks):
        return
    now = machines.get(rec.machine_id)
    if now is None:
        machines[rec.machine_id] = rec
        return
    known = {(e.instance_id, e.at) for e in now.benchmarks}
    older = tuple(e for e in rec.benchmarks if (e.instance_id, e.at) not in known)
    machines[rec.machine_id] = MachineRecord(now.machine_id, now.status, now.host_id or rec.host_id,
                                             now.gpu_name or rec.gpu_name, now.note,
                                             tuple(sorted((*older, *now.benchmarks), key=lambda e: e.at)))


def _after(at: str, since: datetime) -> bool:
    try:
        value = datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        return False
    return value.tzinfo is not None and value >= since
