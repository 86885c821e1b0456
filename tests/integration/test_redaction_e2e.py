"""Redaction end to end (issue 14 item 2): hypothesis generates secrets of every kind (URL credentials,
signed URL parameters of GCS, S3 and Azure, Authorization headers, `curl -u`, Slack, Hugging Face, Stripe,
GitHub and AWS token shapes, the configured vast.ai key and registry password) and puts them into every
field a worker sends that can reach git: register free text, log lines, event message, tail and details,
result tail. They go through the real HTTP controller, the real SQLite store, a real reconcile pass and a
real git origin; none survives in any commit message, tree or blob, nor in the API's answers."""

from __future__ import annotations

import random
import string
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from itertools import count
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.adapters.controller.server import ControllerServer
from reconciler.adapters.fleet_tree import GitFleetTree
from reconciler.adapters.git import GitStore
from reconciler.adapters.settings import known_secret_values
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.redact import MASK, Redactor
from reconciler.domain.tokens import instance_token
from reconciler.flows.judge import run_pass
from tests.controller_support import ADMIN, ADMIN_AUTH, SECRET, StepClock
from tests.fakes import Sleeps
from tests.gitrepos import git, make_origin
from tests.scenarios import SPEC_YAML, T0

VAST_KEY = "9c2e4a6b8d0f1e3c5a7b9d2f4e6a8c0b1d3f5e7a9c2b4d6f8e0a1c3e5b7d9f2a"
REGISTRY_PASSWORD = "Reg!stry-P4ss-7f3a9"

ALNUM = string.ascii_letters + string.digits
UPPER = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"


def word(alphabet: str, size: int) -> st.SearchStrategy[str]:
    # Secrets start with a fixed marker so a shrunk example can never be a word that is legitimately in git.
    return st.text(alphabet=alphabet, min_size=size, max_size=size + 8).map(lambda s: "Q7" + s)


def kinds() -> st.SearchStrategy[tuple[str, list[str]]]:
    """(text holding secrets, the secret parts that must not survive), one strategy per kind."""
    user = st.sampled_from(["fleet", "bob", "ci"])
    return st.one_of(
        st.builds(lambda u, p: (f"fetching https://{u}:{p}@params.example.org/v28.params", [p]), user, word(ALNUM, 10)),
        st.builds(lambda c, s: ("GET https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256"
                                f"&X-Goog-Credential={c}%2F20261202%2Fauto&X-Goog-Date=20261202T000000Z"
                                f"&X-Goog-Signature={s}&X-Goog-SignedHeaders=host", [c, s]),
                  word(ALNUM, 12), word(HEX, 64)),
        st.builds(lambda k, s: (f"https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={k}"
                                f"%2F20261202%2Fus-east-1%2Fs3&X-Amz-Signature={s} 403 Forbidden", [k, s]),
                  word(UPPER, 16), word(HEX, 60)),
        st.builds(lambda s: (f"https://acct.blob.core.windows.net/c/b?sv=2021-08-06&se=2026-12-03&sp=r&sig={s}%3D",
                             [s]), word(ALNUM, 30)),
        st.builds(lambda t: (f"curl -H 'Authorization: Bearer {t}' https://api.example.org", [t]), word(ALNUM, 20)),
        st.builds(lambda u, p: (f"+ curl -fsS -u {u}:{p} https://mirror.example.org/manifest.txt", [p]),
                  user, word(ALNUM, 10)),
        st.builds(lambda a, b: (f"notify xoxb-{a}-{b} ok", [f"xoxb-{a}-{b}"]),
                  st.text(string.digits, min_size=10, max_size=12), word(ALNUM, 24)),
        st.builds(lambda t: (f"HF_HUB hf_{t} loaded", [f"hf_{t}"]), word(ALNUM, 34)),
        st.builds(lambda t: (f"charge with sk_live_{t}", [f"sk_live_{t}"]), word(ALNUM, 24)),
        st.builds(lambda t: (f"git clone https://ghp_{t}@github.com/acme/fleet", [f"ghp_{t}"]), word(ALNUM, 36)),
        st.builds(lambda a, b: (f"GITHUB_PAT=github_pat_{a}_{b}", [f"github_pat_{a}_{b}"]),
                  word(ALNUM, 22), word(ALNUM, 59)),
        st.builds(lambda k: (f"aws configure set aws_access_key_id AKIA{k[2:18]}", [f"AKIA{k[2:18]}"]),
                  word(UPPER, 16)),
        st.just((f"vastai set api-key {VAST_KEY}", [VAST_KEY])),
        st.just((f"docker login ghcr.io --password-stdin <<< {REGISTRY_PASSWORD}", [REGISTRY_PASSWORD])),
    )


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControllerServer, SqliteStore]]:
    db = tmp_path_factory.mktemp("redaction") / "c.db"
    configured = {"VAST_API_KEY": VAST_KEY, "FLEET_REGISTRY_PASSWORD": REGISTRY_PASSWORD}
    store = SqliteStore(db, now=StepClock(), redactor=Redactor.with_secrets(known_secret_values(configured)))
    server = ControllerServer(store, SECRET, ADMIN).start()
    yield server, store
    server.stop()
    store.close()


