"""The fleet tree over git: the `FleetTree` port of the reconcile pass (reconciler/flows/judge.py), as a unit of
work on the bot's clone.

`GitFleetTree.publish(build)` asks `GitStore.publish` to sync the clone to the branch tip, hands `build` a view of
that tip (spec, records, capacity entries, what the history judged), and commits and pushes the request `build`
returns; after a refused push GitStore syncs to the new tip and the view, built again, reads that one. The view
reads lazily and once: the spec from fleet.yaml with capacity.yaml applied (validated once per content), the
records through the record index on a process's first pass and the loop's `RecordCache` after it, trailers from
`git log` (GitStore reads only the commits added since the last pass).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from pathlib import Path

from reconciler.adapters.capacity_files import capacity_entries
from reconciler.adapters.git import CommitRequest, GitStore, PublishResult
from reconciler.adapters.record_files import RecordCache
from reconciler.adapters.record_index import load_for_pass
from reconciler.adapters.spec_files import load_spec_cached
from reconciler.domain.capacity import CapacityEntry
from reconciler.domain.records import RecordSet
from reconciler.domain.spec import FleetSpec

#: The spec file inside the fleet repository; record and capacity files live beside it.
SPEC_FILE = "fleet-spec/fleet.yaml"


class TreeView:
    """A checkout of the fleet repository at one tip: `workdir` with the spec file at `spec_file`. Each part is read
    on first use and kept for this tip. `trailer_values`: what the history says (GitStore.trailer_values)."""

    def __init__(self, workdir: Path, spec_file: str, record_cache: RecordCache | None,
                 trailer_values: Callable[[str], Iterable[str]]) -> None:
        self._spec_path = workdir / spec_file
        self._record_cache = record_cache
        self._trailer_values = trailer_values
        self.spec_dir = str(Path(spec_file).parent)

    def spec(self) -> FleetSpec:
        return self._spec

    @cached_property
    def _spec(self) -> FleetSpec:
        # SpecError: the pass stalls with it. Validated once per content (a restart, `--once`: not again).
        return load_spec_cached(self._spec_path)

    def records(self) -> RecordSet:
        return self._records

    @cached_property
    def _records(self) -> RecordSet:
        return load_for_pass(self._spec_path.parent, self._record_cache)

    def capacity(self) -> Mapping[str, CapacityEntry]:
        # load_spec refused a broken capacity.yaml already: this reads the same file again, without problems.
        return capacity_entries(self._spec, self._spec_path)

    def trailer_values(self, key: str) -> frozenset[str]:
        return frozenset(self._trailer_values(key))

    def text(self, path: str) -> str | None:
        file = self._spec_path.parent / path
        try:
            return file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def names(self, directory: str) -> list[str]:
        root = self._spec_path.parent
        found = (root / directory).rglob("*")
        return sorted(str(p.relative_to(root)) for p in found if p.is_file())


class GitFleetTree:
    """`FleetTree` on a `GitStore` clone. `record_cache`: kept by a long-running loop between its passes, so a pass
    parses only the record files that changed since the last one (10,000 files: minutes to parse, milliseconds
    to stat); None for one pass (`--once`)."""

    def __init__(self, git: GitStore, *, spec_file: str = SPEC_FILE, record_cache: RecordCache | None = None) -> None:
        self.git = git
        self.spec_file = spec_file
        self.record_cache = record_cache

    def publish(self, build: Callable[[TreeView], CommitRequest | None], *,
                before_push: Callable[[], None] | None = None) -> PublishResult:
        return self.git.publish(
            lambda workdir: build(TreeView(workdir, self.spec_file, self.record_cache, self.git.trailer_values)),
            before_push=before_push)
