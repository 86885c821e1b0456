"""Record file codec: the on-disk text of a machine record, written and read fast, still plain YAML.

Place in the flow: `record_files` renders and parses records through this module; `record_index` bulk-parses
new blobs with it. Nothing here touches the file system.

Format (v2, written since the record index): the machine's own fields as block YAML (exactly as before, so
a human still pardons with `status: pardoned`), then one benchmark entry per line as a YAML flow mapping
written in JSON syntax:

    # Written by the fleet reconciler. ...
    machine_id: '40213'
    status: bad
    benchmarks:
    - {"instance_id": "i-1", "at": "2026-12-02T18:00:00Z", "verdict": "ok", ..., "evidence": {...}}

Every YAML reader reads it as before (a JSON object is a YAML flow mapping). A new verdict adds one line,
so a record's diff stays one line per verdict. Reading: libyaml needs ~3.5 ms for a 17 KB record; the
stdlib JSON decoder reads the same entries ~10x faster. The fast path is taken only where JSON and YAML 1.1
(PyYAML) read the same document; anything else - a hand edit in block style, comments, anchors, floats YAML
reads as strings (`1e5`), escapes or characters where the two differ - goes through the YAML loader, so the
fast path changes speed, never meaning (property test: tests/unit/test_record_codec.py). Old block-YAML
records keep loading through the YAML path.

Validation: the JSON Schemas are compiled once into plain Python checks (`compile_schema`) for the keywords
the record schemas use; a document the fast check accepts is valid for jsonschema too (same property test),
and one it refuses is re-checked by jsonschema for the error messages.

Typed decoding (`entry_decoder`): the entry schema is translated into a msgspec struct, so that the entry lines
of a record as the reconciler writes it are decoded and checked by msgspec, one call per line (~5x less CPU
than the stdlib decoder plus the compiled check). It answers only when certain to equal the path above
(property tests in tests/unit/test_record_codec.py); otherwise that path runs, and jsonschema stays the contract.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any, cast

from reconciler.adapters.yaml_library import yaml_library


class _CompiledOnFirstUse:
    """A regex compiled when first used: a large character class takes ~4 ms to compile, a cost a command
    answered from the record index (no parsing) need not pay at import."""

    def __init__(self, pattern: str) -> None:
        self._pattern = pattern

    def __getattr__(self, name: str) -> Any:  # reached only until the first use has compiled it
        compiled = re.compile(self._pattern)
        self.search, self.sub = compiled.search, compiled.sub
        return getattr(compiled, name)


def _compiled_on_first_use(pattern: str) -> re.Pattern[str]:
    return cast("re.Pattern[str]", _CompiledOnFirstUse(pattern))


def compile_lazy_patterns() -> None:
    """Compile now the patterns compiled on first use (before forking parse workers)."""
    for pattern in (_DIVERGENT, _NON_ASCII_BMP):
        pattern.search("")


ENTRIES_KEY = "benchmarks"

# Characters PyYAML's reader refuses in a stream (yaml/reader.py NON_PRINTABLE), plus the ones YAML treats as
# line breaks inside a quoted scalar (NEL, LS, PS: folded, where JSON keeps them) and tabs (JSON whitespace,
# not always YAML whitespace). The writer escapes them; the reader falls back to YAML when it sees one.
_DIVERGENT = _compiled_on_first_use(
    "[^\x0a\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")
# PyYAML's float resolver (yaml/resolver.py): JSON numbers with a fraction or exponent that do not match it
# are strings to YAML ("1e5", "1.5e3"), so they leave the fast path.
_YAML_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?$")
# JSON escapes YAML reads differently: "\/" is not a YAML 1.1 escape everywhere, and a surrogate pair written
# as two \u escapes is one character to JSON but two to PyYAML.
_DIVERGENT_ESCAPE = re.compile(r"\\(?:/|u[dD][89abAB])")
_EXPONENT = re.compile(r"[0-9]e[-+][0-9]")
_SURROGATE_ESCAPE = re.compile(r"\\ud[89ab]", re.IGNORECASE)
_NON_ASCII_BMP = _compiled_on_first_use("[\x7f-\uffff]")
_HEADER_LINE = re.compile(r"^([a-z_]+): (.*)$")
_PLAIN_SAFE = re.compile(r"^[A-Za-z][A-Za-z0-9 ._()/+-]*[A-Za-z0-9._()/+-]$|^[A-Za-z]$")
_YAML_WORDS = frozenset(w for base in ("yes", "no", "true", "false", "on", "off", "null", "y", "n")
                        for w in (base, base.capitalize(), base.upper()))


class NotFast(Exception):
    """The text is outside the fast subset: read it with the YAML loader instead."""


# --- writing ---------------------------------------------------------------------------------------------


def _escape_divergent(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _json_safe(value: Any) -> bool:
    """True if json.dumps writes `value` so that YAML reads back the same (floats with '.' and finite)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return False
        text = repr(value)
        return "e" not in text or "." in text
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_safe(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_safe(v) for v in value)
    return value is None or isinstance(value, str | int | bool)


