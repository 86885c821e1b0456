"""`fleet apply` and the slot provider against the STRICT vast.ai fake (issue 15, "done when").

- a key revoked mid-run stops the apply: nothing dropped, destroyed or recorded; the next run continues;
- a 10-slot apply under vast's create limit (and extra 429s without Retry-After) rents exactly 10;
- a create that commits after the client gave up leaves one instance per slot (found by label, or destroyed
  as a duplicate and recorded when it committed even later);
- every instance status leads to its action after its deadline, as a marketplace fault (no machine record);
- an orphan from a killed apply (a real subprocess SIGKILLed right after vast rented) is adopted when its slot
  is still wanted, else listed with its $/h, destroyed after the grace period and committed with evidence;
- the fleet spend cap holds creates in the planner and refuses them in the provider, and says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.git import GitStore
from reconciler.adapters.marketplace import vastai
from reconciler.adapters.marketplace.vastai import RetryPolicy, Timeouts, VastAiMarketplace
from reconciler.adapters.record_files import load_records
from reconciler.adapters.slot_provider import SlotProvider, load_slot_state
from reconciler.adapters.spec_files import check_spec_text
from reconciler.cli import main
from reconciler.domain.marketplace import MarketplaceAuthError
from reconciler.domain.planner import REASON_INSTANCE_DEAD, REASON_INSTANCE_STUCK, STATUS_RULES, plan
from reconciler.domain.slots import SpendCapError, slot_inputs
from reconciler.domain.spec import FleetSpec
from reconciler.domain.status import FleetStatus, MarketStatus
from reconciler.flows.provision import MARKET_VIEW_FILE, ApplyReport, Image, apply_fleet, git_orphan_recorder
from reconciler.render.text import render_text
from tests.gitrepos import make_origin, origin_file, origin_log
from tests.vast_fake import VastFake, market_of

KEY = "vk-fleet-test-0123456789abcdef"
SECRET = b"vast-fleet-test-controller-secret"
DIGEST = "sha256:" + "e" * 64
IMAGE = Image(f"registry.example/worker@{DIGEST}", DIGEST)
PREFIX = "gpu-fleet/test/"


def spec_text(count: int = 2, *, pool: str = "p4090", extra: str = "") -> str:
    return f"""\
version: 1
name: test
{extra}image:
  repository: registry.example/worker
controller:
  url: https://controller.example
pools:
  - name: {pool}
    gpu_name: RTX 4090
    count: {count}
    min_rate_proofs_per_hour: 40
    max_price_usd_per_hour: 0.60
    min_reliability: 0.95
    min_inet_down_mbps: 500
"""


def spec_of(text: str) -> FleetSpec:
    spec, problems = check_spec_text(text, "fleet.yaml")
    assert spec is not None, problems
    return spec


class Rig:
    """A spec directory, a state directory and a slot provider over the strict fake, on the fake's clock."""

    def __init__(self, root: Path, fake: VastFake, text: str):
        self.root, self.fake = root, fake
        self.spec_dir = root / "fleet-spec"
        self.spec_dir.mkdir(exist_ok=True)
        self.set_spec(text)
        self.state = root / "state" / "slots.json"
        self.said: list[str] = []
        self.market = VastAiMarketplace(KEY, base_url=fake.base_url, clock=fake.clock, sleep=fake.clock.sleep,
                                        jitter=lambda: 0.0, retry=RetryPolicy(max_attempts=3),
                                        timeouts=Timeouts(create_s=0.3), notify=self.said.append,
                                        key_source="$VAST_API_KEY")
        self.provider = SlotProvider(self.market, SECRET, clock=fake.clock)

    def set_spec(self, text: str) -> None:
        self.text = text
        (self.spec_dir / "fleet.yaml").write_text(text)

    @property
    def spec(self) -> FleetSpec:
        return spec_of(self.text)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.fake.clock(), UTC)

    def apply(self, **kw: Any) -> ApplyReport:
        lines: list[str] = []
        report = apply_fleet(self.spec, load_records(self.spec_dir), self.provider, self.state, IMAGE, self.now(),
                             echo=lines.append, **kw)
        self.lines = lines
        return report

    def slots(self) -> dict[str, Any]:
        return {s: o.contract_id for s, o in load_slot_state(self.state).items()}


@pytest.fixture
def fake() -> Iterator[VastFake]:
    with VastFake(api_key=KEY, offers=market_of(16)) as server:
        yield server


