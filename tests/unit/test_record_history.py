"""`RecordHistoryParser` (for `fleet why`) reads every version of a record exactly as `parse_machine_record`.

Differential: a history of versions of one record - as the reconciler writes them, then edited by hand in the
ways that break the one-entry-per-line shape (an entry spread over lines, block style, comments, a header
that swallows the entries, a stray character anywhere, CRLF) - is read by one parser, version after version,
and each reading must equal the whole-text reading: the same record, or a RecordError with the same message.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.adapters.record_files import parse_machine_record, render_machine_record
from reconciler.adapters.record_history import RecordHistoryParser
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordError

FILE = Path("fleet-spec/machines/40213.yaml")
texts = st.text(alphabet=st.sampled_from([*"ab 09:#'\"\\{}[],-|>&*!%", "\t", "\n", "\u00e9", "\x85"]), max_size=8)


@st.composite
def entries(draw: st.DrawFn) -> BenchmarkEntry:
    return BenchmarkEntry(
        instance_id=draw(st.sampled_from(["i-1", "i-2", "i-3", "i-4"])), at=draw(st.sampled_from(
            ["2026-12-02T18:00:00Z", "2026-12-02T19:00:00Z"])),
        verdict=draw(st.sampled_from(["ok", "below-min-rate", "benchmark-error"])),
        blame=draw(st.sampled_from(["none", "machine", "image"])), marks_bad=draw(st.booleans()),
        reason=draw(texts), signature=draw(st.one_of(st.none(), texts)),
        proofs_per_hour=draw(st.one_of(st.none(), st.sampled_from([0.0, 41.5, 1e16]))),
        evidence=draw(st.dictionaries(texts, st.one_of(st.none(), st.integers(-3, 3), texts,
                                                       st.lists(texts, max_size=2)), max_size=3)))


def _record(status: str, note: str | None, benchmarks: list[BenchmarkEntry]) -> MachineRecord:
    return MachineRecord(machine_id="40213", status=status, host_id="7000", gpu_name="RTX 4090", note=note,
                         benchmarks=tuple(benchmarks))


def _edit(text: str, kind: str, at: int, char: str) -> str:
    lines = text.split("\n")
    n = max(1, len(lines) - 1)
    i = at % n
    if kind == "char":  # a stray character anywhere
        pos = at % max(1, len(text))
        return text[:pos] + char + text[pos:]
    if kind == "split-entry" and lines[i].startswith("- {") and ", " in lines[i]:
        lines[i] = lines[i].replace(", ", ",\n  ", 1)  # one entry over two lines: still YAML
    elif kind == "comment":
        lines.insert(i, "# reviewed by a human")
    elif kind == "block-entry":
        lines.insert(i, "- instance_id: i-9\n  at: now\n  verdict: ok\n  blame: none\n  marks_bad: false\n  reason: x")
    elif kind == "open-header":
        lines.insert(1, 'note: "open quote')
    elif kind == "crlf":
        return "\r\n".join(lines)
    elif kind == "drop-brace" and lines[i].endswith("}"):
        lines[i] = lines[i][:-1]
    return "\n".join(lines)


def _read_whole(text: str) -> MachineRecord | str:
    try:
        return parse_machine_record(text, FILE)
    except RecordError as exc:
        return f"RecordError: {exc}"


def _read_history(parser: RecordHistoryParser, text: str) -> MachineRecord | str:
    try:
        return parser.parse(text)
    except RecordError as exc:
        return f"RecordError: {exc}"


edits = st.tuples(st.sampled_from(["none", "char", "split-entry", "comment", "block-entry", "open-header", "crlf",
                                   "drop-brace"]), st.integers(0, 10_000), st.sampled_from([*"{}\"'#:-\t", "\x85"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=st.lists(entries(), min_size=1, max_size=6), steps=st.lists(
    st.tuples(st.sampled_from(["ok", "bad", "pardoned"]), st.one_of(st.none(), st.just("pardoned in PR 7")),
              st.integers(1, 6), st.integers(0, 5), edits), min_size=1, max_size=12))
def test_every_version_reads_as_the_whole_text_reads(
        pool: list[BenchmarkEntry], steps: list[tuple[str, str | None, int, int, tuple[str, int, str]]]) -> None:
    parser = RecordHistoryParser(FILE)  # one parser for the whole history, as `fleet why` uses it
    for status, note, count, start, (kind, at, char) in steps:
        chosen = [pool[(start + k) % len(pool)] for k in range(count)]
        text = _edit(render_machine_record(_record(status, note, chosen)), kind, at, char)
        assert _read_history(parser, text) == _read_whole(text), (kind, text)


def test_a_long_history_parses_each_distinct_line_once() -> None:
    """600 versions of a record growing to 30 entries: 30 distinct entry lines, one header."""
    pool = [BenchmarkEntry(instance_id=f"i-{k}", at="2026-12-02T18:00:00Z", verdict="ok", blame="none",
                           marks_bad=False, reason=f"ok {40 + k}/h", evidence={"log_tail": ["line"] * 14})
            for k in range(30)]
    parser = RecordHistoryParser(FILE)
    versions = [render_machine_record(_record("bad", None, pool[:1 + n % 30])) for n in range(600)]
    for text in versions:
        assert parser.parse(text) == parse_machine_record(text, FILE)
    assert len(parser._entries) == 30 and len(parser._headers) == 1


def test_a_version_that_is_not_a_record_reports_the_whole_texts_error() -> None:
    parser = RecordHistoryParser(FILE)
    good = render_machine_record(_record("bad", None, [BenchmarkEntry(
        instance_id="i-1", at="2026-12-02T18:00:00Z", verdict="ok", blame="none", marks_bad=False, reason="ok")]))
    assert parser.parse(good).benchmarks[0].instance_id == "i-1"
    bad = good.replace('"verdict": "ok"', '"verdict": 7')
    try:
        parser.parse(bad)
    except RecordError as exc:
        assert "$.benchmarks[0].verdict" in str(exc) and str(exc) == _read_whole(bad).removeprefix("RecordError: ")
    else:
        raise AssertionError("a version the schema refuses must raise")