def entry_line(entry: Mapping[str, Any]) -> str | None:
    """One benchmark entry as `- {json}` (no newline), or None if it cannot be written that way."""
    try:
        # ASCII only (the C encoder escapes the rest as \uXXXX), so a reader checks a line in a microsecond.
        text = json.dumps(entry, allow_nan=False)
    except (ValueError, TypeError):  # inf/nan, or a value JSON has no form for
        return None
    if ("e-" in text or "e+" in text) and _EXPONENT.search(text) and not _json_safe(entry):
        return None  # a float printed with an exponent and no fraction is a string to YAML 1.1
    if "\\ud" in text and _SURROGATE_ESCAPE.search(text):
        # JSON writes a character beyond the BMP as a surrogate pair, which PyYAML reads as two characters:
        # write those raw instead, and the rest of the non-ASCII as \uXXXX.
        text = _NON_ASCII_BMP.sub(_escape_divergent, json.dumps(entry, ensure_ascii=False, allow_nan=False))
    return "- " + text


def render_record(header: str, doc: Mapping[str, Any]) -> str:
    """`header` (comment lines) + the record document: own fields as block YAML, entries one per line.

    Falls back to block YAML for the whole document when an entry holds a value JSON cannot carry to YAML
    unchanged (a float like 1e-07 or inf)."""
    fields = {k: v for k, v in doc.items() if k != ENTRIES_KEY}
    entries = doc.get(ENTRIES_KEY, [])
    if not isinstance(entries, list):
        return header + dump_yaml(dict(doc))
    lines = [entry_line(e) if isinstance(e, dict) else None for e in entries]
    if any(line is None for line in lines):
        return header + dump_yaml(dict(doc))
    body = f"{ENTRIES_KEY}:\n" + "".join(f"{line}\n" for line in lines) if lines else f"{ENTRIES_KEY}: []\n"
    return header + (dump_yaml(fields) if fields else "") + body


def dump_yaml(doc: dict[str, Any]) -> str:
    yaml, _, dumper = yaml_library()
    return yaml.dump(doc, Dumper=dumper, sort_keys=False, allow_unicode=True, width=120)


# --- reading ---------------------------------------------------------------------------------------------


def _parse_float(text: str) -> float:
    # A JSON number reaches here only with a fraction or an exponent: with a fraction and no exponent it is
    # always a YAML float too; only exponents need the YAML pattern.
    if ("e" in text or "E" in text) and not _YAML_FLOAT.match(text):
        raise NotFast(f"number {text} is a string to YAML")
    return float(text)


def _parse_constant(text: str) -> Any:
    raise NotFast(f"{text} is not a YAML number")


_DECODER = json.JSONDecoder(parse_float=_parse_float, parse_constant=_parse_constant)


def _header_scalar(value: str) -> Any:
    """A header value in the forms the YAML dumper writes for short strings, else NotFast."""
    if value in ("null", "~", ""):
        return None
    if _PLAIN_SAFE.match(value) and value not in _YAML_WORDS:
        return value
    if len(value) >= 2 and value[0] == "'" and value[-1] == "'":
        inner = value[1:-1]
        if "'" not in inner.replace("''", ""):
            return inner.replace("''", "'")
    raise NotFast(f"header value {value!r}")


