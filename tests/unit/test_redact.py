"""Redaction: every pattern masks a realistic secret-bearing line; prover output and digests survive."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.domain.redact import (
    MASK,
    MAX_KEY_LINES,
    PATTERNS,
    Redactor,
    escape_controls,
    redact_line,
    redact_lines,
)

VAST_KEY = "3f1c9a0e7b2d4c6a8e0f1b3d5c7a9e2f4b6d8c0a1e3f5b7d9c2a4e6f8b0d1c3a"
IMAGE_DIGEST = "sha256:9b2c8a1f0e7d6c5b4a3928171605f4e3d2c1b0a99887766554433221100ffeed"
BLAKE2B = ("8f2a61c0b0d54e21a9c7f3e4d5b6a7980123456789abcdef0fedcba9876543210"
           "aa11bb22cc33dd44ee55ff6677889900aabbccddeeff00112233445566778899")

# (pattern name, line as a worker would print it, secret that must disappear, text that must stay)
CASES = [
    ("private-key", '{"key": "-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAA\\n-----END OPENSSH '
                    'PRIVATE KEY-----"}', "b3BlbnNzaC1rZXktdjEAAAAA", '{"key": "'),
    ("authorization-header", "> Authorization: Bearer abc.def-ghi_123", "abc.def-ghi_123", "> Authorization:"),
    ("authorization-header", "Authorization: Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy", "Authorization:"),
    ("bearer", "curl -H 'X-Auth: Bearer tok_9f8e7d6c5b' http://127.0.0.1:8080/api", "tok_9f8e7d6c5b",
     "http://127.0.0.1:8080/api"),
    ("url-userinfo", "fetching https://fleet:s3cr3tP4ss@params.example.org/v28.params", "s3cr3tP4ss",
     "https://fleet:[REDACTED]@params.example.org/v28.params"),
    ("key-value", "docker login --username fleet password=hunter2 registry.local", "hunter2",
     "registry.local"),
    ("key-value", "export FLEET_TOKEN=0123abcd4567 FLEET_POOL=rtx4090", "0123abcd4567", "FLEET_POOL=rtx4090"),
    ("key-value", 'config: {"api_key": "sk-live-998877", "pool": "rtx4090"}', "sk-live-998877", '"pool": "rtx4090"'),
    ("key-value", "passwd: 'correct horse battery'", "correct horse battery", "passwd:"),
    ("key-value", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI", "AWS_SECRET"),
    ("key-value", "GET /api?apikey=abc123&limit=5", "abc123", "&limit=5"),
    ("key-value", "X-Api-Key: q1w2e3r4t5", "q1w2e3r4t5", "X-Api-Key:"),
    ("cli-flag", "aria2c --http-passwd s3cret -x16 https://mirror/a.params", "s3cret", "-x16"),
    ("aws-access-key-id", "using credentials AKIAIOSFODNN7EXAMPLE for s3", "AKIAIOSFODNN7EXAMPLE", "for s3"),
    ("github-token", "git clone https://ghp_abcdefghijklmnopqrstuvwxyz0123456789@github.com/x/y",
     "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "github.com/x/y"),
    ("jwt", "cookie eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
     "eyJzdWIiOiIxMjM0NTY3ODkwIn0", "cookie "),
    ("hex-64-key", f"vastai set api-key {VAST_KEY}", VAST_KEY, "vastai set api-key"),
    ("hex-64-key", f"key loaded: {VAST_KEY}", VAST_KEY, "key loaded:"),
    ("pem-body", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj", "MIIEvQIBADANBgkq", ""),
    ("curl-user", "+ curl -fsS -u fleet:s3cr3tP4ss https://mirror.example.org/manifest.txt", "s3cr3tP4ss",
     "-u fleet:"),
    ("login-password", "image_login -u bob -p Gh0stPassw0rd ghcr.io", "Gh0stPassw0rd", "ghcr.io"),
    ("signed-url-param", "GET https://storage.googleapis.com/b/o?X-Goog-Credential=svc%2F2026&X-Goog-Signature=9f8e7d6c"
     "&X-Goog-Date=20261202T000000Z", "9f8e7d6c", "X-Goog-Date=20261202T000000Z"),
    ("signed-url-param", "https://b.s3.amazonaws.com/k?X-Amz-Signature=deadbeef99&X-Amz-Expires=300", "deadbeef99",
     "X-Amz-Expires=300"),
    ("signed-url-param", "https://acct.blob.core.windows.net/c/b?sv=2021-08-06&sig=AbC%2Bdef%3D", "AbC%2Bdef",
     "sv=2021-08-06"),
    ("slack-token", "posting with xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOp",
     "posting with"),
    ("huggingface-token", "HF token hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567 set", "hf_AbCdEfGh", " set"),
    ("stripe-key", "charge sk_live_51HxYzAbCdEfGhIjKlMn failed", "sk_live_51HxYz", " failed"),
    # The forms of issue 30: CLI arguments that carry secrets, URL passwords with any character, key shapes.
    ("config-set", "+ aws configure set aws_secret_access_key wJalrXUtnFEMIK7MDENGbPxRfiCY --profile fleet",
     "wJalrXUtnFEMIK7MDENGbPxRfiCY", "aws configure set aws_secret_access_key [REDACTED] --profile fleet"),
    ("config-set", "npm config set //registry.npmjs.org/:_authToken npm_Q7aBcDeF0123", "npm_Q7aBcDeF0123",
     "//registry.npmjs.org/:_authToken"),
    ("sshpass", "sshpass -p 'Tr0ub4dor&3' ssh root@10.0.0.5 nvidia-smi", "Tr0ub4dor", "ssh root@10.0.0.5 nvidia-smi"),
    ("sshpass", "sshpass -v -pHunter2Hunter2 scp a b:", "Hunter2Hunter2", "sshpass -v -p"),
    ("mysql-password", "mysql -h db.internal -u root -pS3cr3tPw0rd fleet -e 'select 1'", "S3cr3tPw0rd",
     "fleet -e 'select 1'"),
    ("mysql-password", "mysqldump -uroot -p0penSesame fleet > dump.sql", "0penSesame", "fleet > dump.sql"),
    ("url-userinfo", "connecting to postgresql://fleet:p@ss/w:rd%40x@db.example.org:5432/fleetdb",
     "p@ss/w:rd", "postgresql://fleet:[REDACTED]@db.example.org:5432/fleetdb"),
    ("url-userinfo", "mirror https://ci:a/b@c@params.example.org/v28.params", "a/b@c",
     "https://ci:[REDACTED]@params.example.org/v28.params"),
    ("gitlab-token", "using glpat-Q7bCdEfGhIjKlMnOpQrSt for the mirror", "glpat-Q7bCdEfGhIjKlMnOpQrSt",
     "for the mirror"),
    ("gitlab-token", "runner GR1348941Q7bCdEfGhIjKlMnOpQrSt registered", "GR1348941Q7bC", "registered"),
    ("openai-style-key", "OPENAI sk-proj-Q7bCdEfGhIjKlMnOpQrStUvWxYz0123 loaded", "sk-proj-Q7bCdEfGh", " loaded"),
    ("openai-style-key", "claude sk-ant-api03-Q7bCdEfGhIjKlMnOpQrStUvWx ok", "sk-ant-api03-Q7bC", " ok"),
    ("google-key", "maps AIzaSyQ7bCdEfGhIjKlMnOpQrStUvWxYz012345 ok", "AIzaSyQ7bCdEfGh", " ok"),
    ("google-key", "oauth GOCSPX-Q7bCdEfGhIjKlMnOpQrStUvWxYz ok", "GOCSPX-Q7bCdEfGh", " ok"),
    ("google-key", "token ya29.Q7bCdEfGhIjKlMnOpQrStUvWxYz ok", "ya29.Q7bCdEfGh", " ok"),
]


@pytest.mark.parametrize(("name", "line", "secret", "kept"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_pattern_masks_its_secret(name: str, line: str, secret: str, kept: str) -> None:
    out = redact_line(line)
    assert secret not in out
    assert MASK in out
    assert kept in out


def test_the_google_api_key_case_has_the_real_length() -> None:
    assert re.search(r"AIza\S{35}\b", "AIzaSyQ7bCdEfGhIjKlMnOpQrStUvWxYz012345 ")


def test_every_pattern_has_a_case() -> None:
    assert {p.name for p in PATTERNS} == {c[0] for c in CASES}


@pytest.mark.parametrize("line", [
    "[#26a862 38GiB/56GiB(67%) CN:16 DL:408MiB ETA:46s]",
    f"pulling image ghcr.io/fleet/worker@{IMAGE_DIGEST}",
    f"Digest: {IMAGE_DIGEST}",
    f"image_digest={IMAGE_DIGEST}",
    "/var/tmp/filecoin-proof-parameters/v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-"
    "sha256_hasher-82a357d2f2ca81dc61bb45f4a762807aedee1b0a53fd6c4e77b46a01bfef7820.params: No such file",
    f"{BLAKE2B}  v28-proof-of-spacetime-fallback.vk",
    f"blake2b {BLAKE2B}",
    BLAKE2B,
    "  [3/10] ok — 38.2s",
    "throughput:    1.571 proofs/min (38.2s/proof)",
    "=== Batch Summary ===",
    "completed: 10   failed: 0   passed: 10",
    "CUDA error: an illegal memory access was encountered (Xid 79)",
    "Traceback (most recent call last):",
    "cuzk-daemon listening on 0.0.0.0:9820 (param_cache=/var/tmp/filecoin-proof-parameters)",
    "commit 4b825dc642cb6eb9a060e54bf8d69288fbee4904",
])
def test_prover_output_and_digests_are_not_mangled(line: str) -> None:
    assert redact_line(line) == line


def test_multi_line_private_key_block_is_masked_whole() -> None:
    lines = ["writing key", "-----BEGIN RSA PRIVATE KEY-----", "MIIEpAIBAAKCAQEA7", "abc+/def==",
             "-----END RSA PRIVATE KEY----- done", "next line password=x"]
    out = redact_lines(lines)
    assert out[0] == "writing key"
    assert out[2] == MASK and out[3] == MASK
    assert "MIIEpAIBAAKCAQEA7" not in "\n".join(out)
    assert out[4].endswith(" done")
    assert out[5] == f"next line password={MASK}"


@given(st.lists(st.text(max_size=200), max_size=5))
def test_redaction_is_idempotent(lines: list[str]) -> None:
    once = redact_lines(lines)
    assert len(once) == len(lines)
    assert redact_lines(once) == once


@given(st.from_regex(r"[0-9a-f]{64}", fullmatch=True), st.sampled_from(["", "key ", "X ", "'", "\t"]))
def test_a_bare_64_hex_word_is_always_masked(key: str, prefix: str) -> None:
    assert key not in redact_line(f"{prefix}{key} tail")


def _reference(text: str) -> str:
    text = escape_controls(text)
    for pattern in PATTERNS:
        text = pattern.regex.sub(pattern.replacement, text)
    return text


FRAGMENTS = ["Authorization: ", "Bearer ", "bearer abcd1234", "https://", "u:p@", "password", "=", ": ", "--token ",
             "API_KEY", "secret", "\"", "'", "AKIAIOSFODNN7EXAMPLE", "eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl",
             VAST_KEY, "sha256:", "-----BEGIN RSA PRIVATE KEY-----", "[REDACTED]", " ", "x", "ghp_" + "a" * 36,
             # the prefilter of the patterns that run on a trigger word or only on a long [A-Za-z0-9+/] run
             "ASIA", "akia", "EYJ", "eyJ", "ghs_", "github_pat_" + "B" * 40, "PRIVATE KEY-----", "A" * 30,
             "Zm9v" * 8, "0123456789abcdef" * 2, "+/", "\n", "-u ", "-p ", "?sig=", "xoxb-"]


@given(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=12).map("".join))
def test_trigger_prefilter_never_changes_the_result(line: str) -> None:
    assert redact_line(line) == _reference(line)


def test_known_secrets_are_masked_by_value_whatever_their_shape() -> None:
    redactor = Redactor.with_secrets(["Reg!stry-P4ss-7f3a9", "short", None])
    assert redactor.line("docker login -p Reg!stry-P4ss-7f3a9 ok") == "docker login -p [REDACTED] ok"
    assert redactor.line("a short line") == "a short line"  # too short to mask by value
    assert redactor.value({"k": ["x Reg!stry-P4ss-7f3a9"]}) == {"k": ["x [REDACTED]"]}


@pytest.mark.parametrize("line", ["mkdir -p /var/tmp/params", "tar -u -f x.tar", "sort -u names.txt",
                                  "mysql -P 3306 -u root fleet", "mysql -p fleet", "aws configure set region us-east-1",
                                  "task-0123456789abcdefghijklmn started", "disk-sk-usage", "sshpass -f /run/pw ssh h",
                                  "https://mirror.example.org:8443/v28.params", "ssh://git@github.com/acme/fleet",
                                  "https://acct.blob.core.windows.net/c/b?sv=2021-08-06&se=2026-12-03T00:00Z"])
def test_new_patterns_leave_ordinary_commands_alone(line: str) -> None:
    assert redact_line(line) == line


def test_a_private_key_split_across_batches_is_masked_whole() -> None:
    """The stream state carries an open key block from one batch of an instance's log to the next."""
    redactor = Redactor()
    first, state = redactor.stream(["ok", "-----BEGIN RSA PRIVATE KEY-----", "MIIEpAIBAAKCAQEA7xyz"])
    assert first == ["ok", "-----BEGIN PRIVATE KEY----- [REDACTED]", MASK] and state == 2
    second, state = redactor.stream(["Zm9vYmFy==", "-----END RSA PRIVATE KEY-----", "done token=abc"], state)
    assert second == [MASK, "-----END PRIVATE KEY-----", f"done token={MASK}"] and state == 0
    # Without the state the short last line would have been kept: the state is what masks it.
    assert redactor.stream(["Zm9vYmFy==", "-----END RSA PRIVATE KEY-----"])[0][0] == "Zm9vYmFy=="


