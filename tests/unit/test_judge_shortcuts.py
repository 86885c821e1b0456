"""The shortcuts that keep a judging pass fast at 10,000 instances (issue 16) give the answers of the plain
code: per-record summaries remembered on the (immutable) record object, the breaker's window over them, the
judge's redaction remembering the lines it has redacted, entries rendered without ABC checks.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from reconciler.domain.breaker import recorded_failures
from reconciler.domain.judging import decide
from reconciler.domain.records import BenchmarkEntry, MachineRecord, RecordSet
from reconciler.domain.redact import Redactor, redact_line, redact_lines
from tests.scenarios import LATER, SPEC, completed_report
from tests.unit.test_redact import CASES, IMAGE_DIGEST, VAST_KEY

SINCE = datetime(2026, 12, 3, 6, 0, tzinfo=UTC)


def _times() -> list[str]:
    """Entry times around the window's start in every form a record may hold (and some it may not)."""
    out = []
    for hours in (-75, -49, -48.5, -47, -30, -24.5, -23, -1, -0.01, 0, 0.01, 5, 30):
        t = SINCE + timedelta(hours=hours)
        out += [t.strftime("%Y-%m-%dT%H:%M:%SZ"), t.strftime("%Y%m%dT%H%M%SZ")]
        for offset in ("+23:59", "-23:59", "+05:30", "-00:00"):
            local = t + timedelta(hours=int(offset[1:3]), minutes=int(offset[4:])) * (1 if offset[0] == "+" else -1)
            out.append(local.strftime("%Y-%m-%dT%H:%M:%S") + offset)
        iso_year, week, day = t.isocalendar()
        out.append(f"{iso_year}-W{week:02d}-{day}T{t:%H:%M:%S}Z")
    return [*out, "", "yesterday", "2026-12-0", "2026-13-40T00:00:00Z", "2026-12-03T06:00:00"]


def test_the_breaker_window_gives_what_parsing_every_entry_gives() -> None:
    entries = [BenchmarkEntry(instance_id=f"i{n}", at=at, verdict=verdict, blame=blame, marks_bad=False, reason="r",
                              pool="p", image_digest=IMAGE_DIGEST, signature="cuda-illegal-address")
               for n, (at, (verdict, blame)) in enumerate(itertools.product(
                   _times(), [("benchmark-error", "image"), ("benchmark-error", "machine"), ("ok", "none")]))]
    records = RecordSet(machines={f"m{k}": MachineRecord(f"m{k}", benchmarks=tuple(entries[k::7])) for k in range(7)})
    every = recorded_failures(records)
    assert len(every) > 20
    for hours in (-72, -48, -25, -24, -1, 0, 0.5, 24, 100):
        since = SINCE + timedelta(hours=hours)
        want = [f for f in every if f.at >= since]
        assert recorded_failures(records, since=since) == want, since


class _Unread(Mapping[str, object]):
    """An entry's evidence that must not be read (an indexed record reads it from its file)."""

    def __getitem__(self, key: str) -> object:
        raise AssertionError("evidence read")

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("evidence read")

    def __len__(self) -> int:
        raise AssertionError("evidence read")


def test_the_breaker_reads_an_entrys_evidence_only_when_its_signature_line_decides() -> None:
    """A cold pass builds every record from the index: the evidence of the machine-blamed failures outside the
    window, of passing benchmarks and of image-blamed failures is never read (only a machine blame within the window
    reads its signature line: `symptom_only`)."""
    def entry(n: int, hours: float, verdict: str, blame: str, evidence: Mapping[str, object]) -> BenchmarkEntry:
        return BenchmarkEntry(f"i{n}", f"{SINCE + timedelta(hours=hours):%Y-%m-%dT%H:%M:%SZ}", verdict, blame, False,
                              "r", pool="p", image_digest=IMAGE_DIGEST, signature="cuda-unknown-error",
                              evidence=evidence)
    line = {"signature": {"line": "cuzk-daemon: sppark::Error #-999"}}
    records = RecordSet(machines={"m1": MachineRecord("m1", benchmarks=(
        entry(1, -30, "benchmark-error", "machine", _Unread()),  # outside the window
        entry(2, 1, "ok", "none", _Unread()),
        entry(3, 1, "benchmark-error", "image", _Unread()),
        entry(4, 2, "benchmark-error", "machine", line)))})
    assert [f.instance_id for f in recorded_failures(records, since=SINCE)] == ["i3", "i4"]


