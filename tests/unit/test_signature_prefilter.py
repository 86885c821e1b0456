"""The fast classifier gives exactly the answers of the plain one (issue 16: the decide-stress pass).

`signatures.classify` skips a signature's regex on a line that lacks all of the signature's `needs` (literal
substrings, compared lower-cased) and remembers each distinct line's first match. Both are only shortcuts:

- a differential test runs `classify` and `reference_classify` below (every signature's regex against every
  line, the documented precedence, nothing skipped) over a large corpus: every whole tail under
  tests/fixtures/tails/, every example line of test_signatures.py, the benchmark's generated tails, and
  seeded random mixes of all of those with ring timestamps, stream tags, case changes, the non-ASCII letters
  that match ASCII ones case-insensitively, and lines cut into pieces;
- a proof, from the parsed regex, that every match of a signature's pattern contains one of its `needs`;
- every example line contains one of its signature's `needs` (the same claim, on real lines).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.data import CUDA_TAIL, PARAMS_FAIL_TAIL, PARAMS_LOG
from reconciler.domain import signatures
from reconciler.domain.signatures import SIGNATURES, Signature, SignatureMatch, classify, read_tail, refine
from tests.unit.test_signatures import EXAMPLES, HEALTHY_LOG, PANIC

TAILS = Path(__file__).resolve().parents[1] / "fixtures" / "tails"


def reference_classify(lines: Iterable[str]) -> dict[bool, SignatureMatch | None]:
    """The classifier as documented, with no shortcut, for `include_tunnel` False and True: the highest-priority
    signature matching any usable line, the earliest line on a tie, the earlier table entry on the same line.
    A tagged line is also tried without its tag unless the signature is `whole_line`."""
    lines = list(lines)
    found = []
    for i, ln in enumerate(read_tail(lines)):
        if ln.noise:
            continue
        for order, sig in enumerate(SIGNATURES):
            texts = [ln.text]
            if ln.tag and not sig.whole_line:
                texts.append(ln.text[len(ln.tag) + 2:])
            if any(sig.pattern.search(t) for t in texts):
                found.append((-sig.priority, i, order, ln.text, ln.tunnel))
    out: dict[bool, SignatureMatch | None] = {}
    for include_tunnel in (False, True):
        usable = [f for f in found if include_tunnel or not f[4]]
        if not usable:
            out[include_tunnel] = None
        else:
            _, i, order, text, _ = min(usable)
            # The two-line signatures (pinned host memory) are the same code path in both: not a shortcut.
            out[include_tunnel] = refine(SignatureMatch(SIGNATURES[order], text, i), read_tail(lines),
                                         include_tunnel=include_tunnel)
    return out


def _fixture_tails() -> list[list[str]]:
    out = []
    for path in sorted(TAILS.glob("*.yaml")):
        rep = yaml.safe_load(path.read_text())["report"]
        for key in ("tail", "ring"):
            if rep.get(key):
                out.append(rep[key].split("\n"))
        if rep.get("message"):
            out.append([rep["message"]])
    return out


FIXTURE_TAILS = _fixture_tails()
EXAMPLE_LINES = [line for lines in EXAMPLES.values() for line in lines]
BENCH_TAILS = [list(PARAMS_LOG), list(CUDA_TAIL), list(PARAMS_FAIL_TAIL)]
ALL_LINES = sorted({line for tail in [*FIXTURE_TAILS, *BENCH_TAILS, HEALTHY_LOG, EXAMPLE_LINES] for line in tail})
#: Non-ASCII letters that match an ASCII letter case-insensitively in `re` (Turkish I's, long s, Kelvin sign).
FOLDING = "\u0130\u0131\u017f\u212a"
TAGS = ("", "cuzk-daemon: ", "cuzk-bench: ", "cuzk-bench status: ", "tunnel: ", "fleet: tunnel: ")


def _mutate(rng: random.Random, line: str) -> str:
    roll = rng.random()
    if roll < 0.15:
        line = line.upper()
    elif roll < 0.25:
        line = line.lower()
    elif roll < 0.35 and line:  # a letter replaced by one that still matches it case-insensitively
        pos = [i for i, c in enumerate(line) if c in "iIsSkK"]
        if pos:
            i = rng.choice(pos)
            swap = {"i": "\u0130\u0131", "s": "\u017f", "k": "\u212a"}[line[i].lower()]
            line = line[:i] + rng.choice(swap) + line[i + 1:]
    elif roll < 0.45 and len(line) > 4:  # a line cut short or glued to a piece of another
        cut = rng.randrange(1, len(line))
        line = line[:cut] if rng.random() < 0.5 else line[cut:] + " " + rng.choice(ALL_LINES)[:cut]
    elif roll < 0.5:
        line = line + " " + "".join(rng.choice(string.ascii_letters + " :-" + FOLDING + "\u00e9\u2014")
                                    for _ in range(rng.randrange(1, 30)))
    if rng.random() < 0.3:
        line = rng.choice(TAGS) + line
    if rng.random() < 0.3:
        line = f"2026-12-03T06:{rng.randrange(60):02d}:00Z " + line
    return line


def _random_tails(seed: int, count: int) -> list[list[str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        tail = [_mutate(rng, rng.choice(ALL_LINES)) for _ in range(rng.randrange(1, 25))]
        if rng.random() < 0.2:  # a panic head (joined with the next line of its stream)
            tail.insert(rng.randrange(len(tail) + 1), rng.choice(TAGS[:3]) + PANIC)
        if rng.random() < 0.2:  # an anyhow chain
            at = rng.randrange(len(tail) + 1)
            tail[at:at] = ["Error: " + rng.choice(ALL_LINES), "", "Caused by:", "    0: " + rng.choice(ALL_LINES),
                           "    1: " + rng.choice(ALL_LINES)]
        out.append(tail)
    return out


def _key(match: SignatureMatch | None) -> tuple[str, str, int] | None:
    return None if match is None else (match.name, match.line, match.index)


def _assert_same(tails: Sequence[list[str]], *, repeat: bool = False) -> int:
    matched = 0
    for tail in tails:
        want = reference_classify(tail)
        for _ in range(2 if repeat else 1):  # the second time, answered from the line memo
            for include_tunnel in (False, True):
                got = classify(tail, include_tunnel=include_tunnel)
                assert _key(got) == _key(want[include_tunnel]), (tail, include_tunnel)
        matched += sum(m is not None for m in want.values())
    return matched


def test_the_fast_classifier_agrees_with_the_reference_on_every_real_tail_and_line() -> None:
    single = [[line] for line in ALL_LINES]
    matched = _assert_same([*FIXTURE_TAILS, *BENCH_TAILS, HEALTHY_LOG, *single])
    assert matched > len(EXAMPLE_LINES)  # the corpus exercises matches, not only misses


@pytest.mark.parametrize("seed", range(3))
def test_the_fast_classifier_agrees_with_the_reference_on_random_mixes(seed: int) -> None:
    signatures.clear_line_memo()  # from cold: the memo must not change any answer
    assert _assert_same(_random_tails(seed, 500), repeat=True) > 300


def test_every_signature_names_literals_for_the_prefilter() -> None:
    for sig in SIGNATURES:
        assert sig.needs, f"{sig.name}: no `needs`: its regex would run on every line"
        assert all(n == n.lower() and n.isascii() and n for n in sig.needs), sig.name


# --- every match of a pattern contains one of its signature's `needs`: shown from the parsed regex ---------

def _run_contains(run: str, needs: Sequence[str]) -> bool:
    return any(n in run for n in needs)


def _covered(items: Any, needs: Sequence[str], run: str = "") -> bool:
    """True when every string that matches the parsed sequence `items` contains one of `needs` (lower-cased
    literal runs; a sound under-approximation: False may only mean the proof could not be found). `run`: the
    literal text every match has just before `items` (the parser factors a common prefix out of a branch's
    alternatives: `\\b(?:ENOSPC|EDQUOT)` is `E` then a branch of `NOSPC` and `DQUOT`)."""
    from re import _constants as c  # type: ignore[attr-defined]

    for op, av in items:
        if op is c.LITERAL and av < 128:
            run += chr(av).lower()
            continue
        if op is c.AT:  # zero-width (\\b, ^): the literals on both sides are still contiguous
            continue
        if _run_contains(run, needs):
            return True
        if op is c.SUBPATTERN and _covered(av[3], needs, run):
            return True
        if op is c.ATOMIC_GROUP and _covered(av, needs, run):
            return True
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT) and av[0] >= 1 and _covered(av[2], needs, run):
            return True
        if op is c.BRANCH and all(_covered(alt, needs, run) for alt in av[1]):
            return True
        if op is c.ASSERT and _covered(av[1], needs):  # a lookahead/-behind's text is in the line too
            return True
        run = ""
    return _run_contains(run, needs)


@pytest.mark.parametrize("sig", SIGNATURES, ids=[s.name for s in SIGNATURES])
def test_every_match_of_a_signature_contains_one_of_its_needs(sig: Signature) -> None:
    from re import _parser  # type: ignore[attr-defined]

    assert _covered(_parser.parse(sig.pattern.pattern, sig.pattern.flags), sig.needs), (
        f"{sig.name}: cannot show that every match of {sig.pattern.pattern!r} contains one of {sig.needs}")


def test_the_proof_rejects_needs_a_pattern_does_not_require() -> None:
    from re import _parser  # type: ignore[attr-defined]

    def covered(pattern: str, *needs: str) -> bool:
        return _covered(_parser.parse(pattern, re.IGNORECASE), needs)

    assert covered(r"GPU is lost|GPU has been lost", "is lost", "has been lost")
    assert not covered(r"GPU is lost|GPU has been lost", "is lost")
    assert not covered(r"(?:foo)?bar", "foo")
    assert not covered(r"x.*y", "xy")
    assert covered(r"^(?=.*(?:a refused|b refused))(?=.*cuzk)", "refused")
    assert not covered(r"^(?!.*cuzk)refused", "cuzk")


@pytest.mark.parametrize(("name", "line"), [(n, line) for n, lines in EXAMPLES.items() for line in lines])
def test_every_example_line_contains_one_of_its_signatures_needs(name: str, line: str) -> None:
    sig = next(s for s in SIGNATURES if s.name == name)
    assert any(n in line.lower() for n in sig.needs), (name, sig.needs)


def test_the_non_ascii_letters_that_fold_to_ascii_are_the_ones_the_prefilter_knows() -> None:
    text = "".join(chr(c) for c in range(0x80, 0x110000) if not 0xD800 <= c < 0xE000)
    folding = set(re.compile("[a-z]", re.IGNORECASE).findall(text))
    assert folding == set(FOLDING) == set(signatures.FOLDS_TO_ASCII)
