"""Adapters that hold one outside resource until `close()` (the git adapter's helper processes, the record
index's database, the vast.ai client's connection pool) are context managers the same way: the block's end closes.

Place in the flow: a base every adapter may use; it imports nothing of the package, so adapters that use it stay
independent of each other.
"""

from __future__ import annotations

from typing import Self


class Closing:
    """`with adapter:` closes it at the block's end, whatever ended the block; the subclass says what `close` ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
