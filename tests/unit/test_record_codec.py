"""The record codec's fast paths change speed, never meaning.

- A rendered record reads back (through YAML, as any reader would) as the document it was rendered from.
- Whenever the fast reader accepts a text, the YAML loader reads the same document from it; texts outside the
  fast subset (hand edits, odd numbers, escapes, characters JSON and YAML treat differently) are refused by
  the fast reader, not misread.
- The compiled schema check says valid exactly when jsonschema does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler import SCHEMA_DIR
from reconciler.adapters import record_codec
from reconciler.adapters.record_files import (
    ENTRY_FIELDS,
    _entry_decoder,
    parse_machine_record,
    parse_machine_rows,
    render_machine_record,
)
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordError

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MACHINE_SCHEMA = json.loads((SCHEMA_DIR / "machine-record.schema.json").read_text())
IMAGE_SCHEMA = json.loads((SCHEMA_DIR / "image-suspect.schema.json").read_text())

# Text that hits every divergence: YAML line breaks (NEL, LS, PS), C1 controls, DEL, BOM, tabs, quotes,
# backslashes, '#', ': ', non-BMP characters.
tricky_text = st.text(alphabet=st.sampled_from(
    [*"ab 09:#'\"\\/{}[],-|>&*!%@`", "\t", "\n", "\x85", "\u2028", "\u2029", "\x7f", "\x9f", "\ufeff",
     "\u00e9", "\U0001f600", "\x01", "\ufffe"]), max_size=12)
floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e-7, 1e16, 0.5, -0.0]),
                   st.floats())
json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), floats, tricky_text),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(tricky_text, inner, max_size=3)),
                           max_leaves=8)


@st.composite
def entries(draw: st.DrawFn) -> BenchmarkEntry:
    maybe_text = st.one_of(st.none(), tricky_text)
    return BenchmarkEntry(
        instance_id=draw(tricky_text.filter(bool)), at=draw(tricky_text),
        verdict=draw(st.sampled_from(["ok", "below-min-rate", "benchmark-error"])),
        blame=draw(st.sampled_from(["none", "machine", "image"])), marks_bad=draw(st.booleans()),
        reason=draw(tricky_text), contract_id=draw(maybe_text), pool=draw(maybe_text), signature=draw(maybe_text),
        proofs_per_hour=draw(st.one_of(st.none(), floats.filter(lambda f: f == f and f >= 0))),
        min_rate_proofs_per_hour=draw(st.one_of(st.none(), floats)),
        evidence=draw(st.dictionaries(tricky_text, json_values, max_size=4)))


@st.composite
def records(draw: st.DrawFn) -> MachineRecord:
    return MachineRecord(
        machine_id=draw(st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,10}\Z")),
        status=draw(st.sampled_from(["ok", "bad", "pardoned"])), host_id=draw(st.one_of(st.none(), tricky_text)),
        gpu_name=draw(st.one_of(st.none(), tricky_text, st.sampled_from(["RTX 4090", "H100 PCIE", "yes", "null"]))),
        note=draw(st.one_of(st.none(), tricky_text.filter(bool))),
        benchmarks=tuple(draw(st.lists(entries(), max_size=3))))


def _same(a: Any, b: Any) -> bool:
    """Equal documents, NaN equal to NaN, and -0.0 told apart from 0.0 (both readers must agree on the sign)."""
    if isinstance(a, float) and isinstance(b, float):
        return (a != a and b != b) or (a == b and str(a) == str(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_a_rendered_record_reads_back_as_its_document_through_yaml_and_the_fast_reader(record: MachineRecord) -> None:
    text = render_machine_record(record)
    doc = record.to_yaml_dict()
    assert _same(yaml.load(text, Loader=LOADER), doc)  # noqa: S506 (CSafeLoader)
    try:
        fast = record_codec.parse_fast(text)
    except record_codec.NotFast:
        return
    assert _same(fast, doc)


def test_the_usual_record_takes_the_fast_path_one_line_per_entry() -> None:
    entry = BenchmarkEntry("i-1", "2026-12-02T18:00:00Z", "ok", "none", False, "ok 46.4/h >= 40/h",
                           pool="rtx4090-a", proofs_per_hour=46.4, evidence={"log_tail": ["[1/10] ok — 116.1s"]})
    record = MachineRecord("40213", status="bad", host_id="7000", gpu_name="RTX 4090", benchmarks=(entry, entry))
    text = render_machine_record(record)
    assert "\nstatus: bad\n" in text  # humans still pardon by editing this line
    assert text.count("\n- {") == 2
    assert record_codec.parse_fast(text) == record.to_yaml_dict()
    assert parse_machine_record(text, Path("40213.yaml")) == record


def _mutations(text: str) -> st.SearchStrategy[str]:
    lines = text.split("\n")
    pieces = ["1e5", "1.5e3", "1.0e+3", "-0", "NaN", "Infinity", '"\\/"', '"\\ud83d\\ude00"', "\t", "# c", "&a",
              "*a", "---", "...", "'", '"', ":", " ", "{", "}", "\x85", "\u2028", "yes", "~", "0x1F", "1_000"]

    @st.composite
    def mutate(draw: st.DrawFn) -> str:
        out = list(lines)
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(out) - 1))
            line = out[i]
            pos = draw(st.integers(0, len(line)))
            piece = draw(st.sampled_from(pieces))
            if draw(st.booleans()):
                out[i] = line[:pos] + piece + line[pos:]
            else:
                out[i] = line[:pos] + piece + line[pos + draw(st.integers(0, 4)):]
        return "\n".join(out)

    return mutate()


BASE = render_machine_record(MachineRecord("7", status="bad", host_id="70", gpu_name="RTX 4090",
                                          note="PSU: replaced", benchmarks=(
    BenchmarkEntry("i-1", "2026-12-02T18:00:00Z", "below-min-rate", "machine", True, "slow: 21.0/h < 40/h",
                   proofs_per_hour=21.0, seconds_per_proof=171.4, evidence={"n": 1, "x": [0.5, None, True]}),)))


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_whenever_the_fast_reader_accepts_a_text_yaml_reads_the_same_document(data: st.DataObject) -> None:
    text = data.draw(_mutations(BASE))
    try:
        fast = record_codec.parse_fast(text)
    except record_codec.NotFast:
        return
    assert _same(yaml.load(text, Loader=LOADER), fast)  # noqa: S506 (CSafeLoader)


@pytest.mark.parametrize("text", [
    "status: ok\nbenchmarks:\n- {\"a\": 1e5}\n",                 # YAML: the string '1e5'
    "status: ok\nbenchmarks:\n- {\"a\": \"\\ud83d\\ude00\"}\n",   # one character to JSON, two to PyYAML
    "status: ok\nbenchmarks:\n- {\"a\": \"x\u2028y\"}\n",         # a line break inside a YAML quoted scalar
    "status: ok\nbenchmarks:\n- {\"a\": 1}  # note\n",
    "note: &n x\nbenchmarks:\n- {\"a\": 1}\n",
    "note: \"open\nbenchmarks:\n- {\"a\": 1}\"\n",
    "status: bad\nno: 'PSU: replaced'\nbenchmarks:\n- {\"a\": 1}\n",  # YAML: the key is the boolean false
    "on: x\nbenchmarks:\n- {\"a\": 1}\n",
    "null: x\nbenchmarks:\n- {\"a\": 1}\n",                      # YAML: the key is None
])
def test_texts_where_json_and_yaml_could_differ_leave_the_fast_path(text: str) -> None:
    with pytest.raises(record_codec.NotFast):
        record_codec.parse_fast(text)


def _schema_documents() -> st.SearchStrategy[Any]:
    good_entry = {"instance_id": "i-1", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": False,
                  "reason": "r", "proofs_per_hour": 1.5, "evidence": {}}
    good = {"machine_id": "40213", "status": "ok", "host_id": None, "benchmarks": [good_entry]}
    odd = st.one_of(json_values, st.sampled_from([True, False, 0, 1, -1, 1.0, -0.5, "", "x", "ok", "bad", None,
                                                  [], {}, "../x", "a" * 70, "40213"]))

    @st.composite
    def doc(draw: st.DrawFn) -> Any:
        d: Any = json.loads(json.dumps(good))
        for _ in range(draw(st.integers(0, 3))):
            target = d if draw(st.booleans()) or not d["benchmarks"] else d["benchmarks"][0]
            key = draw(st.sampled_from([*good, *good_entry, "extra", "note", "seconds_per_proof", "held_by"]))
            if draw(st.integers(0, 4)) == 0:
                target.pop(key, None)
            else:
                target[key] = draw(odd)
            if not isinstance(d.get("benchmarks"), list) or not d["benchmarks"] \
                    or not isinstance(d["benchmarks"][0], dict):
                break
        return d

    return st.one_of(doc(), json_values)


@settings(max_examples=800, deadline=None)
@given(_schema_documents())
def test_the_compiled_machine_record_check_agrees_with_jsonschema(doc: Any) -> None:
    check = record_codec.compile_schema(MACHINE_SCHEMA)
    assert check is not None
    assert check(doc) == jsonschema.Draft202012Validator(MACHINE_SCHEMA).is_valid(doc)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["image_digest", "signature", "status", "machines", "tripped_at", "pools",
                                        "reason", "x"]),
                       st.one_of(json_values, st.just("sha256:" + "a" * 64), st.just("suspect"),
                                 st.lists(st.sampled_from(["a", 1, None]), max_size=2))))
def test_the_compiled_image_record_check_agrees_with_jsonschema(doc: dict[str, Any]) -> None:
    check = record_codec.compile_schema(IMAGE_SCHEMA)
    assert check is not None
    assert check(doc) == jsonschema.Draft202012Validator(IMAGE_SCHEMA).is_valid(doc)


def test_a_schema_keyword_the_compiler_does_not_know_keeps_jsonschema() -> None:
    assert record_codec.compile_schema({"type": "object", "oneOf": [{"required": ["a"]}]}) is None


# --- the typed entry decoder (msgspec): the same rows as the stdlib decoder + the schema check ---------------

ENTRY_CHECK = record_codec.compile_schema({**MACHINE_SCHEMA["$defs"]["entry"], "$defs": MACHINE_SCHEMA["$defs"]})


def _general_rows(lines: list[str], evidence: bool) -> list[tuple[Any, ...]] | None:
    """The rows the general path gives for these entry lines (stdlib decoder, else the YAML loader, then the
    compiled check), or None where it refuses them (not YAML, or an entry the schema refuses)."""
    try:
        entries = record_codec.decode_entry_lines(lines)
    except record_codec.NotFast:
        try:
            entries = yaml.load("benchmarks:\n" + "\n".join(lines), Loader=LOADER)["benchmarks"]  # noqa: S506
        except yaml.YAMLError:
            return None
    assert ENTRY_CHECK is not None
    if not all(ENTRY_CHECK(e) for e in entries):
        return None
    wanted = [(n, d) for n, d in ENTRY_FIELDS if evidence or n != "evidence"]
    return [tuple(e[n] if n in e else (d() if callable(d) else d) for n, d in wanted) for e in entries]


def _check_typed_against_general(lines: list[str]) -> bool:
    """Whenever the typed decoder returns rows, the general path gives the same; True if it returned rows."""
    taken = False
    for evidence in (True, False):
        decoder = _entry_decoder(evidence)
        assert decoder is not None, "msgspec is a dependency (pyproject.toml): .venv/bin/pip install -e '.[dev]'"
        rows = decoder(lines)
        if rows is None:
            continue
        taken = True
        general = _general_rows(lines, evidence)
        assert general is not None, lines
        assert _same([list(r) for r in rows], [list(r) for r in general])
        if evidence:  # the evidence decoded exactly (it is left out of the index's rows)
            index = [n for n, _ in ENTRY_FIELDS].index("evidence")
            assert all(type(r[index]) is dict for r in rows)
    return taken


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_the_typed_entry_decoder_reads_a_rendered_record_as_the_stdlib_path_does(record: MachineRecord) -> None:
    try:
        _, lines = record_codec.split_fast(render_machine_record(record))
    except record_codec.NotFast:
        return
    _check_typed_against_general(lines)


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_whenever_the_typed_decoder_accepts_a_hand_edited_text_the_stdlib_path_reads_the_same(
        data: st.DataObject) -> None:
    text = data.draw(_mutations(BASE))
    try:
        _, lines = record_codec.split_fast(text)
    except record_codec.NotFast:
        return
    _check_typed_against_general(lines)


@st.composite
def _entry_lines(draw: st.DrawFn) -> list[str]:
    """Entries as JSON lines, some schema-valid, some not (wrong types, unknown or missing fields, odd values)."""
    docs = _schema_documents()
    out = []
    for _ in range(draw(st.integers(1, 3))):
        doc = draw(docs)
        entry = doc["benchmarks"][0] if isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list) \
            and doc["benchmarks"] else doc
        try:
            out.append("- " + json.dumps(entry))
        except (TypeError, ValueError):
            out.append("- {}")
    return out


@settings(max_examples=800, deadline=None)
@given(_entry_lines())
def test_the_typed_entry_decoder_accepts_only_what_jsonschema_accepts(lines: list[str]) -> None:
    validator = jsonschema.Draft202012Validator({**MACHINE_SCHEMA["$defs"]["entry"], "$defs": MACHINE_SCHEMA["$defs"]})
    if _check_typed_against_general(lines):
        for line in lines:
            assert validator.is_valid(json.loads(line[2:]))


@pytest.mark.parametrize("line", [
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "r", '
    '"proofs_per_hour": 1e5}',                                        # a string to YAML: the schema refuses it
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "r", '
    '"proofs_per_hour": true}',                                       # a bool is not a number
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "r", '
    '"proofs_per_hour": -1}',                                         # minimum 0
    '- {"instance_id": "", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "r"}',
    '- {"instance_id": "i", "at": "t", "verdict": "fine", "blame": "none", "marks_bad": false, "reason": "r"}',
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": 0, "reason": "r"}',
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false}',
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "r", "x": 1}',
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "r", '
    '"evidence": null}',
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "r", '
    '"evidence": [1]}',
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "\\/"}',
    '- {"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "\tx"}',
])
def test_entries_the_schema_refuses_or_yaml_reads_otherwise_leave_the_typed_decoder(line: str) -> None:
    for evidence in (True, False):
        decoder = _entry_decoder(evidence)
        assert decoder is not None
        assert decoder([line]) is None


def test_a_record_as_the_reconciler_writes_it_takes_the_typed_path() -> None:
    """The fast path is really taken (not silently always falling back): a usual entry, numbers that are ints
    and floats, evidence with nested values and an exponent inside the evidence."""
    entry = BenchmarkEntry("i-1", "2026-12-02T18:00:00Z", "below-min-rate", "machine", True, "slow: 21.0/h < 40/h",
                           pool="rtx4090-a", proofs_per_hour=21.0, seconds_per_proof=171.4, min_rate_proofs_per_hour=40,
                           evidence={"log_tail": ["[1/10] ok — 116.1s"], "proofs": {"requested": 10}, "x": 1.5e-07})
    record = MachineRecord("40213", status="bad", host_id="7000", gpu_name="RTX 4090", benchmarks=(entry,))
    text = render_machine_record(record)
    _, lines = record_codec.split_fast(text)
    rows = _entry_decoder(True)(lines)  # type: ignore[misc]
    assert rows is not None and BenchmarkEntry(*rows[0]) == entry
    assert type(rows[0][[n for n, _ in ENTRY_FIELDS].index("min_rate_proofs_per_hour")]) is int  # 40 stays 40
    assert _entry_decoder(False)(lines) is not None  # type: ignore[misc]
    assert parse_machine_rows(text, Path("40213.yaml"), evidence=False)[1] == \
        [tuple(v for (n, _), v in zip(ENTRY_FIELDS, rows[0], strict=True) if n != "evidence")]
    assert parse_machine_record(text, Path("40213.yaml")) == record


_ENTRY = ('{"instance_id": "i", "at": "t", "verdict": "ok", "blame": "none", "marks_bad": false, "reason": "r", '
          '"evidence": {"x": [{}')


@pytest.mark.parametrize("lines", [
    [f"- {_ENTRY}]}}}}, {_ENTRY}]}}}}"],           # two entries on one line: not YAML (",": expected block end)
    [f"- {_ENTRY}]}}}},{_ENTRY}, {{}}", "- {}]}}"],  # the second entry runs on into the next line
])
def test_a_line_that_is_not_exactly_one_entry_leaves_the_typed_decoder_and_is_an_error(lines: list[str]) -> None:
    for evidence in (True, False):
        decoder = _entry_decoder(evidence)
        assert decoder is not None
        assert decoder(lines) is None
    text = "machine_id: '7'\nstatus: ok\nbenchmarks:\n" + "".join(f"{line}\n" for line in lines)
    with pytest.raises(RecordError, match=r"7\.yaml: not valid YAML"):
        parse_machine_rows(text, Path("7.yaml"), evidence=False)


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_the_one_search_split_equals_the_line_by_line_split(data: st.DataObject) -> None:
    """split_entries cuts the usual record with one search; wherever it does, reading line by line (the
    general path) gives the same fields, the same entry lines, or the same refusal."""
    text = data.draw(st.one_of(_mutations(BASE), _mutations("# c\n" + BASE), _mutations(BASE.replace(
        "status: bad\n", "status: bad\nbenchmarks: x\n")), st.just(BASE.split("benchmarks:")[0] + "benchmarks:")))
    try:
        fast = record_codec.split_entries(text)
    except record_codec.NotFast:
        fast = None
    try:
        general = record_codec._split_lines(text)
    except record_codec.NotFast:
        general = None
    assert fast == general or (fast is not None and general is not None and fast[0] == general[0]
                               and record_codec.entry_lines(fast[1]) == record_codec.entry_lines(general[1]))