def all_git_text(repo: Path) -> str:
    """Every commit message, author and file content ever committed (all refs)."""
    return subprocess.run(["git", "-C", str(repo), "log", "--all", "-p", "--binary", "--format=%H%n%an%n%B"],
                          capture_output=True, text=True, check=True).stdout


numbers = count()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(secrets=st.lists(kinds(), min_size=14, max_size=14), seed=st.integers(0, 2**16))
def test_no_secret_of_any_kind_survives_into_git_or_the_api(
        controller: tuple[ControllerServer, SqliteStore], tmp_path_factory: pytest.TempPathFactory,
        secrets: list[tuple[str, list[str]]], seed: int) -> None:
    server, store = controller
    n = next(numbers)
    iid, machine = f"rtx4090-0-red{n:03d}", f"7{n:04d}"
    rng = random.Random(seed)
    texts = [text for text, _ in secrets]
    hidden = [part for _, parts in secrets for part in parts]

    def pick() -> str:
        return rng.choice(texts)

    tail = [f"fleet-worker: step {i}: {pick()}" for i in range(6)]
    tail += [f"Error: failed to fetch params: {pick()}: connection refused (os error 111)",
             f"benchmark.sh: cuzk-bench exited with status 1, 0/10 proofs ({pick()})"]
    register = {"protocol": 1, "instance_id": iid, "at": "2026-12-02T18:00:00Z", "pool": "rtx4090",
                "slot": "rtx4090-0", "machine_id": machine, "host_id": "77", "contract_id": "9001",
                "gpu_name": f"RTX 4090 {pick()}"[:128], "image_version": pick()[:128], "hostname": pick()[:255],
                "gpus": [f"NVIDIA GeForce RTX 4090, {pick()}"[:512]]}
    event = {"protocol": 1, "phase": "benchmark", "status": "failed", "at": "2026-12-02T18:27:00Z", "exit_code": 1,
             "message": pick()[:500], "log_tail": tail,
             "details": {"url": pick(), "nested": {"cmd": pick(), "args": [pick(), pick()]}}}
    result = {"protocol": 1, "outcome": "error", "at": "2026-12-02T18:27:05Z", "exit_code": 1, "requested": 10,
              "completed": 0, "failed": 0, "log_tail": tail}
    headers = {"Authorization": f"Bearer {instance_token(SECRET, iid)}"}
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for action, doc in (("register", register), ("logs", {"protocol": 1, "lines": [*texts, *tail]}),
                            ("events", event), ("result", result)):
            r = client.post(f"/api/v1/instances/{iid}/{action}", json=doc, headers=headers)
            assert r.status_code == 200, (action, r.text)
        answers = [client.get(path, headers=ADMIN_AUTH).text for path in
                   (f"/api/instances/{iid}", "/api/instances", f"/api/instance-logs/{iid}?tail=500")]

    tmp = tmp_path_factory.mktemp("origin")
    bare, _ = make_origin(tmp, {"fleet-spec/fleet.yaml": SPEC_YAML})
    git(tmp, "clone", "--quiet", str(bare), str(tmp / "bot"))
    outcome = run_pass(GitFleetTree(GitStore(tmp / "bot", sleep=Sleeps())), store, T0 + timedelta(hours=4))
    assert outcome.ok and outcome.pushed, outcome.headline()
    committed = all_git_text(bare)
    assert f"fleet-spec/machines/{machine}.yaml" in committed and MASK in committed
    for secret in hidden:
        assert secret not in committed, secret
        for answer in answers:
            assert secret not in answer, secret