def parse_fast(text: str) -> dict[str, Any]:
    """The record document of `text` as YAML would read it, or NotFast when the text is outside the subset
    where that is certain (the caller then uses the YAML loader). `text` has universal newlines."""
    doc, entry_lines = split_fast(text)
    doc[ENTRIES_KEY] = decode_entry_lines(entry_lines)
    return doc


def split_fast(text: str) -> tuple[dict[str, Any], list[str]]:
    """The record's own fields (read as YAML would, not schema-checked) and its entry lines (`- {...}`, not
    read yet), or NotFast. `text` has universal newlines."""
    doc, body = split_entries(text)
    return doc, entry_lines(body)


def entry_lines(body: str) -> list[str]:
    """The lines of the entry part `split_entries` returns (its last newline ends the last line)."""
    lines = body.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def split_entries(text: str) -> tuple[dict[str, Any], str]:
    """The record's own fields, as `split_fast` reads them, and the text after the `benchmarks:` line (the
    entry lines, each ending with a newline but perhaps the last; "" for none), or NotFast.

    The usual record (comment lines, `field: value` lines, `benchmarks:`, entry lines) is cut with one search:
    the entry lines, most of the bytes, are not split here."""
    mark = text.find(f"\n{ENTRIES_KEY}:")
    after = mark + len(ENTRIES_KEY) + 2
    if mark < 0 or text.startswith(f"{ENTRIES_KEY}:") or text[after:after + 1] != "\n":
        return _split_lines(text)  # no header, an empty list, something after the key: line by line
    # The first line that starts with the key is this one: no earlier line can end the header.
    head = text[:mark].split("\n")
    start = 0
    while start < len(head) and head[start].startswith("#"):
        start += 1
    if _DIVERGENT.search(text, 0, mark):
        raise NotFast("characters JSON and YAML read differently")
    return _header(head[start:]), text[after + 1:]


def _split_lines(text: str) -> tuple[dict[str, Any], str]:
    """`split_entries` for any text: line by line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        i += 1
    header_start = i
    found = False
    while i < len(lines):
        line = lines[i]
        i += 1
        if line == f"{ENTRIES_KEY}:":
            found = True
            break
        if line == f"{ENTRIES_KEY}: []":
            found = True
            if i != len(lines):
                raise NotFast("content after an empty benchmarks list")
            break
    if not found:
        raise NotFast("no benchmarks line")
    if _DIVERGENT.search("\n".join(lines[:i])):
        raise NotFast("characters JSON and YAML read differently")
    return _header(lines[header_start:i - 1]), "".join(f"{line}\n" for line in lines[i:])


def decode_entry_lines(lines: list[str]) -> list[Any]:
    """The entries of these `- {...}` lines as YAML would read them (stdlib JSON decoder), or NotFast."""
    entries: list[Any] = []
    decode = _DECODER.decode
    for line in lines:
        if not line.startswith("- {") or not line.endswith("}"):
            raise NotFast("entry line not in flow style")
        # Raw control characters other than tab are refused by the JSON decoder (strict) inside strings and
        # are not JSON whitespace; tab and DEL are checked here, the rest of the divergent set only occurs in
        # a non-ASCII line (the writer keeps lines ASCII).
        if ("\t" in line or "\x7f" in line) if line.isascii() else _DIVERGENT.search(line) is not None:
            raise NotFast("characters JSON and YAML read differently")
        if "\\" in line and _DIVERGENT_ESCAPE.search(line):
            raise NotFast("escape JSON and YAML read differently")
        try:
            entries.append(decode(line[2:]))
        except ValueError:  # JSONDecodeError; a YAML reading may still succeed (or give the real error)
            raise NotFast("entry line is not JSON") from None
        except RecursionError:
            raise NotFast("nested too deeply") from None
    return entries


#: header line -> (name, value) as `_header` reads it: most lines recur across a fleet's records (status, GPU,
#: host); the values are strings or None, shared safely.
_HEADER_LINES: dict[str, tuple[str, Any]] = {}
_HEADER_LINES_KEPT = 4096


def _header(lines: list[str]) -> dict[str, Any]:
    """The record's own fields: the forms the dumper writes read directly; other block YAML (a hand-written
    note, say) read by the YAML loader on these lines alone. Anything that could reach past the benchmarks
    line (an unterminated quote or flow collection) fails here and sends the whole text to the YAML loader."""
    doc: dict[str, Any] = {}
    known = _HEADER_LINES
    try:
        for line in lines:
            read = known.get(line)
            if read is None:
                m = _HEADER_LINE.match(line)
                if m is None or m.group(1) in _YAML_WORDS:  # `no:`, `on:`, `null:`: YAML reads a bool or null key
                    raise NotFast(line)
                read = m.group(1), _header_scalar(m.group(2))
                if len(known) < _HEADER_LINES_KEPT:
                    known[line] = read
            name, value = read
            if name in doc:
                raise NotFast(line)
            doc[name] = value
    except NotFast:
        chunk = "\n".join(lines)
        if any(line.startswith(("---", "...", "%")) for line in lines) or "&" in chunk or "*" in chunk:
            raise NotFast("header needs the YAML loader's document handling") from None
        yaml, loader, _ = yaml_library()
        try:
            loaded = yaml.load(chunk, Loader=loader) if chunk.strip() else {}
        except (yaml.YAMLError, ValueError, TypeError, AttributeError, IndexError, OverflowError, RecursionError):
            raise NotFast("header is not YAML on its own") from None
        if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
            raise NotFast("header is not a mapping of names") from None
        doc = loaded
    if ENTRIES_KEY in doc:
        raise NotFast("benchmarks given twice")
    return doc


# --- validation --------------------------------------------------------------------------------------------

Check = Callable[[Any], bool]
_ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "$comment", "default", "examples"})
_TYPES: dict[str, Check] = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


class _Unsupported(Exception):
    pass


def _same_json(a: Any, b: Any) -> bool:
    """JSON equality as jsonschema's enum/const use it: booleans are not numbers, 1 == 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def compile_schema(schema: Mapping[str, Any]) -> Check | None:
    """A fast yes/no check equal to jsonschema's `is_valid` for `schema`, or None if the schema uses a keyword
    this compiler does not know (then the caller keeps using jsonschema alone)."""
    try:
        return _compile(schema, schema)
    except _Unsupported:
        return None


