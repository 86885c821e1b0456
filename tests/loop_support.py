"""Shared pieces of the loop tests: a fake report source (the `ReportSource` port) and a trailer reader.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def trailers(origin: Path, key: str) -> list[str]:
    return [v for v in git(origin, "log", f"--format=%(trailers:key={key},valueonly)", "main").split("\n") if v]
