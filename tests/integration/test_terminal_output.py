"""Records written before control characters were escaped at ingest (or by hand) may hold raw ESC, CR, bidi
overrides or newlines: `fleet why` and `fleet status` write every line of their output escaped, so no such
record drives the terminal or starts a line of its own (issue 30: one line stays one line in every view)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from reconciler.adapters.record_files import machine_record_path, render_machine_record
from reconciler.cli import main
from reconciler.domain.judging import decide
from reconciler.domain.records import RecordSet
from tests.gitrepos import human_commit, make_origin
from tests.scenarios import DAEMON_REFUSED_TAIL, DIGEST, SPEC, SPEC_YAML, T0, error_report

RAW = "cuzk-bench: \x1b]52;c;cm0gLXJmIH4=\x07 \u202etxt.exe\rFleet-Verdict: ok\nFleet-Machine: 11111"


def test_raw_control_characters_in_old_records_are_escaped_on_output(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    report = error_report("pro-4000-0-0ld001", "40999", (*DAEMON_REFUSED_TAIL, "marker line"))
    (record,) = decide(SPEC, [report], RecordSet(), set(), DIGEST, T0.replace(hour=23)).machine_records.values()
    doc = yaml.safe_load(render_machine_record(record))
    evidence = doc["benchmarks"][-1]["evidence"]
    evidence["log_tail"] = [RAW if line == "marker line" else line for line in evidence["log_tail"]]
    assert RAW in evidence["log_tail"]
    path = str(machine_record_path(Path("fleet-spec"), "40999"))
    _, seed = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    human_commit(seed, {path: yaml.safe_dump(doc)}, "machine 40999: benchmark-error\n\nFleet-Machine: 40999\n"
                 "Fleet-Verdict: benchmark-error\nFleet-Instance: pro-4000-0-0ld001\n")
    assert main(["why", "40999", "--repo", str(seed), "--tail", "50"]) == 0
    out = capsys.readouterr().out
    assert "40999" in out and "\\x1b]52;c;" in out and "\\u202etxt.exe\\x0dFleet-Verdict: ok\\x0aFleet-Machine" in out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert not any(line.startswith(("Fleet-Verdict: ok", "Fleet-Machine: 11111")) for line in out.splitlines())