def _compile(node: Mapping[str, Any], root: Mapping[str, Any]) -> Check:
    keys = {k for k in node if k not in _ANNOTATIONS and k not in ("$defs", "definitions")}
    special = _object_check(node, keys, root) or _leaf_check(node, keys)
    if special is not None:
        return special
    checks = [_keyword(key, node[key], node, root) for key in node if key in keys]
    if not checks:
        return lambda v: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda v: first(v) and second(v)
    return lambda v: all(c(v) for c in checks)


def _object_check(node: Mapping[str, Any], keys: set[str], root: Mapping[str, Any]) -> Check | None:
    """One closure for the usual object node (type object, properties, required, additionalProperties: false):
    the record entries are checked ~100,000 times on a cold index build, so leaf properties (a type, a
    string enum) are checked inline instead of through a function call each."""
    if node.get("type") != "object" or not keys <= {"type", "properties", "required", "additionalProperties"}:
        return None
    if node.get("additionalProperties", True) not in (True, False):
        return None
    # name -> (types, bool_is_number_excluded, string options, general check); one of them applies
    props: dict[str, tuple[tuple[type, ...] | None, bool, frozenset[str] | None, Check | None]] = {}
    for name, sub in node.get("properties", {}).items():
        leaf = _leaf_types(sub, root)
        if leaf is not None:
            props[name] = (leaf[0], leaf[1], None, None)
        elif set(sub) - _ANNOTATIONS == {"enum"} and all(isinstance(o, str) for o in sub["enum"]):
            props[name] = (None, False, frozenset(sub["enum"]), None)
        else:
            props[name] = (None, False, None, _compile(sub, root))
    required = tuple(node.get("required", ()))
    closed = node.get("additionalProperties") is False

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return False
        for name in required:
            if name not in v:
                return False
        for k, x in v.items():
            prop = props.get(k)
            if prop is None:
                if closed:
                    return False
                continue
            types, no_bool, options, fn = prop
            if types is not None:
                if not isinstance(x, types) or (no_bool and x.__class__ is bool):
                    return False
            elif options is not None:
                if x.__class__ is not str or x not in options:
                    return False
            elif fn is not None and not fn(x):
                return False
        return True

    return check


