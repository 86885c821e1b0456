"""Small injected fakes shared across the suite (tests never sleep on real time)."""

from __future__ import annotations


class Sleeps:
    """The injected sleep: records what the code under test asked for and never waits."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
