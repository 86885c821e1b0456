"""Shared pieces of the loop tests: fake report sources (the `ReportSource` port, and one that keeps a change
sequence as the controller stores do: `ChangeFeed`), a trailer reader, and the base of the end-to-end worlds
that drive the real loop step by step (`LoopWorld`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from reconciler.adapters.git import GitStore
from reconciler.adapters.record_files import load_records
from reconciler.domain.observations import InstanceReport
from reconciler.domain.records import RecordSet
from tests.gitrepos import git


class FakeReports:
    """The ReportSource port: a list of reports, or the error the store would raise."""

    def __init__(self, reports: Sequence[InstanceReport] = (), error: Exception | None = None) -> None:
        self.items = list(reports)
        self.error = error
        self.calls = 0

    def reports(self) -> Sequence[InstanceReport]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return list(self.items)


@dataclass(frozen=True)
class Changes:
    sequence: int
    instance_ids: tuple[str, ...]
    complete: bool


class FakeFeed(FakeReports):
    """FakeReports with the stores' change sequence: `put` stores a report (new or newer) as one write."""

    def __init__(self, reports: Sequence[InstanceReport] = ()) -> None:
        super().__init__()
        self.sequence = 0
        self.written: dict[str, int] = {}
        self.asked: list[tuple[str, ...]] = []  # the instance ids of every reports_of
        for report in reports:
            self.put(report)

    @classmethod
    def failing(cls, error: Exception) -> FakeFeed:
        feed = cls()
        feed.error = error
        return feed

    def put(self, report: InstanceReport) -> None:
        self.items = [r for r in self.items if r.instance_id != report.instance_id] + [report]
        self.sequence += 1
        self.written[report.instance_id] = self.sequence

    def changes_since(self, since: int) -> Changes:
        if self.error is not None:
            raise self.error
        if since == 0 or since > self.sequence:
            return Changes(self.sequence, tuple(r.instance_id for r in self.items), True)
        return Changes(self.sequence, tuple(i for i, at in self.written.items() if at > since), False)

    def reports_of(self, instance_ids: Sequence[str]) -> list[InstanceReport]:
        self.asked.append(tuple(instance_ids))
        return [r for r in self.items if r.instance_id in set(instance_ids)]


def trailers(origin: Path, key: str) -> list[str]:
    return [v for v in git(origin, "log", f"--format=%(trailers:key={key},valueonly)", "main").split("\n") if v]


class LoopWorld:
    """An end-to-end world around the real loop (serving, owned hosts, the what-if history): a subclass sets
    `bot` (the bot's clone of the fleet repository) and its pacing, `step()` runs one round (apply, then a pass)
    and `explain()` says what the world holds when a wait runs out."""

    bot: GitStore
    deadline_s: float = 150.0  # how long `run_until` waits by default
    poll_s: float = 0.3  # between steps

    def step(self) -> Any:
        raise NotImplementedError

    def explain(self) -> str:
        raise NotImplementedError

    def run_until(self, what: str, predicate: Callable[[Self], bool], timeout_s: float | None = None) -> None:
        timeout = self.deadline_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.step()
            if predicate(self):
                return
            time.sleep(self.poll_s)
        raise AssertionError(f"not reached within {timeout:.0f}s: {what}\n{self.explain()}")

    def records(self) -> RecordSet:
        self.bot.sync()
        return load_records(self.bot.workdir / "fleet-spec")