def _leaf_types(node: Mapping[str, Any], root: Mapping[str, Any]) -> tuple[tuple[type, ...], bool] | None:
    """(isinstance types, whether a bool must be refused) for a node that is only a `type`, else None."""
    if set(node) - _ANNOTATIONS != {"type"}:
        return None
    names = {node["type"]} if isinstance(node["type"], str) else set(node["type"])
    simple: dict[str, tuple[type, ...]] = {"string": (str,), "null": (type(None),), "object": (dict,),
                                           "array": (list,), "boolean": (bool,), "number": (int, float)}
    if not names <= simple.keys():
        return None
    types = tuple(t for n in sorted(names) for t in simple[n])
    return types, "number" in names and "boolean" not in names


def _leaf_check(node: Mapping[str, Any], keys: set[str]) -> Check | None:
    """Type-only nodes, and enums of strings, as one isinstance or set look-up."""
    if keys == {"enum"} and all(isinstance(o, str) for o in node["enum"]):
        options = frozenset(node["enum"])
        return lambda v: isinstance(v, str) and v in options
    if keys != {"type"}:
        return None
    names = {node["type"]} if isinstance(node["type"], str) else set(node["type"])
    simple: dict[str, type] = {"string": str, "null": type(None), "object": dict, "array": list, "boolean": bool}
    if not names <= simple.keys() | {"number"}:
        return None
    plain = tuple(simple[n] for n in names if n in simple)
    if "number" not in names:
        return lambda v: isinstance(v, plain)
    boolean_ok = "boolean" in names
    return lambda v: isinstance(v, plain) or (isinstance(v, int | float) and (boolean_ok or not isinstance(v, bool)))


def _keyword(key: str, value: Any, node: Mapping[str, Any], root: Mapping[str, Any]) -> Check:
    """The check for one keyword of a schema node (JSON Schema 2020-12 semantics: a keyword about one type
    passes values of other types)."""
    if key == "$ref":
        if not isinstance(value, str) or not value.startswith("#/"):
            raise _Unsupported(key)
        target: Any = root
        for part in value[2:].split("/"):
            target = target[part]
        return _compile(target, root)
    if key == "type":
        names = [value] if isinstance(value, str) else list(value)
        if any(n not in _TYPES for n in names):
            raise _Unsupported(str(value))
        fns = [_TYPES[n] for n in names]
        return fns[0] if len(fns) == 1 else _any_of(fns)
    if key == "enum":
        options = list(value)
        return lambda v: any(_same_json(v, o) for o in options)
    if key == "required":
        names = list(value)
        return lambda v: not isinstance(v, dict) or all(n in v for n in names)
    if key == "properties":
        props = {name: _compile(sub, root) for name, sub in value.items()}
        return lambda v: not isinstance(v, dict) or all(props[k](x) for k, x in v.items() if k in props)
    if key == "additionalProperties":
        if value is not False or "patternProperties" in node:
            raise _Unsupported(key)
        allowed = frozenset(node.get("properties", {}))
        return lambda v: not isinstance(v, dict) or v.keys() <= allowed
    if key == "items":
        if not isinstance(value, Mapping):
            raise _Unsupported(key)
        item = _compile(value, root)
        return lambda v: not isinstance(v, list) or all(item(x) for x in v)
    if key == "pattern":
        rx = re.compile(value)
        return lambda v: not isinstance(v, str) or rx.search(v) is not None
    if key in ("minLength", "maxLength"):
        n = int(value)
        if key == "minLength":
            return lambda v: not isinstance(v, str) or len(v) >= n
        return lambda v: not isinstance(v, str) or len(v) <= n
    if key in ("minimum", "maximum"):
        bound = value
        number = _TYPES["number"]
        if key == "minimum":
            return lambda v: not number(v) or v >= bound
        return lambda v: not number(v) or v <= bound
    raise _Unsupported(key)


def _any_of(fns: list[Check]) -> Check:
    return lambda v: any(f(v) for f in fns)