# --- a key revoked mid-run --------------------------------------------------------------------------------------


def test_a_key_revoked_mid_apply_stops_it_and_drops_destroys_records_nothing(
        fake: VastFake, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vastai.client, "TIME", vastai.TimeSource(fake.clock, fake.clock.sleep))
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("FLEET_CONTROLLER_SECRET", SECRET.decode())
    rig = Rig(tmp_path, fake, spec_text(4))
    bare, _seed = make_origin(tmp_path, {"README.md": "fleet\n"})
    workdir = tmp_path / "bot"
    GitStore.clone(str(bare), workdir).close()
    argv = ["apply", "--spec", str(rig.spec_dir / "fleet.yaml"), "--backend", "vastai", "--state-dir",
            str(rig.state.parent), "--vast-base-url", fake.base_url, "--image", IMAGE.ref, "--workdir", str(workdir)]
    assert main(argv) == 0, capsys.readouterr()
    first = rig.slots()
    assert len(first) == 4

    # Scale to 8; the key is deleted after a few more calls: in the middle of the creates.
    rig.set_spec(spec_text(8))
    fake.revoke_key(after_requests=9)
    code = main(argv)
    out = capsys.readouterr()
    assert code == 1
    assert "fleet apply: stopped: vast.ai rejected the API key from $VAST_API_KEY" in out.err
    assert "no slot is dropped, no instance destroyed, nothing recorded" in out.err and "Traceback" not in out.err
    during = rig.slots()
    assert {s: c for s, c in during.items() if s in first} == first  # nothing dropped
    assert len(during) == 5  # stopped in the middle: 4 kept + 1 rented before the key went
    assert not fake.requests_to("DELETE", "/api/v0/instances/")  # nothing destroyed
    assert origin_log(bare) == [origin_log(bare)[-1]]  # nothing recorded (only the seed commit)
    assert all(fake.instances_with_label(PREFIX + o.instance_id) == [int(o.contract_id)]
               for o in load_slot_state(rig.state).values())  # every rental the market has, the state has

    fake.restore_key()
    assert main(argv) == 0, capsys.readouterr()
    after = rig.slots()
    assert len(after) == 8 and {s: c for s, c in after.items() if s in during} == during
    assert len(fake.visible_instances()) == 8


def test_an_expired_session_while_observing_changes_nothing(fake: VastFake, tmp_path: Path) -> None:
    rig = Rig(tmp_path, fake, spec_text(2))
    assert rig.apply().converged
    state = rig.state.read_bytes()
    fake.expire_session()
    with pytest.raises(MarketplaceAuthError, match="does not mean anything is gone"):
        rig.apply()
    assert rig.state.read_bytes() == state and not fake.requests_to("DELETE", "/api/v0/instances/")


# --- rate limits ---------------------------------------------------------------------------------------------


def test_a_rate_limited_ten_slot_apply_rents_ten(fake: VastFake, tmp_path: Path) -> None:
    rig = Rig(tmp_path, fake, spec_text(10))
    fake.rate_limit_next(3, method="PUT")  # on top of vast's own limit: three 429s without Retry-After
    report = rig.apply()
    assert report.converged, rig.lines
    assert len(rig.slots()) == 10 and len(fake.visible_instances()) == 10
    creates = [r for r in fake.requests_to("PUT", "/api/v0/asks/") if r.status == 200]
    assert len(creates) == 10
    assert sum(r.status == 429 for r in fake.requests) == 3  # only the injected ones: the pacer kept under
    assert any("waiting 13.0 s (no Retry-After; create penalty)" in line for line in rig.said)
    assert any("(pacing: at most one create per 5 s per API key)" in line for line in rig.said)