def test_a_record_remembers_its_summaries_and_a_changed_record_starts_afresh() -> None:
    calls: list[str] = []

    def count(rec: MachineRecord) -> int:
        calls.append(rec.machine_id)
        return len(rec.benchmarks)

    rec = MachineRecord("m1", benchmarks=(BenchmarkEntry("i1", "2026-12-03T06:00:00Z", "ok", "none", False, "r"),))
    assert rec.derived("n", count) == rec.derived("n", count) == 1 and calls == ["m1"]
    failing = BenchmarkEntry("i2", "2026-12-03T07:00:00Z", "benchmark-error", "image", False, "r", pool="p",
                             image_digest=IMAGE_DIGEST, signature="cuda-illegal-address")
    assert recorded_failures(RecordSet(machines={"m1": rec})) == []
    grown = rec.with_entry(failing, host_id=None, gpu_name=None)
    assert grown.derived("n", count) == 2 and calls == ["m1", "m1"]
    assert [f.instance_id for f in recorded_failures(RecordSet(machines={"m1": grown}))] == ["i2"]
    assert rec == MachineRecord("m1", benchmarks=rec.benchmarks)  # what is remembered is not part of the value
    assert "_derived" not in repr(rec)


def test_decide_sees_an_instance_judged_in_a_record_that_changed_between_passes() -> None:
    report = completed_report("inst-1", "40213", 50.0)
    rec = MachineRecord("40213")
    first = decide(SPEC, [report], RecordSet(machines={"40213": rec}), (), None, LATER)
    assert [v.instance_id for v in first.verdicts] == ["inst-1"]
    judged = first.machine_records["40213"]
    assert decide(SPEC, [report], RecordSet(machines={"40213": judged}), (), None, LATER).verdicts == ()
    assert [v.instance_id for v in decide(SPEC, [report], RecordSet(machines={"40213": rec}), (), None,
                                          LATER).verdicts] == ["inst-1"]  # the old record object: still unjudged


def test_remembered_redaction_equals_redaction() -> None:
    lines = [line for _, line, _, _ in CASES] + [f"key={VAST_KEY}", "-----BEGIN RSA PRIVATE KEY-----", "MIIEow" * 12,
                                                 "-----END RSA PRIVATE KEY----- after", "plain line"]
    plain = Redactor()
    for _ in range(2):  # the second time from the memo
        assert [redact_line(line) for line in lines] == [plain.line(line) for line in lines]
        assert redact_lines(lines) == plain.lines(lines)
    assert VAST_KEY not in "".join(redact_lines(lines))


def _plain_reference(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _plain_reference(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_reference(v) for v in value]
    return value


def test_an_entry_renders_as_the_plain_copy_of_its_fields() -> None:
    evidence = {"log_tail": ("a", "b"), "phases": MappingProxyType({"params": "t"}), 3: [1.5, None, True],
                "nested": {"x": ({"y": ()},)}, "empty": {}}
    entries = [BenchmarkEntry("i1", "2026-12-03T06:00:00Z", "ok", "none", False, "r"),
               BenchmarkEntry("i2", "2026-12-03T06:00:00Z", "timeout", "unknown", True, "r", pool="p",
                              proofs_per_hour=0.0, probation=False, evidence=evidence),
               BenchmarkEntry("i3", "t", "ok", "none", False, "r", evidence=MappingProxyType({}))]
    for entry in entries:
        want = {f.name: _plain_reference(getattr(entry, f.name)) for f in fields(entry)
                if f.name != "evidence" and getattr(entry, f.name) is not None and getattr(entry, f.name) != {}}
        if entry.evidence:
            want["evidence"] = _plain_reference(entry.evidence)
        got = entry.to_yaml_dict()
        assert got == want and list(got) == list(want)
        assert got.get("evidence") is not entry.evidence
