"""Shared pieces of the loop tests: fake report sources (the `ReportSource` port, and one that keeps a change
sequence as the controller stores do: `ChangeFeed`) and a trailer reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from reconciler.domain.observations import InstanceReport
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