def test_an_apply_that_meets_the_daily_search_quota_stops_searching_until_its_retry_after(
        fake: VastFake, tmp_path: Path) -> None:
    rig = Rig(tmp_path, fake, spec_text(4))
    fake.exhaust_search_quota(retry_after_s=5 * 3600)
    report = rig.apply()
    assert not report.converged and len(report.failed) == 4 and all(r.temporary for r in report.failed)
    waits = [r.retry_after_s for r in report.failed]
    assert None not in waits and 5 * 3600 - 60 < min(waits) <= max(waits) == 5 * 3600, waits  # type: ignore
    assert len(fake.requests_to("POST", "/api/v0/bundles/")) == 1  # one 429, then nobody asked again
    assert any("the daily search quota is used up" in line and "Retry-After 18000 s" in line
               for line in rig.lines), rig.lines
    assert not fake.requests_to("PUT", "/api/v0/asks/")
    # `fleet status --state-dir` says so, with the time the market named.
    market = MarketStatus.from_json(json.loads((rig.state.parent / MARKET_VIEW_FILE).read_text()))
    assert market.wait is not None and "search_quota_exceeded" in market.wait["why"]
    until = datetime.fromisoformat(market.wait["until"].replace("Z", "+00:00"))
    # Counted from the apply's start (the wait began a few paced seconds later): at most the apply's duration early.
    assert timedelta(seconds=-60) < until - (rig.now() + timedelta(hours=5)) <= timedelta(0)
    shown = render_text(FleetStatus(at="now", pools=(), instances=(), suspects=(), market=market))
    assert f"the market asked us to wait: no call before {market.wait['until']}" in shown
    fake.clock.advance(5 * 3600)
    assert rig.apply().converged and len(rig.slots()) == 4


def test_a_truncated_search_answer_is_not_read_as_a_market_shortfall(fake: VastFake, tmp_path: Path) -> None:
    # The server cuts its answer to 3 rows; all three are on machines recorded bad. More may fit: no shortfall.
    rig = Rig(tmp_path, fake, spec_text(1))
    fake.max_results = 3
    fake.ignored_fields = {"machine_id"}  # as if the server dropped our exclusion too: the client filters
    for machine in ("60001", "60002", "60003"):
        (rig.spec_dir / "machines").mkdir(exist_ok=True)
        (rig.spec_dir / "machines" / f"{machine}.yaml").write_text(
            f"machine_id: '{machine}'\nstatus: bad\nbenchmarks: []\n")
    report = rig.apply()
    (failed,) = report.failed
    assert failed.temporary and "truncated" in failed.message and "the market may hold more" in failed.message, \
        failed.message
    assert "no offer fits" not in failed.message


# --- creates that commit after the client gave up ------------------------------------------------------------------


def test_a_create_that_commits_after_the_client_gave_up_leaves_one_instance_per_slot(
        fake: VastFake, tmp_path: Path) -> None:
    rig = Rig(tmp_path, fake, spec_text(3))
    fake.late_commit_next(2, commit_after_s=40.0, hold_s=0.6)
    assert rig.apply().converged, rig.lines
    for outputs in load_slot_state(rig.state).values():
        assert fake.instances_with_label(outputs.label or "") == [int(outputs.contract_id)]
    assert len(fake.visible_instances()) == 3 and len(fake.requests_to("PUT", "/api/v0/asks/")) == 3


def test_a_commit_later_than_the_window_is_destroyed_as_a_duplicate_and_recorded(
        fake: VastFake, tmp_path: Path) -> None:
    rig = Rig(tmp_path, fake, spec_text(1))
    bare, _seed = make_origin(tmp_path, {"README.md": "fleet\n"})
    store = GitStore.clone(str(bare), tmp_path / "bot")
    recorder = git_orphan_recorder(store, "test", echo=lambda _line: None)
    fake.late_commit_next(1, commit_after_s=600.0, hold_s=0.6)
    assert rig.apply(recorder=recorder).converged  # gave up after 120 s; the offer was taken: the next one
    [(slot, contract)] = rig.slots().items()
    fake.clock.advance(600.0)  # the first rental commits now: two instances carry the slot's label
    label = load_slot_state(rig.state)[slot].label or ""
    assert len(fake.instances_with_label(label)) == 2
    report = rig.apply(recorder=recorder)
    assert [o.kind for o in report.destroyed] == ["duplicate"]
    assert fake.instances_with_label(label) == [int(contract)]  # the slot's own instance is kept
    evidence = origin_file(bare, f"fleet-spec/marketplace/destroyed/{report.destroyed[0].contract_id}.yaml")
    assert evidence is not None and "kind: \"duplicate\"" in evidence and f"slot {slot} already has" in evidence
    store.close()


# --- every status -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["loading", "scheduling", "running", "rebooting", "unknown", "frozen", "stopped",
                                    "exited", "offline"])