# --- typed entry decoding ----------------------------------------------------------------------------------


class _NotYamlFloat(Exception):
    pass


def _yaml_float(text: str) -> float:
    """msgspec's float_hook: `_parse_float` for the typed decoder (a number YAML reads as a string: not certain)."""
    if ("e" in text or "E" in text) and not _YAML_FLOAT.match(text):
        raise _NotYamlFloat(text)
    return float(text)


#: A number field's check after decoding: (tuple index, null allowed, minimum or None).
_NumberCheck = tuple[int, bool, "int | float | None"]


class EntryDecoder:
    """The entry lines of a record decoded and schema-checked by msgspec, one line per call, into tuples in the
    order of `fields` (the record dataclass's fields). Built from the entry schema by `entry_decoder`; a list it
    returns holds exactly what `decode_entry_lines` + the schema check give (tests/unit/test_record_codec.py).
    Returns None whenever it is not certain of that (a text outside the fast subset, an entry the schema
    refuses, a JSON error): the caller then takes the general path, which gives the real errors.

    Each line is decoded on its own, as YAML reads it: one entry per line (a line holding two objects, or an
    object running on into the next line, is not an entry line; decoding the lines joined into one array
    would have read such lines as entries).

    Number fields are decoded untyped, so that every float literal passes `_yaml_float` (msgspec calls no hook
    for typed floats), and checked here. `raw_field`: that object-typed field is only checked to be a JSON
    object (msgspec skips its contents, still checking they are JSON), not decoded, and left out of the
    tuples (the record index stores entries without their evidence; what is inside it cannot change any other
    field's value)."""

    def __init__(self, decoder: Any, errors: tuple[type[Exception], ...], numbers: list[_NumberCheck],
                 drop_last: bool) -> None:
        from msgspec.structs import astuple

        self._decode = decoder.decode
        self._astuple = astuple
        self._errors = errors
        self._numbers = numbers
        self._cut = itemgetter(slice(None, -1 if drop_last else None))  # the skipped field is the struct's last

    def __call__(self, lines: list[str]) -> list[tuple[Any, ...]] | None:
        return self.decode_entries("".join(f"{line}\n" for line in lines))

    def decode_entries(self, body: str) -> list[tuple[Any, ...]] | None:
        """The entries of `body`, the entry part of a record (`split_entries`), or None (see the class)."""
        # decode_entry_lines' character checks, made once on the whole part (a newline is no divergent
        # character, and no match can span two lines: every line ends with "}").
        if body.isascii():
            if "\t" in body or "\x7f" in body:
                return None
        elif _DIVERGENT.search(body):
            return None
        if "\\" in body and _DIVERGENT_ESCAPE.search(body):
            return None
        # Line by line (as `entry_lines` cuts them; found with memchr, the part is not split): each line is
        # "- {...}", the text after "- " decoded as one entry, made a tuple, the skipped field cut off.
        decode, astuple, cut = self._decode, self._astuple, self._cut
        rows = []
        find, startswith, endswith = body.find, body.startswith, body.endswith
        start, size = 0, len(body)
        try:
            while start < size:
                end = find("\n", start)
                if end < 0:
                    end = size
                if not startswith("- {", start, end) or not endswith("}", start, end):
                    return None
                rows.append(cut(astuple(decode(body[start + 2:end]))))
                start = end + 1
        except self._errors:
            return None
        for row in rows:
            for i, nullable, minimum in self._numbers:
                v = row[i]
                if v is None:
                    if not nullable:
                        return None
                elif ((v.__class__ is not float and v.__class__ is not int)  # a bool is not a number here
                      or (minimum is not None and v < minimum)):
                    return None
        return rows


