"""Many versions of one machine record, parsed once per distinct line (for `fleet why`).

Place in the flow: `fleet why` (cli.why) reads historical versions of a record from git (one per verdict
commit whose entries are gone from today's record) and parses each here before `flows.why` reads them. The
versions of one record share almost all of their text: a verdict adds one entry line to the entries already
there, so 600 versions of a record capped at 30 entries hold ~9,000 entry lines but only a few dozen distinct
ones. Parsing each version whole costs ~0.4 ms of JSON decoding and schema checking per version; this parses
each distinct (header, entry line) once.

Why that reads the same record: in the format `record_files` writes (its machine fields, a `benchmarks:`
line, then one `- {...}` line per entry) each entry line is a complete YAML flow mapping whose meaning does
not depend on the lines around it, and the machine fields end at the `benchmarks:` line. So the version
means its header's fields plus, in order, what each line means when it stands alone under that header.
A line stands alone only if the one-entry record made of the header and that line parses and passes the
schema; a piece that does not (an entry spread over several lines, a hand edit in block style, anything
the schema refuses) sends the whole version through `parse_machine_record`, so errors and odd texts are
read exactly as before. The differential test (tests/unit/test_record_history.py) holds the two equal.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from reconciler.adapters.record_codec import ENTRIES_KEY
from reconciler.adapters.record_files import parse_machine_record
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordError

_ENTRIES_LINE = f"{ENTRIES_KEY}:"


class RecordHistoryParser:
    """Parses versions of the record at `file`; keep one per record for the whole history."""

    def __init__(self, file: Path) -> None:
        self._file = file
        self._headers: dict[str, MachineRecord] = {}
        self._entries: dict[tuple[str, str], BenchmarkEntry] = {}

    def parse(self, text: str) -> MachineRecord:
        """The record in `text`, exactly as `parse_machine_record(text, file)` reads it, or its RecordError."""
        split = _split(text)
        if split is None:
            return parse_machine_record(text, self._file)
        header, lines = split
        try:
            record = self._header(header)
            entries = tuple(self._entry(header, line) for line in lines)
        except _NotAlone:
            return parse_machine_record(text, self._file)  # the whole text: its own meaning or its own error
        return replace(record, benchmarks=entries)

    def _header(self, header: str) -> MachineRecord:
        record = self._headers.get(header)
        if record is None:
            record = self._alone(f"{header}{_ENTRIES_LINE} []\n", 0)
            self._headers[header] = record
        return record

    def _entry(self, header: str, line: str) -> BenchmarkEntry:
        key = (header, line)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._alone(f"{header}{_ENTRIES_LINE}\n{line}\n", 1).benchmarks[0]
            self._entries[key] = entry
        return entry

    def _alone(self, text: str, entries: int) -> MachineRecord:
        try:
            record = parse_machine_record(text, self._file)
        except RecordError:
            raise _NotAlone from None
        if len(record.benchmarks) != entries:
            raise _NotAlone
        return record


class _NotAlone(Exception):
    """A piece that does not parse on its own: the version is read whole."""


def _split(text: str) -> tuple[str, list[str]] | None:
    """(the text up to the `benchmarks:` line, the entry lines), or None if the text is not in that shape."""
    if "\r" in text:  # universal newlines are the whole parser's business
        return None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    try:
        at = lines.index(_ENTRIES_LINE)
    except ValueError:
        return None
    entries = lines[at + 1:]
    if not entries or not all(line.startswith("- {") and line.endswith("}") for line in entries):
        return None
    return "".join(f"{line}\n" for line in lines[:at]), entries