def test_every_status_is_acted_on_after_its_deadline_as_a_marketplace_fault(
        fake: VastFake, tmp_path: Path, status: str) -> None:
    rig = Rig(tmp_path, fake, spec_text(1))
    assert rig.apply().converged
    [(slot, contract)] = rig.slots().items()
    vast_status = None if status == "loading" else status
    fake.set_status(contract, vast_status)
    rule = STATUS_RULES[status]
    if rule.deadline_s:
        rig.apply()  # observes the new status: its clock starts
    if rule.deadline_s is None:
        fake.clock.advance(24 * 3600)
        report = rig.apply()
        assert report.converged and rig.slots() == {slot: contract}
        return
    if rule.deadline_s > 0:
        fake.clock.advance(rule.deadline_s - 60)
        assert rig.apply().converged and rig.slots() == {slot: contract}, rig.lines  # not yet
        fake.clock.advance(61)
    report = rig.apply()
    [replaced] = report.results
    assert replaced.ok and replaced.action.kind == "replace"
    assert replaced.action.reason == (REASON_INSTANCE_DEAD if rule.deadline_s == 0 else REASON_INSTANCE_STUCK)
    assert "marketplace condition, the machine is not blamed" in replaced.action.detail
    assert rig.slots()[slot] != contract and fake.requests_to("DELETE", f"/api/v0/instances/{contract}/")
    assert not list((rig.spec_dir / "machines").glob("*.yaml"))  # no machine record: not the machine's fault
    assert load_records(rig.spec_dir).bad_machine_ids() == frozenset()


# --- an orphan from a killed apply ---------------------------------------------------------------------------------

def killed_apply(rig: Rig, tmp_path: Path) -> int:
    """`fleet apply` in a real subprocess, SIGKILLed the moment vast has rented (before it can save state)."""
    env = {**os.environ, "VAST_API_KEY": KEY, "FLEET_CONTROLLER_SECRET": SECRET.decode()}
    argv = [sys.executable, "-m", "reconciler.cli", "apply", "--spec", str(rig.spec_dir / "fleet.yaml"), "--backend",
            "vastai", "--state-dir", str(rig.state.parent), "--vast-base-url", rig.fake.base_url, "--image", IMAGE.ref]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill_now() -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)  # dead before the answer is sent

    rig.fake.on_create = kill_now
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return proc.wait(timeout=5)
    finally:
        rig.fake.on_create = None
        if proc.poll() is None:
            proc.kill()


def test_an_instance_from_a_killed_apply_is_adopted_when_its_slot_is_still_wanted(
        fake: VastFake, tmp_path: Path) -> None:
    rig = Rig(tmp_path, fake, spec_text(1))
    assert killed_apply(rig, tmp_path) == -signal.SIGKILL
    [rented] = fake.visible_instances()
    assert rented["label"].startswith(PREFIX + "p4090-0-") and rig.slots() == {}  # rented, never recorded
    assert rig.apply().converged
    assert rig.slots() == {"p4090-0": str(rented["id"])} and len(fake.visible_instances()) == 1  # not rented twice


