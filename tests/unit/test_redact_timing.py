"""Redaction runs in linear time on text a worker chooses (issue 30: the old key-value pattern backtracked in
cubic time, 3.4 s on a 2,048-character line of repeated `token.`, and redaction runs at ingest).

Every pattern meets adversarial lines up to the protocol's 4,096 characters a line: repetitions of the
fragments its regex is made of (trigger words, separators, scheme and flag prefixes, run characters).
Timings are CPU time of this thread (`time.thread_time`), the best of a few runs, so a loaded machine does not
inflate them; the assertions are a growth ratio (8x the text may cost at most 24x the time: linear is 8x,
quadratic 64x) and absolute bounds far above what linear code needs (about 1 ms a line here)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.adapters.controller.protocol import MAX_BODY_BYTES
from reconciler.domain.redact import PATTERNS, Redactor, escape_controls

MAX_LINE = 4096  # fleet-spec/schema/worker-protocol.v1.schema.json: log_batch.lines.items.maxLength

#: Pieces of the patterns' own structure: what an attacker would repeat to make a regex backtrack.
STRUCTURE = ("token.", "token", "a=", "=", ":", "\"", "'", "://", "a://b:", "a:", "@", "/", "-u ", "-p", " ", "eyJ",
             "eyJ-", "eyJa.", "-", ".", "x", "AAAA", "0000", "sk-", "AIza", "sha256:", "-----BEGIN A", "-----END A",
             "PRIVATE KEY-----", "mysql ", "mysql -u", "sshpass ", "config set ", "configure set token ", "--token",
             "--token ", "?sig=", ";", "&", "\x1b[", "\x1b]", "\u202e", "\r", "bearer ", "authorization: ",
             "Zm9v", "+/", "ghp_", "glpat-", "hf_", "xoxb-")
FRAGMENTS = tuple(sorted({*STRUCTURE, *(t for p in PATTERNS for t in p.triggers)}))

REDACTOR = Redactor.with_secrets(["Reg!stry-P4ss-7f3a9", "a-known-secret-value"])


def line_of(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def cpu_seconds(work: Callable[[], object], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.thread_time()
        work()
        best = min(best, time.thread_time() - start)
    return best


@pytest.mark.parametrize("unit", FRAGMENTS, ids=[repr(f) for f in FRAGMENTS])
def test_every_fragment_repeated_costs_linear_time(unit: str) -> None:
    small, big = line_of(unit, MAX_LINE // 8), line_of(unit, MAX_LINE)
    t_small = cpu_seconds(lambda: REDACTOR.line(small))
    t_big = cpu_seconds(lambda: REDACTOR.line(big))
    assert t_big <= 24 * t_small + 0.002, f"{unit!r}: {t_small * 1e3:.2f} ms at {len(small)}, " \
                                          f"{t_big * 1e3:.2f} ms at {len(big)}"
    assert t_big < 0.05


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), min_size=1, max_size=5).map("".join)
       .filter(bool))
def test_any_mix_of_fragments_at_the_line_limit_is_fast(unit: str) -> None:
    line = line_of(unit, MAX_LINE)
    assert cpu_seconds(lambda: REDACTOR.line(line), runs=2) < 0.05, repr(unit)


@pytest.mark.parametrize("pattern", PATTERNS, ids=[p.name for p in PATTERNS])
def test_each_regex_alone_is_linear_on_its_worst_fragment(pattern: object) -> None:
    """Each regex on its own (no prefilter): the worst fragment's growth ratio stays linear."""
    regex = pattern.regex  # type: ignore[attr-defined]
    replacement = pattern.replacement  # type: ignore[attr-defined]
    worst = (0.0, "")
    for unit in FRAGMENTS:
        big = line_of(unit, MAX_LINE)
        worst = max(worst, (cpu_seconds(lambda big=big: regex.sub(replacement, big), runs=2), unit))
    unit = worst[1]
    small, big = line_of(unit, MAX_LINE // 8), line_of(unit, MAX_LINE)
    t_small = cpu_seconds(lambda: regex.sub(replacement, small))
    t_big = cpu_seconds(lambda: regex.sub(replacement, big))
    assert t_big <= 24 * t_small + 0.002, f"{unit!r}: {t_small * 1e3:.2f} ms -> {t_big * 1e3:.2f} ms"


def test_a_whole_body_of_adversarial_lines_is_redacted_within_a_cpu_budget() -> None:
    """The largest log batch the API accepts (256 KiB: 64 lines of 4,096), every line the costliest fragment
    found above: a bounded CPU cost per request (the HTTP edge answers others between requests)."""
    costs = sorted((cpu_seconds(lambda u=u: REDACTOR.line(line_of(u, MAX_LINE)), runs=2), u) for u in FRAGMENTS)
    body = [line_of(costs[-1][1], MAX_LINE) for _ in range(MAX_BODY_BYTES // MAX_LINE)]
    spent = cpu_seconds(lambda: REDACTOR.stream(body), runs=2)
    assert spent < 0.5, f"{spent:.3f} s for {len(body)} lines of {costs[-1][1]!r}"


def test_escaping_is_linear_too() -> None:
    small, big = line_of("\x1b[31m\u202e\r", MAX_LINE // 8), line_of("\x1b[31m\u202e\r", MAX_LINE)
    t_small, t_big = cpu_seconds(lambda: escape_controls(small)), cpu_seconds(lambda: escape_controls(big))
    assert t_big <= 24 * t_small + 0.002
