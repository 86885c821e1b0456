"""Secrets and hostile identifiers end to end, with a real controller on 127.0.0.1 and a real git origin.

- A worker's log lines, failed-event tail and result tail carrying a vast.ai API key, a bearer header, a
  password and a GitHub token go through controller ingest -> loop decide -> committed record: no git
  object anywhere in the origin (every commit, every blob, every message) contains any of them, while the
  evidence shows they were there (`[REDACTED]`).
- A machine id like `../../x` reported by a worker is accepted as data but never becomes a path: nothing
  is written outside the records directory and the pass says why the verdict was not recorded.
- Forged tokens (random headers, another instance's token, another secret's token, tokens replayed on
  other ids) never write anything and never produce a 5xx.
- The vast.ai API key given to VastAiMarketplace never appears in logs (DEBUG, every logger), in exception
  text, in repr, or in the slot state written by `fleet apply`, even when the API echoes it back.
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reconciler.adapters.controller.server import ControllerServer
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.marketplace.vastai import RetryPolicy, Timeouts, VastAiMarketplace
from reconciler.adapters.record_files import load_records
from reconciler.adapters.slot_provider import SlotProvider
from reconciler.adapters.spec_files import check_spec_text
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.marketplace import InstanceRequest, MarketplaceError, OfferQuery
from reconciler.domain.tokens import instance_token
from reconciler.flows.judge import run_pass
from reconciler.flows.provision import apply_fleet
from tests.controller_support import StepClock
from tests.fakes import Sleeps
from tests.fault_support import IMAGE, SECRET, VAST_SPEC, bot_clone, register_doc
from tests.gitrepos import git, make_origin
from tests.scenarios import LATER, SPEC_YAML
from tests.vast_fake import VastFake

VAST_API_KEY = "9c1e5a7b3d2f4e6a8b0c1d3e5f7a9b2c4d6e8f0a1b3c5d7e9f2a4b6c8d0e1f3a"
BEARER = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.dGhpcy1pcy1hLXNpZ25hdHVyZQ"
PASSWORD = "hunter2-Sup3r-S3cret"
GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
SECRETS = (VAST_API_KEY, BEARER, PASSWORD, GITHUB_TOKEN)
LEAKY_LINES = [
    f"+ vastai set api-key {VAST_API_KEY}",
    f"curl -H 'Authorization: Bearer {BEARER}' https://proofs.example/v28.params",
    f"aria2c --http-passwd {PASSWORD} failed; retrying with password={PASSWORD}",
    f"git clone https://x:{GITHUB_TOKEN}@github.com/example/cuzk.git",
    f"env: VAST_API_KEY={VAST_API_KEY} GITHUB_TOKEN={GITHUB_TOKEN}",
]
CUDA_TAIL = ["  [1/10] ok — 121.4s", "Error: CUDA error 999: unknown error",
             "benchmark.sh: cuzk-bench exited with status 1, 1/10 proofs"]


class Controller:
    def __init__(self, path: Path):
        self.store = SqliteStore(path, now=StepClock())
        self.server = ControllerServer(self.store, SECRET, "admin-token-for-secret-tests-0001", "127.0.0.1", 0).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=10.0)

    def post(self, instance_id: str, action: str, doc: Any, token: str | None = None) -> httpx.Response:
        token = instance_token(SECRET, instance_id) if token is None else token
        return self.client.post(f"/api/v1/instances/{instance_id}/{action}", json=doc,
                                headers={"Authorization": f"Bearer {token}"})

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.store.close()


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    c = Controller(tmp_path / "controller.db")
    yield c
    c.close()


def all_git_text(bare: Path) -> str:
    """Every object in the repository, decompressed: commits (messages, trailers), trees and blobs."""
    listing = git(bare, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    raw = subprocess.run(["git", "cat-file", "--batch"], cwd=bare, input=listing.encode(), capture_output=True,
                         check=True).stdout
    return raw.decode("utf-8", errors="replace") + git(bare, "log", "-p", "--all", "--format=%H%n%B")


def test_secrets_in_worker_logs_never_reach_git(controller: Controller, tmp_path: Path) -> None:
    bare, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    iid = "pro-0-5ec7e7"
    assert controller.post(iid, "register", register_doc(iid, "40213")).status_code == 200
    assert controller.post(iid, "logs", {"protocol": 1, "lines": LEAKY_LINES}).status_code == 200
    tail = [*LEAKY_LINES, *CUDA_TAIL]
    event = {"protocol": 1, "phase": "benchmark", "status": "failed", "at": "2026-12-02T18:27:00Z", "exit_code": 1,
             "message": f"benchmark.sh exited 1 (password={PASSWORD})", "log_tail": tail,
             "details": {"url": f"https://u:{PASSWORD}@mirror.example/params", "key": VAST_API_KEY}}
    assert controller.post(iid, "events", event).status_code == 200
    result = {"protocol": 1, "outcome": "error", "at": "2026-12-02T18:27:05Z", "exit_code": 1, "requested": 10,
              "completed": 1, "failed": 0, "image_digest": "sha256:" + "a1" * 32, "log_tail": tail}
    assert controller.post(iid, "result", result).status_code == 200

    bot = GitFleetTree(GitStore(bot_clone(bare, tmp_path / "bot"), sleep=Sleeps()))
    outcome = run_pass(bot, controller.store, LATER)
    assert outcome.ok and outcome.pushed and [v.instance_id for v in outcome.verdicts] == [iid]
    everything = all_git_text(bare)
    assert "fleet-spec/machines/40213.yaml" in git(bare, "ls-tree", "-r", "--name-only", "main")
    assert "[REDACTED]" in everything  # the leaky lines were there, masked
    for secret in SECRETS:
        assert secret not in everything
    # The controller's own API serves the same redacted lines.
    logs = controller.client.get(f"/api/instance-logs/{iid}",
                                 headers={"Authorization": "Bearer admin-token-for-secret-tests-0001"}).json()
    assert logs["lines"] and not any(secret in line for line in logs["lines"] for secret in SECRETS)


@pytest.mark.parametrize("machine_id", ["../../etc/cron.d/x", "../machines", "a/b", ".git", "..", "-rf", " 1",
                                        "a\x00b"])
def test_machine_id_with_path_tricks_never_becomes_a_path(controller: Controller, tmp_path: Path,
                                                            machine_id: str) -> None:
    bare, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    iid = "pro-0-d07d07"
    # The API refuses such an id at the edge (full match), naming the field...
    refused = controller.post(iid, "register", register_doc(iid, machine_id))
    assert refused.status_code == 400 and any(p["path"] == "$.machine_id" for p in refused.json()["detail"])
    # ...and a row that got into the store some other way (an older controller) never becomes a path either.
    assert controller.post(iid, "register", register_doc(iid, "40213")).status_code == 200
    with sqlite3.connect(controller.store.path) as conn:
        conn.execute("UPDATE instances SET machine_id = ? WHERE instance_id = ?", (machine_id, iid))
    conn.close()
    assert controller.post(iid, "events", {"protocol": 1, "phase": "benchmark", "status": "failed",
                                           "at": "2026-12-02T18:27:00Z", "exit_code": 1,
                                           "log_tail": CUDA_TAIL}).status_code == 200
    bot = bot_clone(bare, tmp_path / "bot")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if ".git" not in p.parts)
    outcome = run_pass(GitFleetTree(GitStore(bot, sleep=Sleeps())), controller.store, LATER)
    assert outcome.ok and outcome.commit is None
    assert any("missing or unsafe" in note for note in outcome.notes), outcome.notes
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if ".git" not in p.parts)
    assert after == before  # not a single new file anywhere
    assert git(bare, "rev-list", "--count", "main").strip() == "1"


# --- forged and replayed tokens -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    c = Controller(tmp_path_factory.mktemp("tokens") / "c.db")
    for iid in ("victim-0-aaaaaa", "attacker-0-bbbbbb"):
        assert c.post(iid, "register", register_doc(iid, "123")).status_code == 200
    yield c
    c.close()


instance_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,40}", fullmatch=True)
EVENT = {"protocol": 1, "phase": "params", "status": "started", "at": "2026-12-02T18:00:00Z"}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.one_of(
    st.text(max_size=120).filter(lambda t: "\n" not in t and "\r" not in t),
    st.builds(lambda t: f"Bearer {t}", st.from_regex(r"[0-9a-fA-F]{60,68}", fullmatch=True)),
    st.builds(lambda i: f"Bearer {instance_token(SECRET, i)}", instance_ids),  # a real token, for some other id
    st.builds(lambda s, i: f"Bearer {instance_token(s, i)}", st.binary(min_size=16, max_size=40), instance_ids),
))
@example(header="\x1f")  # found in CI-like runs: a control character is a malformed header (400), not a token
def test_forged_tokens_never_write(shared: Controller, header: str) -> None:
    if header == f"Bearer {instance_token(SECRET, 'victim-0-aaaaaa')}":
        return  # hypothesis found the real secret: impossible in practice, and not a forgery
    before = shared.store.stats()
    try:
        r = shared.client.post("/api/v1/instances/victim-0-aaaaaa/events", json=EVENT,
                               headers={"Authorization": header})
    except (httpx.LocalProtocolError, UnicodeEncodeError):
        return  # the client refuses to send such a header at all
    if any((ord(c) < 0x20 and c != "\t") or c == "\x7f" for c in header):
        # Not a field value at all (RFC 9110 5.5: controls other than HTAB are not allowed): the HTTP parser
        # refuses the request before anyone reads the token.
        assert r.status_code == 400, r.text
    else:
        assert r.status_code in (401, 403), r.text
    assert shared.store.stats() == before


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=instance_ids)
def test_a_captured_token_replayed_on_another_instance_is_refused(shared: Controller, target: str) -> None:
    if target == "attacker-0-bbbbbb":
        return
    before = shared.store.stats()
    r = shared.post(target, "events", EVENT, token=instance_token(SECRET, "attacker-0-bbbbbb"))
    assert r.status_code == 403 and shared.store.stats() == before


# --- the vast.ai API key stays out of logs, errors and state --------------------------------------------


def test_vast_api_key_never_appears_in_logs_errors_or_slot_state(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, including httpx/httpcore
    spec, _ = check_spec_text(VAST_SPEC, "fleet.yaml")
    assert spec is not None
    texts: list[str] = []
    with VastFake(api_key=VAST_API_KEY) as fake:
        market = VastAiMarketplace(VAST_API_KEY, base_url=fake.base_url, clock=fake.clock, sleep=fake.clock.sleep,
                                   jitter=lambda: 0.5,
                                   retry=RetryPolicy(max_attempts=2), timeouts=Timeouts(read_s=0.3))
        texts += [repr(market), str(vars(market))]
        fake.fail_next(1, status=502, method="POST")
        fake.garbage_next(1, method="POST")
        with pytest.raises(MarketplaceError) as err:
            market.search_offers(OfferQuery(gpu_name="RTX 4090"))
        texts.append(str(err.value))
        provider = SlotProvider(market, SECRET)
        fake.slow_next(1, delay_s=1.0, method="GET", path_prefix="/api/v1/instances/")
        report = apply_fleet(spec, load_records(tmp_path), provider, tmp_path / "state" / "slots.json", IMAGE,
                             LATER, echo=texts.append)
        assert report.converged
        # The API answers 401 and echoes the key back in its message.
        fake.fail_next(9, status=401, body={"success": False, "msg": f"bad api key {VAST_API_KEY}"})
        for call in (lambda: market.list_instances(),
                     lambda: market.create_instance("9001", InstanceRequest("img@sha256:" + "0" * 64, 10, "l-1")),
                     lambda: market.destroy_instance("7100001")):
            with pytest.raises(MarketplaceError) as err:
                call()
            texts.append(str(err.value))
        fake.fail_next(1, status=400, body={"success": False, "msg": f"invalid key={VAST_API_KEY}"}, method="DELETE")
        with pytest.raises(MarketplaceError) as err:
            market.destroy_instance("7100001")
        texts.append(str(err.value))
        market.close()
        # Every request did carry the key, in the Authorization header only.
        assert all(r.headers.get("authorization") == f"Bearer {VAST_API_KEY}" for r in fake.requests)
        assert not any(VAST_API_KEY in str(r.body) for r in fake.requests)
    state_files = [p.read_text(errors="replace") for p in (tmp_path / "state").rglob("*") if p.is_file()]
    assert state_files and caplog.text
    for text in [*texts, *state_files, caplog.text]:
        assert VAST_API_KEY not in text
