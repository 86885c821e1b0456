"""`fleet why` and `fleet records` on real git repos written through GitStore, read from a plain human clone."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.adapters.git import CommitRequest, FileChange, GitStore
from reconciler.adapters.record_files import render_image_record, render_machine_record
from reconciler.cli import main
from reconciler.domain.records import BenchmarkEntry, ImageSuspectRecord, MachineRecord
from tests.gitrepos import clone, git, human_commit, make_origin

DIGEST = "sha256:" + "ab" * 32
SLOW_TAIL = ["[9/10] ok — 175.2s", "[10/10] ok — 181.0s", "=== Batch Summary ===", "completed: 10",
             "throughput:    0.333 proofs/min (180.0s/proof)"]
CUDA_TAIL = ["loading SRS", "CUDA error: an illegal memory access was encountered", "cuzk-bench: exit 1"]


def _slow(instance: str, rate: float, at: str) -> BenchmarkEntry:
    return BenchmarkEntry(instance_id=instance, at=at, verdict="below-min-rate", blame="machine", marks_bad=True,
                          reason=f"{rate} proofs/h is below the pool minimum 40", contract_id="9001",
                          pool="rtx4090", image_digest=DIGEST, proofs_per_hour=rate,
                          seconds_per_proof=round(3600 / rate, 1), min_rate_proofs_per_hour=40.0,
                          evidence={"phase": "benchmark", "exit_code": 0, "log_tail": SLOW_TAIL})


def _ok(instance: str, rate: float, at: str) -> BenchmarkEntry:
    return BenchmarkEntry(instance_id=instance, at=at, verdict="ok", blame="none", marks_bad=False,
                          reason=f"{rate} proofs/h meets the pool minimum 40", pool="rtx4090",
                          image_digest=DIGEST, proofs_per_hour=rate, min_rate_proofs_per_hour=40.0,
                          evidence={"phase": "benchmark", "exit_code": 0, "log_tail": ["ok"]})


def _cuda(instance: str, at: str) -> BenchmarkEntry:
    return BenchmarkEntry(instance_id=instance, at=at, verdict="benchmark-error", blame="machine", marks_bad=True,
                          reason="benchmark exited 1: cuda-illegal-address", pool="rtx4090", image_digest=DIGEST,
                          signature="cuda-illegal-address", min_rate_proofs_per_hour=40.0,
                          evidence={"phase": "benchmark", "exit_code": 1, "log_tail": CUDA_TAIL})


def _publish(store: GitStore, record: MachineRecord, entry: BenchmarkEntry) -> str:
    path = f"fleet-spec/machines/{record.machine_id}.yaml"
    request = CommitRequest(
        summary=f"verdict: machine {record.machine_id} {entry.verdict}", body=entry.reason,
        trailers=(("Fleet-Machine", record.machine_id), ("Fleet-Verdict", entry.verdict),
                  ("Fleet-Image", DIGEST), ("Fleet-Instance", entry.instance_id)),
        changes=(FileChange(path, render_machine_record(record)),))
    result = store.publish(lambda wd: request)
    assert result.commit is not None
    return result.commit


@pytest.fixture
def fleet_repo(tmp_path: Path) -> Path:
    """Origin with: machine 40213 judged twice (a slow run, then a CUDA crash), machine 555 judged
    bad then pardoned by deletion, machine 777 passing; returns a plain human clone at the tip."""
    bare, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": "version: 1\n"})
    store = GitStore.clone(str(bare), tmp_path / "bot", sleep=lambda s: None, rng=random.Random(1))
    rec = MachineRecord("40213").with_entry(_ok("rtx4090-0-aaa", 50.0, "2026-12-01T09:00:00Z"),
                                            host_id="77", gpu_name="RTX 4090")
    rec = rec.with_entry(_slow("rtx4090-0-bbb", 20.0, "2026-12-02T10:00:00Z"), host_id="77", gpu_name="RTX 4090")
    _publish(store, rec, rec.benchmarks[-1])
    rec555 = MachineRecord("555").with_entry(_slow("rtx4090-1-ccc", 12.0, "2026-12-02T11:00:00Z"), host_id="8",
                                             gpu_name="RTX 4090")
    _publish(store, rec555, rec555.benchmarks[-1])
    rec = rec.with_entry(_cuda("rtx4090-0-ddd", "2026-12-03T08:00:00Z"), host_id="77", gpu_name="RTX 4090")
    _publish(store, rec, rec.benchmarks[-1])
    rec777 = MachineRecord("777").with_entry(_ok("rtx4090-2-eee", 61.0, "2026-12-03T09:00:00Z"), host_id="9",
                                             gpu_name="RTX 4090")
    _publish(store, rec777, rec777.benchmarks[-1])
    human = clone(bare, tmp_path / "human")
    human_commit(human, {"fleet-spec/machines/555.yaml": None}, "pardon 555: host replaced the riser")
    return human


def _why(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["why", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_why_shows_every_verdict_commit_with_evidence(fleet_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _why(capsys, "40213", "--repo", str(fleet_repo))

    assert (code, err) == (0, "")
    assert out.startswith("machine 40213: bad (fleet-spec/machines/40213.yaml)\n2 verdict commit(s)")
    assert "2 verdict commit(s), newest first:" in out
    newest, oldest = out.split("\ncommit ")[1:]
    assert "verdict: machine 40213 benchmark-error" in newest
    assert "instance rtx4090-0-ddd, pool rtx4090, judged 2026-12-03T08:00:00Z" in newest
    assert "verdict:   benchmark-error (blame: machine; marks the machine bad)" in newest
    assert "exit code: 1   phase: benchmark   signature: cuda-illegal-address" in newest
    assert "| CUDA error: an illegal memory access was encountered" in newest
    assert "rtx4090-0-bbb" not in newest  # only the entry this commit judged
    assert "instance rtx4090-0-bbb (contract 9001)" in oldest
    assert "root cause: 20.0 proofs/h is below the pool minimum 40" in oldest  # shown first (issue 14)
    assert "rate:      20 proofs/h (180 s/proof) vs min 40" in oldest
    assert f"image:     {DIGEST}" in oldest
    assert "| throughput:    0.333 proofs/min (180.0s/proof)" in oldest
    assert "rtx4090-0-aaa" not in out  # the passing run was never a verdict commit of its own


def test_why_json_and_tail_limit(fleet_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _why(capsys, "40213", "--repo", str(fleet_repo), "--json")
    report = json.loads(out)
    assert code == 0 and report["status"] == "bad"
    assert [v["trailers"]["Fleet-Instance"] for v in report["verdicts"]] == [["rtx4090-0-ddd"], ["rtx4090-0-bbb"]]
    first = report["verdicts"][0]
    assert first["author"].startswith("fleet-reconciler <")
    assert first["entries"][0]["evidence"]["exit_code"] == 1
    assert first["entries"][0]["evidence"]["log_tail"] == CUDA_TAIL

    _, text, _ = _why(capsys, "40213", "--repo", str(fleet_repo), "--tail", "1")
    assert "log tail (1 of 3 line(s)):\n      | cuzk-bench: exit 1\n" in text
    assert "loading SRS" not in text


def test_why_on_machine_pardoned_by_deletion(fleet_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _why(capsys, "555", "--repo", str(fleet_repo))

    assert code == 0
    assert out.startswith("machine 555: deleted (fleet-spec/machines/555.yaml)\n  pardoned by deletion")
    assert "record deleted in " in out and "by Ada Operator <ada@example.invalid>: pardon 555" in out
    assert "1 verdict commit(s)" in out and "12 proofs/h" in out


def test_why_reads_the_checked_out_branch_from_cwd(fleet_repo: Path) -> None:
    git(fleet_repo, "checkout", "--quiet", "-b", "pardon-777")
    human_commit_local = fleet_repo / "fleet-spec/machines/777.yaml"
    human_commit_local.write_text(human_commit_local.read_text().replace("status: ok", "status: pardoned"))
    git(fleet_repo, "commit", "--quiet", "-am", "pardon 777 (local branch, not pushed)")
    fleet = Path(sys.executable).parent / "fleet"
    cmd = [str(fleet)] if fleet.exists() else [sys.executable, "-m", "reconciler.cli"]
    proc = subprocess.run([*cmd, "why", "777"], cwd=fleet_repo / "fleet-spec", capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("machine 777: pardoned ")
    assert "record last changed in " in proc.stdout and "pardon 777 (local branch" in proc.stdout


def test_why_unknown_machine(fleet_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _why(capsys, "4021", "--repo", str(fleet_repo))
    assert code == 1 and out == ""
    assert err.startswith("fleet why: machine 4021 is unknown in ")
    assert "Fleet-Machine: 4021" in err


@pytest.mark.parametrize("bad_id", ["../x", "a/b", "..", "-rf"])
def test_why_unsafe_id(fleet_repo: Path, capsys: pytest.CaptureFixture[str], bad_id: str) -> None:
    code, out, err = _why(capsys, "--repo", str(fleet_repo), "--", bad_id)
    assert code == 2 and out == ""
    assert err.startswith(f"fleet why: machine_id {bad_id!r} is not a safe id")


def test_why_outside_a_checkout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _why(capsys, "40213", "--repo", str(tmp_path))
    assert code == 2 and "is not inside a git checkout" in err


def _records(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["records", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_records_table(fleet_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = fleet_repo / "fleet-spec"
    code, out, err = _records(capsys, "--spec-dir", str(spec))

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"{spec}: 2 machine record(s) (1 bad, 1 ok), 0 active image suspect(s), 0 unreadable"
    bad_header = lines.index("Bad machines (1): excluded from every offer query")
    assert lines[bad_header + 1].split() == ["MACHINE", "STANDING", "HOST", "GPU", "LAST", "VERDICT", "DATE",
                                             "REASON"]
    assert lines[bad_header + 2].split()[:7] == ["40213", "bad", "77", "RTX", "4090", "benchmark-error",
                                                 "2026-12-03T08:00:00Z"]
    assert lines[bad_header + 2].endswith("benchmark exited 1: cuda-illegal-address")
    perf = lines.index("Measured throughput (2 machine(s), proofs/hour)")
    assert [row.split() for row in lines[perf + 2:perf + 4]] == [
        ["777", "RTX", "4090", "61.0", "61.0", "1"], ["40213", "RTX", "4090", "35.0", "20.0", "2"]]
    assert "Image suspects (0)" in lines and "Unreadable" not in out


def test_records_json_image_suspects_and_unreadable(fleet_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = fleet_repo / "fleet-spec"
    image = ImageSuspectRecord(image_digest=DIGEST, signature="command-not-found", status="suspect",
                               machines=("40213", "777"), tripped_at="2026-12-03T10:00:00Z", pools=("rtx4090",),
                               reason="same failure on 2 machines within 24h")
    (spec / "images").mkdir()
    (spec / "images" / f"{'ab' * 32}.yaml").write_text(render_image_record(image))
    (spec / "machines" / "999.yaml").write_text("machine_id: '999'\nstatus: dubious\nbenchmarks: []\n")

    code, out, err = _records(capsys, "--spec-dir", str(spec), "--json")
    report = json.loads(out)

    assert code == 1
    assert report["counts"] == {"machines": 2, "machines_by_status": {"bad": 1, "ok": 1},
                                "image_suspects_active": 1, "unreadable": 1}
    assert report["bad_machines"] == [{"machine_id": "40213", "host_id": "77", "gpu_name": "RTX 4090",
                                       "standing": "bad", "excluded": True, "until": None,
                                       "standing_detail": report["bad_machines"][0]["standing_detail"],
                                       "verdict": "benchmark-error",
                                       "reason": "benchmark exited 1: cuda-illegal-address",
                                       "at": "2026-12-03T08:00:00Z", "instance_id": "rtx4090-0-ddd"}]
    assert report["perf"][1] == {"machine_id": "40213", "gpu_name": "RTX 4090", "samples": 2,
                                 "median_proofs_per_hour": 35.0, "last_proofs_per_hour": 20.0}
    assert report["image_suspects"][0]["machines"] == ["40213", "777"]
    assert len(report["problems"]) == 1 and "999.yaml" in report["problems"][0]
    assert "dubious" in err

    code, text, _ = _records(capsys, "--spec-dir", str(spec))
    assert code == 1
    assert "Image suspects (1)" in text and "command-not-found" in text and "40213,777" in text
    assert "Unreadable records (1): excluded from offers until fixed" in text


def _on_probation(spec: Path) -> None:
    """Machine 31337: marked bad on 12-01, expired on 12-02, on probation until 2027-01-01."""
    entry = BenchmarkEntry(instance_id="rtx4090-3-fff", at="2026-12-01T08:00:00Z", verdict="below-min-rate",
                           blame="machine", marks_bad=True, reason="12.0 proofs/h is below the pool minimum 40",
                           pool="rtx4090", proofs_per_hour=12.0, expires_at="2026-12-02T08:00:00Z",
                           probation_until="2027-01-01T08:00:00Z")
    record = MachineRecord("31337", "bad", host_id="12", gpu_name="RTX 4090", benchmarks=(entry,))
    (spec / "machines" / "31337.yaml").write_text(render_machine_record(record))
    # Machine 31338: the same, and it passed again on probation (status ok now; still on probation).
    passed = MachineRecord("31338", "bad", host_id="13", gpu_name="RTX 4090", benchmarks=(entry,)).with_entry(
        _ok("rtx4090-4-ggg", 55.0, "2026-12-02T20:00:00Z"), host_id="13", gpu_name="RTX 4090")
    assert passed.status == "ok"
    (spec / "machines" / "31338.yaml").write_text(render_machine_record(passed))


def test_records_show_each_machines_standing_and_list_probation_apart(
        fleet_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = fleet_repo / "fleet-spec"
    _on_probation(spec)
    code, out, err = _records(capsys, "--spec-dir", str(spec), "--at", "2026-12-03T12:00:00Z")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    bad_header = lines.index("Bad machines (1): excluded from every offer query")
    assert lines[bad_header + 1].split()[:4] == ["MACHINE", "STANDING", "HOST", "GPU"]
    assert lines[bad_header + 2].split()[:2] == ["40213", "bad"]
    probation = lines.index("On probation (2): rentable again; a failure now is permanent")
    assert lines[probation + 2].split()[:3] == ["31337", "probation", "2027-01-01T08:00:00Z"]
    assert lines[probation + 3].split()[:3] == ["31338", "probation", "2027-01-01T08:00:00Z"]
    assert "31337" not in "\n".join(lines[bad_header:probation])

    code, out, _ = _records(capsys, "--spec-dir", str(spec), "--json", "--at", "2026-12-03T12:00:00Z")
    doc = json.loads(out)
    assert [(m["machine_id"], m["standing"], m["excluded"]) for m in doc["bad_machines"]] == [("40213", "bad", True)]
    assert doc["bad_machines"][0]["standing_detail"].startswith("no expiry")
    on_probation, passed = doc["probation"]
    assert (passed["machine_id"], passed["standing"], passed["verdict"]) == ("31338", "probation", "below-min-rate")
    assert (on_probation["machine_id"], on_probation["standing"], on_probation["excluded"], on_probation["until"]) \
        == ("31337", "probation", False, "2027-01-01T08:00:00Z")
    # Before its expiry the same record excludes the machine.
    code, out, _ = _records(capsys, "--spec-dir", str(spec), "--json", "--at", "2026-12-01T12:00:00Z")
    doc = json.loads(out)
    assert [(m["machine_id"], m["standing"]) for m in doc["bad_machines"]] == [("31337", "bad"), ("40213", "bad")]
    assert doc["probation"] == []


def test_records_missing_spec_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _records(capsys, "--spec-dir", str(tmp_path / "nope"))
    assert code == 1 and "is not a directory" in err