def entry_decoder(schema: Mapping[str, Any], entry_ref: str, fields: list[tuple[str, Any]],
                  raw_field: str | None = None) -> EntryDecoder | None:
    """An EntryDecoder for the entries of `schema` (the node `entry_ref` points at, "#/$defs/entry"), giving
    tuples in the order of `fields` ((name, default) pairs: what a field absent from the entry becomes; a
    callable default is a factory), `raw_field` left out. None if msgspec is not installed (a virtualenv made
    before it became a dependency), or the entry schema uses anything the translation below does not cover, or
    its properties are not exactly `fields`: the stdlib decoder and the compiled check then do all the work,
    with the same result."""
    try:
        import msgspec
    except ImportError:
        return None
    node: Any = schema
    for part in entry_ref.removeprefix("#/").split("/"):
        node = node[part]
    keys = set(node) - _ANNOTATIONS
    if node.get("type") != "object" or node.get("additionalProperties") is not False \
            or not keys <= {"type", "properties", "required", "additionalProperties"}:
        return None
    props: Mapping[str, Any] = node.get("properties", {})
    required = set(node.get("required", ()))
    if set(props) != {name for name, _ in fields} or not required <= set(props):
        return None
    struct_fields: list[tuple[Any, ...]] = []
    numbers: list[_NumberCheck] = []
    for name, default in fields:
        if name == raw_field:
            continue
        sub = props[name]
        kind = _msgspec_type(sub, msgspec)
        if kind is None:
            number = _number_check(sub)
            if number is None:
                return None
            kind = Any
            numbers.append((len(struct_fields), *number))
        if name in required:
            struct_fields.append((name, kind))
        elif callable(default):
            struct_fields.append((name, kind, msgspec.field(default_factory=default)))
        else:
            struct_fields.append((name, kind, default))
    if raw_field is not None:
        sub = props[raw_field]
        if set(sub) - _ANNOTATIONS != {"type"} or sub["type"] != "object" or raw_field in required:
            return None
        # Any JSON object, its contents skipped (still checked to be JSON); absent: None, left out anyway.
        any_object = msgspec.defstruct("AnyObject", [], forbid_unknown_fields=False)
        struct_fields.append((raw_field, any_object, None))
    entry = msgspec.defstruct("RecordEntry", struct_fields, forbid_unknown_fields=True, gc=False)
    decoder = msgspec.json.Decoder(entry, float_hook=_yaml_float)
    return EntryDecoder(decoder, (msgspec.DecodeError, msgspec.ValidationError, _NotYamlFloat), numbers,
                        raw_field is not None)


def _number_check(node: Mapping[str, Any]) -> tuple[bool, int | float | None] | None:
    """(null allowed, minimum) for a node of type number or [number, null] with at most a minimum."""
    keys = set(node) - _ANNOTATIONS
    names = [node.get("type")] if isinstance(node.get("type"), str) else list(node.get("type") or ())
    minimum = node.get("minimum")
    if not keys <= {"type", "minimum"} or "number" not in names or not set(names) <= {"number", "null"}:
        return None
    if minimum is not None and (not isinstance(minimum, int | float) or isinstance(minimum, bool)):
        return None
    return "null" in names, minimum


def _msgspec_type(node: Mapping[str, Any], msgspec: Any) -> Any:
    """The msgspec type accepting exactly the values the schema node accepts, for the non-number keywords the
    entry schema uses (type string/boolean/null/object, enum of strings, minLength); None for anything else."""
    from typing import Annotated, Literal

    keys = set(node) - _ANNOTATIONS
    if keys == {"enum"}:
        options = list(node["enum"])
        strings = tuple(o for o in options if isinstance(o, str))
        if not strings or len(strings) + options.count(None) != len(options):
            return None
        kind: Any = Literal.__getitem__(strings)
        return kind | None if None in options else kind
    if "type" not in keys or not keys <= {"type", "minLength"}:
        return None
    names = [node["type"]] if isinstance(node["type"], str) else list(node["type"])
    min_length = node.get("minLength")
    if min_length is not None and (not isinstance(min_length, int) or isinstance(min_length, bool)):
        return None
    parts: list[Any] = []
    for name in names:
        if name == "string":
            parts.append(str if min_length is None else Annotated[str, msgspec.Meta(min_length=min_length)])
        elif name == "boolean":
            parts.append(bool)
        elif name == "null":
            parts.append(None)
        elif name == "object":
            parts.append(dict[str, Any])
        else:  # number (checked after decoding), integer, array: not translated
            return None
    if not parts:
        return None
    union = parts[0]
    for part in parts[1:]:
        union = union | part
    return union