def test_a_key_block_without_end_hides_at_most_max_key_lines() -> None:
    lines = ["-----BEGIN PRIVATE KEY-----"] + [f"line {i}" for i in range(MAX_KEY_LINES + 10)]
    out, state = Redactor().stream(lines)
    assert out.count(MASK) == MAX_KEY_LINES and out[-1] == f"line {MAX_KEY_LINES + 9}" and state == 0
    # ... also when the block spans batches.
    out, state = Redactor().stream([f"more {i}" for i in range(20)], MAX_KEY_LINES - 5)
    assert out.count(MASK) == 6 and state == 0


@pytest.mark.parametrize(("raw", "shown"), [
    ("copy \x1b]52;c;aGVsbG8=\x1b\\ done", "copy \\x1b]52;c;aGVsbG8=\\x1b\\ done"),  # OSC 52, ST-terminated
    ("\x1b]0;pwned\x07title", "\\x1b]0;pwned\\x07title"),  # OSC title, BEL-terminated
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    ("csi \x9b31m c1", "csi \\x9b31m c1"),
    ("evil \u202egnp.exe", "evil \\u202egnp.exe"),
    ("isolate \u2066x\u2069", "isolate \\u2066x\\u2069"),
    ("progress 10%\r20%", "progress 10%\\x0d20%"),
    ("one\nFleet-Verdict: ok", "one\\x0aFleet-Verdict: ok"),
    ("sep\u2028Fleet-Machine: 1", "sep\\u2028Fleet-Machine: 1"),
    ("nul\x00 del\x7f", "nul\\x00 del\\x7f"),
    ("tab\tkept \u00e9t\u00e9 \u4e2d", "tab\tkept \u00e9t\u00e9 \u4e2d"),
])
def test_control_characters_become_visible_text(raw: str, shown: str) -> None:
    assert escape_controls(raw) == shown
    assert redact_line(raw) == shown
    assert len(redact_line(raw).splitlines()) == 1
    assert escape_controls(shown) == shown


@given(st.text(max_size=300))
def test_no_control_character_survives(text: str) -> None:
    out = redact_line(text)
    assert not re.search("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]", out)
    assert len(out.splitlines()) <= 1
