"""`fleet status --html`: the page written from real records on disk and a real controller store, then
rendered by headless Chromium (Debian `chromium`); the rendered DOM and a screenshot are checked.

Chromium missing: the browser tests skip loudly (a warning and the skip reason), unless CI=true or
FLEET_REQUIRE_CHROMIUM=1, where a missing browser is a failure. The page must need no network: Chromium runs
with background networking off and the page's CSP forbids every fetch.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.adapters.atomic_files import write_text_atomic
from reconciler.adapters.record_files import (
    image_record_path,
    machine_record_path,
    render_image_record,
    render_machine_record,
)
from reconciler.cli import main
from reconciler.domain.judging import decide
from reconciler.domain.observations import format_time
from reconciler.domain.records import RecordSet
from tests.browser_support import run_chromium, store_incident
from tests.html_support import (
    FAST,
    FIRST,
    HOSTILE,
    HOSTILE_LINE,
    NOW,
    RUNNING,
    SECOND,
    SLOW,
    DomCollector,
    parse,
    table_rows,
    text_of,
)
from tests.scenarios import DIGEST, SPEC, SPEC_YAML


@dataclass(frozen=True)
class Fleet:
    spec_dir: Path
    db: Path


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """The seed incident as the loop recorded it (records on disk), every worker in a real controller store,
    and one unreadable record a human broke."""
    spec_dir = tmp_path / "fleet-spec"
    write_text_atomic(spec_dir / "fleet.yaml", SPEC_YAML)
    decided = decide(SPEC, [FIRST, SECOND, SLOW], RecordSet(), set(), DIGEST, NOW)
    for record in decided.machine_records.values():
        write_text_atomic(machine_record_path(spec_dir, record.machine_id), render_machine_record(record))
    for image in decided.image_records.values():
        write_text_atomic(image_record_path(spec_dir, image.image_digest), render_image_record(image))
    write_text_atomic(spec_dir / "machines" / "31337.yaml", f"machine_id: 31337\nstatus: [{HOSTILE_LINE}\n")
    db = store_incident(tmp_path / "controller.db")
    yield Fleet(spec_dir, db)


def write_page(fleet: Fleet, out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    # The incident is replayed as of NOW: with the real clock, the running instance would pass its deadline.
    argv = ["status", "--spec-dir", str(fleet.spec_dir), "--controller-db", str(fleet.db), "--image-digest", DIGEST,
            "--at", format_time(NOW), "--html", str(out)]
    # By default the page shows the instances that need the operator: not the destroyed one; --all shows it.
    assert main(argv) == 0
    assert f"wrote {out} (2 pools, 5 instances, 1 bad machines)" in capsys.readouterr().out
    assert main([*argv, "--all"]) == 0
    assert f"wrote {out} (2 pools, 6 instances, 1 bad machines)" in capsys.readouterr().out
    return out.read_text(encoding="utf-8")


def check_incident_dom(dom: DomCollector) -> None:
    assert f"paused: image {DIGEST[:19]} suspect (daemon-connection-refused)" in text_of(
        dom.find("section", id="pools")[0])
    assert [e.attrs["data-rate"] for e in dom.find("line", class_="min-rate")] == ["29", "40"]
    assert [(p.attrs["data-machine"], p.attrs["data-rate"]) for p in dom.with_class("rate-point")
            if "data-rate" in p.attrs] == [("62001", "20"), ("90001", "52")]
    assert {p.attrs["data-machine"] for p in dom.with_class("no-rate")} == {"40213", "51877", "90002"}
    assert {b.attrs["data-instance"] for b in dom.find("svg", class_="timeline")} == {
        r.instance_id for r in (FIRST, SECOND, SLOW, RUNNING, FAST, HOSTILE)}
    first = text_of(dom.find("div", data_instance=FIRST.instance_id)[0])
    assert ("benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused (os error 111) "
            "connecting to 127.0.0.1:9820 "
            "(blame: image)") in first
    assert "registered 2026-12-02T18:00:00Z -> params-done +22m00s -> bench-started +25m00s" in first
    destroyed = dom.find("div", data_instance=FAST.instance_id)[0]
    assert destroyed.attrs["data-state"] == "destroyed" and "destroyed +1h30m" in text_of(destroyed)
    assert table_rows(dom, "bad-machines") == [["62001", "bad", "7781", "RTX PRO 4000", "rtx-pro-4000",
                                               "below-min-rate",
                                               "machine",
                                               "below-min-rate: benchmark exit 0, 10/10 proofs: "
                                               "20.0/h < 29/h (180.0 s/proof)",
                                               "2026-12-02T22:00:00Z"]]
    (suspect,) = table_rows(dom, "image-suspects")
    assert suspect[:4] == [DIGEST[:19], "daemon-connection-refused", "rtx-pro-4000", "40213, 51877"]
    problems = text_of(dom.find("section", id="problems")[0])
    assert "unreadable record" in problems and "31337.yaml" in problems


def test_fleet_status_html_writes_the_page_from_records_and_the_controller_store(
        fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = write_page(fleet, tmp_path / "site" / "status.html", capsys)
    dom = parse(page)
    check_incident_dom(dom)
    assert not dom.find("script") and not dom.find("img") and HOSTILE_LINE in text_of(
        dom.find("div", data_instance=HOSTILE.instance_id)[0])
    assert str(fleet.spec_dir / "fleet.yaml") in text_of(dom.find("dl", id="meta")[0])


def test_the_page_renders_in_headless_chromium_with_the_content_and_no_active_markup(
        chromium: str, fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.html"
    write_page(fleet, out, capsys)

    dumped = run_chromium(chromium, tmp_path, "--dump-dom", out.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = parse(dumped.stdout)
    # The DOM after the browser ran the page: every section laid out with the incident's facts.
    check_incident_dom(dom)
    title = dom.find("title")[0]  # the document's; SVG tooltips are <title> elements too
    assert re.fullmatch(r"fleet status \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text_of(title))
    # The hostile log line stayed text: no element was created from it and nothing ran (it would set the title).
    assert not dom.find("script") and not dom.find("img") and "pwned" not in text_of(title)
    assert HOSTILE_LINE in text_of(dom.find("div", data_instance=HOSTILE.instance_id)[0])

    shot = tmp_path / "page.png"
    taken = run_chromium(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1400,2000", out.as_uri())
    assert taken.returncode == 0, taken.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1400, 2000)
    # A blank page compresses to a few KB; the laid-out page with plots and tables is far larger.
    assert len(png) > 60_000


def test_an_empty_fleet_page_renders_in_chromium(chromium: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    spec_dir = tmp_path / "fleet-spec"
    write_text_atomic(spec_dir / "fleet.yaml", SPEC_YAML)
    out = tmp_path / "empty.html"
    assert main(["status", "--spec-dir", str(spec_dir), "--html", str(out)]) == 0
    assert "(2 pools, 0 instances, 0 bad machines)" in capsys.readouterr().out
    dumped = run_chromium(chromium, tmp_path, "--dump-dom", out.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = parse(dumped.stdout)
    assert "No instances reported yet." in text_of(dom.find("section", id="timelines")[0])
    assert "No machine is recorded bad." in text_of(dom.find("section", id="bad-machines")[0])
    assert len(dom.find("line", class_="min-rate")) == 2 and not dom.with_class("rate-point")


def test_a_stalled_spec_still_writes_a_page_naming_the_problem(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    spec_dir = tmp_path / "fleet-spec"
    write_text_atomic(spec_dir / "fleet.yaml", SPEC_YAML.replace("count: 2", "count: -1"))
    out = tmp_path / "stalled.html"
    assert main(["status", "--spec-dir", str(spec_dir), "--html", str(out)]) == 1
    captured = capsys.readouterr()
    assert "stalled" in captured.err and f"wrote {out}" in captured.out
    dom = parse(out.read_text(encoding="utf-8"))
    (problem,) = [text_of(li) for li in dom.find("li")]
    assert problem.startswith("spec stalled: ") and "count" in problem and "-1" in problem
    assert "1 problem(s)" in text_of(dom.find(id="problem-banner")[0])


def test_an_unreadable_controller_store_is_a_listed_problem_and_exit_1(
        fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "obs.html"
    missing = tmp_path / "nowhere.db"
    argv = ["status", "--spec-dir", str(fleet.spec_dir), "--controller-db", str(missing), "--html", str(out)]
    assert main(argv) == 1
    assert "no controller store there" in capsys.readouterr().err
    dom = parse(out.read_text(encoding="utf-8"))
    problems = text_of(dom.find("section", id="problems")[0])
    assert f"observation failed, instances not shown: {missing}: no controller store there" in problems
    # What the records know is still shown: the bad machine and the suspect image.
    assert [row[0] for row in table_rows(dom, "bad-machines")] == ["62001"]
    assert "No instances reported yet." in text_of(dom.find("section", id="timelines")[0])


def test_html_and_json_are_exclusive_and_an_unwritable_target_is_a_clear_error(
        fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["status", "--spec-dir", str(fleet.spec_dir), "--json", "--html", str(tmp_path / "x.html")])
    assert usage.value.code == 2
    capsys.readouterr()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    assert main(["status", "--spec-dir", str(fleet.spec_dir), "--html", str(blocker / "out.html")]) == 1
    err = capsys.readouterr().err
    assert f"--html {blocker / 'out.html'}: cannot write" in err and "Traceback" not in err
