"""Escaped terminal sequences read like raw ones where logs are judged: the controller escapes control
characters at ingest (domain/redact.py), and the signature reader (domain/signatures.py's clean_line) strips
colour and title sequences in both forms, so a coloured cuzk error line is judged the same either way."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reconciler.domain.redact import escape_controls
from reconciler.domain.signatures import clean_line, read_tail

SEQUENCES = st.sampled_from(["\x1b[31m", "\x1b[0m", "\x1b[1;33m", "\x1b[?25l", "\x9b1m", "\x1b]0;title\x07",
                             "\x1b]52;c;aGVsbG8=\x1b\\", "\r"])
TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e, exclude_characters="\\"), max_size=20)


@given(st.lists(SEQUENCES | TEXT, max_size=8).map("".join))
def test_a_line_reads_the_same_raw_and_escaped(line: str) -> None:
    assert clean_line(escape_controls(line)) == clean_line(line)


def test_a_coloured_cuzk_panic_is_read_the_same_after_ingest() -> None:
    tail = ["\x1b[2m2026-12-02T10:00:00Z\x1b[0m \x1b[31mERROR\x1b[0m cuzk_core::prover: proving failed",
            "thread 'worker-0' panicked at /build/supraseal-c2/src/lib.rs:341:9:",
            "\x1b[1msppark::Error #-700\x1b[0m\r"]
    assert [line.text for line in read_tail([escape_controls(x) for x in tail])] == \
        [line.text for line in read_tail(tail)]
