"""Replay of the seed's incident, through the pure `decide` and through `run_pass` with a real git origin.

The incident: an RTX PRO 4000 instance fetched params fine, then benchmark.sh exited 1 with 0 proofs
because cuzk-bench could not reach our own daemon at 127.0.0.1:9820. The seed's dashboard called the
machine bad ("0 proofs/hour"); it was our image. Expected now:
- the record says benchmark-error, exit code 1, the log tail, blamed on the image (software signature),
  and the machine is not marked bad;
- a second machine with the same digest + signature trips the circuit breaker: an image-suspect record
  is committed, and no further machine is marked bad for that failure;
- a genuinely slow machine (20/h vs the pool's 29/h) IS marked bad, keyed by machine_id, host_id kept.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path

import pytest

from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.record_files import load_records, parse_image_record, parse_machine_record
from reconciler.domain.judging import decide
from reconciler.domain.records import RecordSet
from reconciler.flows.judge import run_pass
from tests.fakes import Sleeps
from tests.gitrepos import git, make_origin, origin_file, origin_log
from tests.loop_support import FakeReports, trailers
from tests.scenarios import DAEMON_REFUSED_TAIL, DIGEST, LATER, SPEC, SPEC_YAML, completed_report, error_report

IMAGE_RECORD = f"fleet-spec/images/{DIGEST.removeprefix('sha256:')}.yaml"

FIRST = error_report("pro-4000-0-3f9a1c", "40213", DAEMON_REFUSED_TAIL, host_id="7781")
SECOND = error_report("pro-4000-1-8be210", "51877", DAEMON_REFUSED_TAIL, host_id="9001", registered_min=5)
SLOW = completed_report("pro-4000-0-c41d07", "62001", 20.0, host_id="7781", registered_min=40)
THIRD = error_report("pro-4000-1-77aa01", "73002", DAEMON_REFUSED_TAIL, host_id="9002", registered_min=41)


def _check_first_record(records: RecordSet) -> None:
    record = records.machines["40213"]
    assert record.status == "ok" and record.gpu_name == "RTX PRO 4000" and record.host_id == "7781"
    (entry,) = record.benchmarks
    assert (entry.verdict, entry.blame, entry.marks_bad) == ("benchmark-error", "image", False)
    assert entry.signature == "daemon-connection-refused" and entry.image_digest == DIGEST
    assert entry.evidence["exit_code"] == 1 and entry.evidence["phase"] == "benchmark"
    assert entry.evidence["proofs"]["completed"] == 0
    assert "Error: connection refused (os error 111) connecting to 127.0.0.1:9820" in entry.evidence["log_tail"]
    assert entry.evidence["phases"]["params-done"] == "2026-12-02T18:22:00Z"
    assert entry.reason.startswith("benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused")


def test_seed_incident_through_decide() -> None:
    first = decide(SPEC, [FIRST], RecordSet(), set(), DIGEST, LATER)
    records = RecordSet(machines=first.machine_records)
    _check_first_record(records)
    assert first.image_records == {}

    second = decide(SPEC, [FIRST, SECOND], records, {FIRST.instance_id}, DIGEST, LATER + timedelta(minutes=10))
    (held,) = second.recorded
    assert held.held_by == "circuit-breaker" and not held.marks_bad
    suspect = second.image_records[DIGEST]
    assert suspect.active and suspect.machines == ("40213", "51877") and suspect.pools == ("rtx-pro-4000",)
    records = RecordSet(machines={**records.machines, **second.machine_records}, images=second.image_records)

    third = decide(SPEC, [FIRST, SECOND, SLOW, THIRD], records, {FIRST.instance_id, SECOND.instance_id}, DIGEST,
                   LATER + timedelta(hours=1))
    slow, again = third.recorded
    assert (slow.machine_id, slow.verdict, slow.marks_bad, slow.host_id) == ("62001", "below-min-rate", True, "7781")
    assert (again.machine_id, again.held_by, again.marks_bad) == ("73002", "circuit-breaker", False)
    final = RecordSet(machines={**records.machines, **third.machine_records})
    assert final.bad_machine_ids() == {"62001"}


def test_seed_incident_through_the_loop_with_a_real_origin(tmp_path: Path) -> None:
    origin, _seed = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    git(tmp_path, "clone", "--quiet", str(origin), str(tmp_path / "bot"))
    store = GitStore(tmp_path / "bot", sleep=Sleeps(), rng=random.Random(1))
    source = FakeReports([FIRST])

    first = run_pass(GitFleetTree(store), source, LATER, desired_image_digest=DIGEST)
    assert first.pushed
    _check_first_record(load_records(store.workdir / "fleet-spec"))
    # The commit subject leads with the root cause (issue 14): the operator sees why without digging.
    assert origin_log(origin, "%s")[0] == (
        "fleet: machine 40213 benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused (os error 111) "
        "connecting to 127.0.0.1:9820 (blame: image) [1 verdict]")

    source.items.append(SECOND)
    second = run_pass(GitFleetTree(store), source, LATER + timedelta(minutes=10), desired_image_digest=DIGEST)
    assert second.pushed
    summary = origin_log(origin, "%s")[0]
    assert summary.startswith("fleet: machine 51877 benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection")
    assert summary.endswith(f"(blame: image, held by circuit-breaker) [1 verdict; 1 held by circuit-breaker; image "
                            f"{DIGEST[:19]} suspect: daemon-connection-refused]")
    assert trailers(origin, "Fleet-Image") == [DIGEST]
    suspect = parse_image_record(origin_file(origin, IMAGE_RECORD) or "", Path(IMAGE_RECORD))
    assert suspect.machines == ("40213", "51877") and suspect.instances == (FIRST.instance_id, SECOND.instance_id)
    assert "circuit breaker tripped" in git(origin, "log", "-1", "--format=%b", "main")

    source.items += [SLOW, THIRD]
    third = run_pass(GitFleetTree(store), source, LATER + timedelta(hours=1), desired_image_digest=DIGEST)
    assert third.pushed
    assert origin_log(origin, "%s")[0].startswith(
        "fleet: machine 62001 below-min-rate: benchmark exit 0, 10/10 proofs: 20.0/h < 29/h")
    slow = parse_machine_record(origin_file(origin, "fleet-spec/machines/62001.yaml") or "",
                                Path("fleet-spec/machines/62001.yaml"))
    assert slow.status == "bad" and slow.host_id == "7781" and slow.machine_id == "62001"
    on_origin = load_records(store.workdir / "fleet-spec")
    assert on_origin.bad_machine_ids() == {"62001"}
    assert on_origin.machines["73002"].benchmarks[0].held_by == "circuit-breaker"
    assert set(trailers(origin, "Fleet-Instance")) == {r.instance_id for r in (FIRST, SECOND, SLOW, THIRD)}

    assert run_pass(GitFleetTree(store), source, LATER + timedelta(hours=2), desired_image_digest=DIGEST).commit is None


def test_status_after_the_incident_shows_pause_budget_timelines_and_root_causes() -> None:
    from reconciler.domain.status import status_view
    from reconciler.render.text import render_text
    from tests.scenarios import ev, make_report

    now = LATER + timedelta(hours=1)
    first = decide(SPEC, [FIRST, SECOND, SLOW], RecordSet(), set(), DIGEST, now)
    records = RecordSet(machines=first.machine_records, images=first.image_records)
    running = make_report("pro-4000-0-9d0e11", "80808", registered_min=200,
                          events=[ev("params", "done", 215), ev("benchmark", "started", 220)])
    view = status_view(SPEC, records, [FIRST, SECOND, SLOW, running], now, desired_image_digest=DIGEST)

    (pool,) = [p for p in view.pools if p.name == "rtx-pro-4000"]
    assert (pool.desired, pool.running, pool.benchmarking, pool.bad) == (2, 4, 1, 1)
    assert (pool.kill_budget_used, pool.kill_budget_allowed) == (1, 1)
    assert pool.state == f"paused: image {DIGEST[:19]} suspect (daemon-connection-refused)"
    by_id = {i.instance_id: i for i in view.instances}
    assert by_id[FIRST.instance_id].root_cause == (
        "benchmark-error: benchmark exit 1, 0/10 proofs: Error: connection refused (os error 111) "
        "connecting to 127.0.0.1:9820 "
        "(blame: image)")
    assert by_id[SECOND.instance_id].root_cause is not None
    assert by_id[SECOND.instance_id].root_cause.endswith("(blame: image, held by circuit-breaker)")
    assert by_id[SLOW.instance_id].root_cause == ("below-min-rate: benchmark exit 0, 10/10 proofs: 20.0/h < 29/h "
                                                  "(180.0 s/proof) (blame: machine)")
    assert by_id[running.instance_id].state == "benchmarking" and by_id[running.instance_id].root_cause is None
    assert [label for label, _ in by_id[FIRST.instance_id].timeline] == [
        "registered", "params-done", "bench-started", "bench-failed", "result"]

    text = render_text(view)
    assert "image suspects (circuit breaker):" in text and "machines 40213, 51877" in text
    assert "registered 2026-12-02T18:00:00Z -> params-done +22m00s -> bench-started +25m00s" in text


#: The seed's own incident as it reached us (issue 23): the benchmark exits 1 after 0 proofs and the only lines
#: left in the tail are aria2c's progress lines (aria2 src/ConsoleStatCalc.cc's summary format), so no signature
#: explains it: blame unknown, never the machine. Three distinct machines with one image trip the breaker.
ARIA2C_PROGRESS_ONLY = tuple(f"2026-12-02T18:{10 + n // 4:02d}:{n % 4 * 15:02d}Z [#26a862 {n + 30}GiB/56GiB"
                             f"({(n + 30) * 100 // 56}%) CN:16 DL:408MiB ETA:{26 - n}s]" for n in range(26))
SPEC_OF_THREE_YAML = SPEC_YAML.replace("circuit_breaker: {distinct_machines: 2,",
                                       "circuit_breaker: {distinct_machines: 3,")


def test_the_seed_incident_on_three_machines_pauses_the_pools_and_marks_no_machine_bad(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert SPEC_OF_THREE_YAML != SPEC_YAML
    origin, _seed = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_OF_THREE_YAML})
    git(tmp_path, "clone", "--quiet", str(origin), str(tmp_path / "bot"))
    store = GitStore(tmp_path / "bot", sleep=Sleeps(), rng=random.Random(1))
    machines = (("pro-4000-0-5e0c01", "40213", "7781"), ("pro-4000-1-5e0c02", "51877", "9001"),
                ("rtx4090-0-5e0c03", "62001", "9002"))
    source = FakeReports()
    for n, (instance, machine, host) in enumerate(machines):
        pool = "rtx4090" if instance.startswith("rtx4090") else "rtx-pro-4000"
        source.items.append(error_report(instance, machine, ARIA2C_PROGRESS_ONLY, host_id=host, pool=pool,
                                         registered_min=5 * n))
        result = run_pass(GitFleetTree(store), source, LATER + timedelta(minutes=10 * n), desired_image_digest=DIGEST)
        assert result.pushed
        (verdict,) = result.verdicts
        assert (verdict.verdict, verdict.marks_bad) == ("benchmark-error", False)
        assert verdict.reason.startswith("benchmark-error: benchmark exit 1, 0/10 proofs: ")
        assert "[#26a862" not in verdict.reason  # a progress line is never the cause
        if n < 2:
            # Unexplained and nothing to correlate yet: unknown, held for one retest of the machine (issue 29).
            assert verdict.blame == "unknown" and verdict.held_by == "retest" and not result.image_records
    signature = verdict.signature
    assert signature is not None and signature.startswith("benchmark-error-unrecognized-benchmark-exit-1-")
    assert (verdict.blame, verdict.held_by) == ("image", "circuit-breaker")

    suspect = parse_image_record(origin_file(origin, IMAGE_RECORD) or "", Path(IMAGE_RECORD))
    assert suspect.active and suspect.signature == signature
    assert suspect.machines == ("40213", "51877", "62001") and suspect.pools == ("rtx-pro-4000", "rtx4090")
    assert "circuit breaker tripped" in git(origin, "log", "-1", "--format=%b", "main")
    on_origin = load_records(store.workdir / "fleet-spec")
    assert on_origin.bad_machine_ids() == set()
    assert all(not e.marks_bad for rec in on_origin.machines.values() for e in rec.benchmarks)

    from reconciler.cli import main
    capsys.readouterr()
    code = main(["status", "--spec-dir", str(store.workdir / "fleet-spec"), "--image-digest", DIGEST, "--json"])
    view = json.loads(capsys.readouterr().out)
    assert code == 0
    states = {p["name"]: p["state"] for p in view["pools"]}
    assert states == {name: f"paused: image {DIGEST[:19]} suspect ({signature})"
                      for name in ("rtx-pro-4000", "rtx4090")}
    main(["status", "--spec-dir", str(store.workdir / "fleet-spec"), "--image-digest", DIGEST])
    text = capsys.readouterr().out
    assert "paused: image" in text and "machines 40213, 51877, 62001" in text
