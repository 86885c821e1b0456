"""Property/fuzz tests of the two loaders that read human-editable files: the fleet spec and machine records.

Spec: arbitrary text, YAML-ish token soup and structured mutations of the shipped example never make
`check_spec_text` raise; a rejected spec always carries at least one error naming the file; `load_spec`
raises nothing but SpecError; `fleet validate` answers 0/1 with no traceback.
Records: arbitrary files (any bytes, any YAML, mutated valid records) in machines/ never crash
`load_records`; each unreadable file is reported in `problems`, kept out of `machines`, and - when its name
is a machine id - counted as bad (never rented) and never overwritten; valid neighbours still load.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler import SCHEMA_DIR
from reconciler.adapters.record_files import load_records, parse_machine_record, render_machine_record
from reconciler.adapters.spec_files import check_spec_text, load_spec
from reconciler.cli import main
from reconciler.domain.records import BenchmarkEntry, MachineRecord
from reconciler.domain.spec import SpecError

EXAMPLE = (SCHEMA_DIR.parent / "fleet.yaml").read_text(encoding="utf-8")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TOKENS = ["\n", "  ", "    ", "- ", ": ", "{", "}", "[", "]", ", ", "&a ", "*a", "!!str ", "!!int ", "!!binary ",
          "!!python/object/apply:os.system ", "!custom ", "? ", "|\n", ">-\n", "'", '"', "# c", "---\n", "...\n",
          "%YAML 1.1\n", "%TAG ! tag:x:\n", "\t", "version", "pools", "name", "count", "gpu_name", "image",
          "controller", "benchmark", "1", "1.0", "-1", ".nan", ".inf", "0x10", "1e400", "99999999999999999999",
          "~", "null", "true", "no", "2026-12-02", "2026-12-02T18:00:00Z", "=", "<<: *a", "\x00", "\ufeff",
          "\u2028", "\x85", "é", "\udcff"]
yaml_ish = st.lists(st.sampled_from(TOKENS) | st.text(max_size=6), max_size=60).map("".join)
yaml_bytes = yaml_ish.map(lambda text: text.encode("utf-8", "surrogateescape"))

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_like = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=3), max_leaves=8)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, (*prefix, i))


def mutate(doc: Any, data: st.DataObject, rounds: int) -> Any:
    """Delete, replace or add at random places of a parsed document (in place; returns the new root)."""
    for _ in range(rounds):
        path = data.draw(st.sampled_from(list(paths(doc))))
        op = data.draw(st.sampled_from(["delete", "replace", "add"]))
        if not path:
            if op == "replace":
                doc = data.draw(json_like)
            continue
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        key = path[-1]
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = data.draw(json_like)
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=10))] = data.draw(json_like)
        else:
            parent.insert(key, data.draw(json_like))
    return doc


def check_outcome(text: str) -> None:
    spec, problems = check_spec_text(text, "fuzz.yaml")
    errors = [p for p in problems if p.severity == "error"]
    assert (spec is None) == bool(errors)
    for p in problems:
        assert str(p).startswith("fuzz.yaml") and p.json_path.startswith("$") and p.message
    if spec is not None:
        assert all(isinstance(pool.count, int) and pool.count >= 0 for pool in spec.pools)
        assert len({pool.name for pool in spec.pools}) == len(spec.pools)


# --- spec -----------------------------------------------------------------------------------------------


@FUZZ
@given(st.text(max_size=300))
def test_spec_loader_survives_arbitrary_text(text: str) -> None:
    check_outcome(text)


@FUZZ
@given(yaml_ish)
def test_spec_loader_survives_yaml_token_soup(text: str) -> None:
    check_outcome(text)


@FUZZ
@given(st.data(), st.integers(min_value=1, max_value=4))
def test_spec_loader_survives_structured_mutations_of_the_example(data: st.DataObject, rounds: int) -> None:
    doc = mutate(yaml.safe_load(EXAMPLE), data, rounds)
    check_outcome(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False))


@FUZZ
@given(st.data())
def test_spec_loader_survives_line_edits_of_the_example(data: st.DataObject) -> None:
    """Edits a human makes in a text editor: drop, duplicate or re-indent a line, or append junk to it."""
    lines = EXAMPLE.splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["drop", "duplicate", "indent", "dedent", "append"]))
        if op == "drop":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "indent":
            lines[i] = "  " + lines[i]
        elif op == "dedent":
            lines[i] = lines[i].lstrip()
        else:
            lines[i] += data.draw(yaml_ish)
        if not lines:
            lines = [""]
    check_outcome("\n".join(lines) + "\n")


@pytest.mark.parametrize("text", [
    "[" * 3000,  # nested deeper than the YAML composer recurses
    "pools: " + "{a: " * 2000 + "1" + "}" * 2000,
    "pools:\n" + "".join("  " * i + "- \n" for i in range(1500)),
])
def test_spec_nested_too_deeply_is_a_problem_not_a_crash(text: str) -> None:
    spec, problems = check_spec_text(text, "deep.yaml")
    assert spec is None and problems and "deep.yaml" in str(problems[0])


def test_spec_with_yaml_aliases_is_refused() -> None:
    pool = "{name: %s, gpu_name: RTX 4090, count: 1, min_rate_proofs_per_hour: 40, max_price_usd_per_hour: 0.6, "
    text = ("version: 1\nimage: {repository: ghcr.io/x/y}\ncontroller: {url: http://127.0.0.1:1}\npools:\n"
            f"  - {pool % 'a'}benchmark: &b {{proofs: 10}}}}\n  - {pool % 'b'}benchmark: *b}}\n")
    assert yaml.safe_load(text)["pools"][1]["benchmark"] == {"proofs": 10}  # a well-formed alias
    spec, problems = check_spec_text(text, "alias.yaml")
    assert spec is None and any("alias" in p.message for p in problems)


@settings(max_examples=60, deadline=None)
@given(yaml_ish | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_load_spec_raises_only_spec_error_and_validate_never_tracebacks(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.yaml"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        try:
            load_spec(path)
        except SpecError as exc:
            assert exc.problems and str(path) in str(exc)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", str(path)])
        assert code in (0, 1)
        assert "Traceback" not in out.getvalue() + err.getvalue()
        assert str(path) in out.getvalue() + err.getvalue()


# --- records --------------------------------------------------------------------------------------------

VALID = MachineRecord("41001", status="bad", host_id="501", gpu_name="RTX 4090", benchmarks=(
    BenchmarkEntry(instance_id="rtx4090-0-3f9a1c", at="2026-12-02T19:00:00Z", verdict="below-min-rate",
                   blame="machine", marks_bad=True, reason="below-min-rate 20.0/h < 40/h (180.0 s/proof)",
                   pool="rtx4090", proofs_per_hour=20.0, seconds_per_proof=180.0, min_rate_proofs_per_hour=40,
                   evidence={"log_tail": ["throughput:    0.333 proofs/min (180.0s/proof)"], "exit_code": 0}),
))
VALID_TEXT = render_machine_record(VALID)
file_names = st.sampled_from(["41002", "4-2.x", "abc", ".hidden", "a..b", "_x", "-x", "x" * 70, "..", "é"])


def load_with(files: dict[str, bytes], tmp: Path) -> Any:
    machines = tmp / "machines"
    machines.mkdir()
    (machines / "41001.yaml").write_text(VALID_TEXT, encoding="utf-8")
    for name, raw in files.items():
        (machines / f"{name}.yaml").write_bytes(raw)
    return load_records(tmp)


def check_records(files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory(prefix="fuzz-records-") as tmp_dir:
        tmp = Path(tmp_dir)
        records = load_with(files, tmp)
        assert records.machines["41001"] == VALID  # a valid neighbour always loads
        for name, raw in files.items():
            if name in records.machines:
                rec = records.machines[name]
                text = render_machine_record(rec)
                reparsed = parse_machine_record(text, tmp / "machines" / f"{name}.yaml")
                assert render_machine_record(reparsed) == text  # what loads is rewritten stably
            else:
                assert any(f"{name}.yaml" in p for p in records.problems), (name, records.problems)
                if name not in ("..", ".hidden") and not name.startswith(("_", "-")) and len(name) <= 64 \
                        and name.isascii() and ".." not in name:
                    assert name in records.bad_machine_ids()  # unreadable -> never rented
            assert (tmp / "machines" / f"{name}.yaml").read_bytes() == raw  # never rewritten


@FUZZ
@given(st.dictionaries(file_names, st.binary(max_size=200) | yaml_bytes,
                       min_size=1, max_size=3))
def test_load_records_survives_arbitrary_files(files: dict[str, bytes]) -> None:
    check_records(files)


@FUZZ
@given(st.data(), st.integers(min_value=1, max_value=4))
def test_load_records_survives_mutated_valid_records(data: st.DataObject, rounds: int) -> None:
    doc = mutate(yaml.safe_load(VALID_TEXT.replace("41001", "41002")), data, rounds)
    check_records({"41002": yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass")})


@pytest.mark.parametrize("body", [
    "benchmarks: " + "[" * 3000,
    "benchmarks: []\nnote: " + "[" * 3000 + "]" * 3000,
])
def test_record_nested_too_deeply_is_reported_not_a_crash(body: str, tmp_path: Path) -> None:
    records = load_with({"41002": f"machine_id: '41002'\nstatus: ok\n{body}\n".encode()}, tmp_path)
    assert "41002" in records.unreadable_machine_ids and "41002" in records.bad_machine_ids()
    assert any("41002.yaml" in p for p in records.problems)


def test_alias_bomb_is_refused_without_expanding() -> None:
    # Nine levels of nine-fold aliases: expanding would build ~387 million nodes. Refused from the event
    # stream, the document is never expanded.
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        levels.append(f"a{i}: &a{i} [{refs}]")
    text = "\n".join(levels) + "\n"
    spec, problems = check_spec_text(text, "bomb.yaml")
    assert spec is None
    assert [p.line for p in problems] == [2] and "aliases are not allowed" in problems[0].message