def test_an_orphan_from_a_killed_apply_is_listed_then_destroyed_after_grace_and_recorded_in_git(
        fake: VastFake, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rig = Rig(tmp_path, fake, spec_text(1, pool="old"))
    assert killed_apply(rig, tmp_path) == -signal.SIGKILL
    [orphan_row] = fake.visible_instances()
    stranger = fake.add_instance(label="someone-else/manual", dph_total=0.9)  # not ours: never touched
    unlabeled = fake.add_instance(label=None)
    bare, _seed = make_origin(tmp_path, {"README.md": "fleet\n"})
    store = GitStore.clone(str(bare), tmp_path / "bot")
    recorder = git_orphan_recorder(store, "test", echo=lambda _line: None)

    rig.set_spec(spec_text(1, pool="new"))  # the operator replaced the pool: the old slot's instance is orphaned
    report = rig.apply(recorder=recorder, orphan_grace_s=1200.0)
    assert report.converged
    [orphan] = report.orphans
    assert orphan.contract_id == str(orphan_row["id"]) and not orphan.due and not report.destroyed
    assert "slot old-0 is not in the spec" in orphan.why

    # `fleet status --state-dir` lists it with its $/h and the spend.
    assert main(["status", "--spec-dir", str(rig.spec_dir), "--state-dir", str(rig.state.parent)]) == 0
    out = capsys.readouterr().out
    assert f"{orphan_row['id']}  {orphan_row['label']}" in out and f"${orphan_row['dph_total']:.2f}/h" in out
    assert "in grace" in out and "orphans $0.30/h" in out

    fake.clock.advance(1200.0)
    report = rig.apply(recorder=recorder, orphan_grace_s=1200.0)
    assert [o.contract_id for o in report.destroyed] == [str(orphan_row["id"])] and not report.orphans
    assert {r["id"] for r in fake.visible_instances()} == {stranger, unlabeled, int(rig.slots()["new-0"])}
    [commit] = [line for line in origin_log(bare, "%s%n%b") if line.startswith("marketplace:")]
    assert "destroyed 1 orphan instance(s) of fleet test ($0.30/h)" in commit
    evidence = origin_file(bare, f"fleet-spec/marketplace/destroyed/{orphan_row['id']}.yaml")
    assert evidence is not None
    for field in (f'label: "{orphan_row["label"]}"', 'kind: "orphan"', "price_usd_per_hour: 0.3",
                  f'machine_id: "{orphan_row["machine_id"]}"', "blame: marketplace"):
        assert field in evidence, evidence
    trailers = origin_log(bare, "%(trailers:key=Fleet-Orphan,valueonly)")
    assert f"{orphan_row['id']} {orphan_row['label']}" in "\n".join(trailers)
    store.close()


def test_a_due_orphan_is_kept_without_a_git_record_to_write(fake: VastFake, tmp_path: Path) -> None:
    rig = Rig(tmp_path, fake, spec_text(1))
    fake.add_instance(label=PREFIX + "gone-0-abcdef", start_date=fake.clock() - 7200)
    report = rig.apply()
    assert [o.due for o in report.orphans] == [True] and not report.destroyed
    assert any("run `fleet apply --workdir CLONE`" in n for n in report.notes)
    assert len(fake.visible_instances()) == 2


# --- the fleet spend cap -------------------------------------------------------------------------------------------


def test_the_planner_holds_creates_that_could_pass_the_cap_and_says_so(tmp_path: Path) -> None:
    spec = spec_of(spec_text(4, extra="max_total_dph: 1.5\n"))
    from reconciler.domain.records import RecordSet

    slot_plan = plan(spec, {}, RecordSet(), DIGEST, datetime(2026, 12, 3, tzinfo=UTC))
    assert [a.kind for a in slot_plan.actions] == ["create", "create", "hold", "hold"]
    assert [a.slot for a in slot_plan.capped] == ["p4090-2", "p4090-3"] and not slot_plan.converged
    assert any("spend cap $1.50/h holds 2 slot(s)" in n for n in slot_plan.notes)


def test_apply_rents_up_to_the_cap_by_real_prices_and_the_provider_refuses_past_it(
        fake: VastFake, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rig = Rig(tmp_path, fake, spec_text(4, extra="max_total_dph: 1.5\n"))
    report = rig.apply()
    assert len(rig.slots()) == 2 and not report.converged  # 2 x $0.60 worst case fits, a third would not
    assert sum(o.price_usd_per_hour for o in load_slot_state(rig.state).values()) <= 1.5
    # The provider checks the market's real spend too (Pulumi creates with no planner in between): an
    # instance of this fleet outside the state (an orphan) counts against the cap.
    fake.add_instance(label=PREFIX + "x-0-abcdef", dph_total=0.95)
    inputs = slot_inputs(rig.spec, rig.spec.pools[0], "p4090-2", load_records(rig.spec_dir), image=IMAGE.ref,
                         image_digest=DIGEST)
    with pytest.raises(SpendCapError, match=r"fleet spend cap \$1.50/h: 3 instance\(s\) of this fleet cost"):
        rig.provider.create(inputs)
    # `fleet plan` says it in the PR check, without credentials.
    assert main(["plan", "--spec", str(rig.spec_dir / "fleet.yaml")]) == 0
    assert "fleet spend cap $1.50/h: the pools may cost up to $2.40/h" in capsys.readouterr().out
    assert main(["plan", "--spec", str(rig.spec_dir / "fleet.yaml"), "--format", "markdown"]) == 0  # the PR comment
    assert "fleet spend cap $1.50/h" in capsys.readouterr().out
    assert main(["plan", "--spec", str(rig.spec_dir / "fleet.yaml"), "--state-dir", str(rig.state.parent)]) == 0
    out = capsys.readouterr().out
    assert "hold    p4090-2" in out and "spend-cap" in out
    assert main(["status", "--spec-dir", str(rig.spec_dir), "--state-dir", str(rig.state.parent)]) == 0
    assert "of the fleet spend cap $1.50/h" in capsys.readouterr().out
