"""The entry type of the code tables: what one numeric code of a tool means and whom it blames.

The tables themselves, each whole and cited: `aria2_codes.py` (aria2c's exit status / errorCode), `curl_codes.py`
(curl's CURLcode), `errnos.py` (every Linux errno as glibc words it and Rust prints it), `exit_statuses.py` (bash's
126/127, 128 + a signal, and the worker's own exit codes). `signatures.py` builds its signatures from them: a line
carrying a code is decided by the signature its entry names. Pure data.

Blame by who can fix it (domain/verdicts.py): the machine (its hardware, driver, disk or network), the image (our
software called the tool or the kernel wrongly), configuration (a pool setting is too small), params (the mirror
or the params set-up), the marketplace (the container was stopped), unknown (the code is specific, but the same
code arises from more than one owner: the other lines, or the fleet, decide). A generic code says only that the
tool stopped (aria2c's "unknown error"): it is shown when nothing better was logged and never decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from reconciler.domain.verdicts import BLAMES


@dataclass(frozen=True)
class Code:
    number: int
    #: The source's own identifier: `RESOURCE_NOT_FOUND`, `CURLE_COULDNT_CONNECT`, `ENOSPC`, `SIGSEGV`, ...
    name: str
    #: The description that goes with the code: the text the tool prints, else its manual's.
    text: str
    #: Whom a failure with this code blames (verdicts.BLAMES); `none` for a success code.
    blame: str
    #: The signature (signatures.py) that decides a line carrying this code; None: it is never a cause.
    signature: str | None
    #: Who can fix it: the reasoning behind `blame`.
    why: str
    #: Says only that something stopped (never decides blame: signatures.GENERIC).
    generic: bool = False
    #: The messages the tool prints with this code, as its source formats them (`%s` for what varies).
    prints: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.blame not in BLAMES:
            raise ValueError(f"code {self.number} {self.name}: blame {self.blame!r} not in {BLAMES}")
        if (self.signature is None) != (self.blame == "none"):
            raise ValueError(f"code {self.number} {self.name}: only a success code has no signature")


def by_number(table: Iterable[Code]) -> dict[int, Code]:
    """The table keyed by number; a number given twice is an error in the table."""
    out: dict[int, Code] = {}
    for code in table:
        if code.number in out:
            raise ValueError(f"code {code.number} twice: {out[code.number].name} and {code.name}")
        out[code.number] = code
    return out


def numbers_of(table: Iterable[Code], signature: str) -> tuple[int, ...]:
    """The codes a signature decides, in order."""
    return tuple(c.number for c in table if c.signature == signature)
