"""The code tables are whole and every entry decides what it says (issue 29 item 3).

- whole: every code of the source enum is in its table (aria2's error_code.h 0-32, curl.h's CURLcode 0-101, every
  Linux errno 1-133 but the two unassigned numbers, every signal 1-31, bash's 126/127, the worker's own codes);
- consistent: each entry names a signature that exists and carries the entry's blame (and strength);
- decoded: each code, in the form its tool prints it (aria2c's `errorCode=N`, the worker's `(exit code N)`,
  `curl: (N) <text>`, Rust's `<text> (os error N)`, Python's `[Errno N]`, a job killed by a signal), is judged by
  its entry's signature, and `code_meaning` names it;
- shared: `worker-image/lib/exit-codes.sh` is generated from `exit_statuses.WORKER_EXITS`, every FLEET_EXIT_* the
  scripts use is in the table, and every message the scripts fail with is judged by its code's signature.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reconciler.domain.aria2_codes import ARIA2, ARIA2_CODES
from reconciler.domain.codes import Code
from reconciler.domain.curl_codes import CURL, CURL_CODES
from reconciler.domain.errnos import ERRNO, ERRNO_CODES
from reconciler.domain.exit_statuses import (
    BASH_CODES,
    SIGNAL,
    SIGNALS,
    WORKER_EXITS,
    render_worker_exit_codes,
    signal_of_exit,
)
from reconciler.domain.signatures import GENERIC, SIGNATURES, classify, code_meaning, decode

WORKER = Path(__file__).resolve().parents[2] / "worker-image"
BY_NAME = {s.name: s for s in SIGNATURES}
FAILURES = [c for c in (*ARIA2_CODES, *CURL_CODES, *ERRNO_CODES, *SIGNALS, *BASH_CODES, *WORKER_EXITS)
            if c.signature is not None]


def test_every_table_is_whole() -> None:
    assert sorted(ARIA2) == list(range(33))  # error_code.h: FINISHED 0 .. CHECKSUM_ERROR 32
    assert sorted(CURL) == list(range(102))  # curl.h: CURLE_OK 0 .. CURLE_ECH_REQUIRED 101
    assert sorted(ERRNO) == [n for n in range(1, 134) if n not in (41, 58)]  # EHWPOISON 133; 41, 58 unassigned
    assert sorted(SIGNAL) == list(range(1, 32))
    assert [c.number for c in BASH_CODES] == [126, 127]
    assert ERRNO[28].name == "ENOSPC" and ERRNO[28].text == "No space left on device"
    assert ARIA2[3].name == "RESOURCE_NOT_FOUND" and CURL[7].name == "CURLE_COULDNT_CONNECT"
    names = [c.name for c in ERRNO_CODES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("code", FAILURES, ids=[f"{c.name}-{c.number}" for c in FAILURES])
def test_every_entry_names_a_signature_with_its_blame_and_a_reason(code: Code) -> None:
    assert code.signature in BY_NAME, code
    sig = BY_NAME[code.signature]
    assert sig.blame == code.blame, (code, sig.name, sig.blame)
    assert (sig.strength == GENERIC) == code.generic, code
    assert len(code.why) > 20 and code.text


def _expect(code: Code, line: str) -> None:
    match = classify([line])
    assert match is not None, f"{line!r} ({code.name}) matched nothing"
    assert match.name == code.signature, (line, code.name, match.name)


@pytest.mark.parametrize("code", [c for c in ARIA2_CODES if c.signature], ids=lambda c: c.name)
def test_every_aria2c_code_is_decided_by_its_entry(code: Code) -> None:
    _expect(code, f"Exception: [AbstractCommand.cc:351] errorCode={code.number} URI=https://m/v28.params")
    _expect(code, f"fleet: ERROR: aria2c failed to download https://m/v28.params (exit code {code.number})")
    meaning = code_meaning(f"errorCode={code.number}")
    assert meaning == f"aria2c {code.number} {code.name}: {code.text}"


@pytest.mark.parametrize("code", [c for c in CURL_CODES if c.signature], ids=lambda c: c.name)
def test_every_curl_code_is_decided_by_its_entry(code: Code) -> None:
    _expect(code, f"curl: ({code.number}) {code.text}")
    _expect(code, f"fleet: ERROR: could not download https://m/manifest.txt (curl exit code {code.number})")
    assert code_meaning(f"curl: ({code.number})") == f"curl {code.number} {code.name}: {code.text}"


@pytest.mark.parametrize("code", ERRNO_CODES, ids=lambda c: c.name)
def test_every_errno_is_decided_by_its_entry_in_every_form(code: Code) -> None:
    # rust-lang/rust library/std/src/io/error.rs: Display `{} (os error {})`, Debug `Os { code, kind, message }`.
    _expect(code, f"Error: failed to open /data/zk/params/v28.params | {code.text} (os error {code.number})")
    _expect(code, f'called `Result::unwrap()` on an `Err` value: Os {{ code: {code.number}, kind: Other, message: '
                  f'"{code.text}" }}')
    _expect(code, f"OSError: [Errno {code.number}] {code.text}: '/data/zk/params/v28.params'")  # CPython
    _expect(code, f"write(3, ..., 4096) = -1 {code.name} ({code.text})")  # strace
    assert code_meaning(f"{code.text} (os error {code.number})") == f"{code.name} ({code.number}): {code.text}"


def test_a_network_errno_against_our_own_daemon_is_the_daemons_symptom() -> None:
    ours = classify(["Error: failed to connect to daemon at http://127.0.0.1:9820 | transport error | "
                     "Connection reset by peer (os error 104)"])
    remote = classify(["Error: error sending request for url (https://params.example.com/v28.params) | "
                       "Connection reset by peer (os error 104)"])
    assert ours is not None and (ours.name, ours.blame) == ("daemon-connection-refused", "image")
    assert remote is not None and (remote.name, remote.blame) == ("connection-reset", "network")


def test_an_ambiguous_errno_is_recognised_blames_nobody_and_keys_by_its_code() -> None:
    again = classify(["Error: failed to spawn prover thread | Resource temporarily unavailable (os error 11)"])
    busy = classify(["Error: failed to open /dev/nvidia0 | Device or resource busy (os error 16)"])
    assert again is not None and busy is not None
    assert (again.blame, busy.blame) == ("unknown", "unknown") and again.name == busy.name
    assert (again.key, busy.key) == ("os-error-ambiguous:EAGAIN", "os-error-ambiguous:EBUSY")


@pytest.mark.parametrize("code", SIGNALS, ids=lambda c: c.name)
def test_every_signal_is_decided_by_its_entry(code: Code) -> None:
    status = 128 + code.number
    assert signal_of_exit(status) == code
    _expect(code, f"fleet: cuzk-daemon exited with code {status} (killed by {code.name})")
    _expect(code, f"fleet: ERROR: cuzk-bench exited with code {status} after 0 of 10 proofs (0 failed)")
    # Rust's ExitStatus Display on Unix: `signal: N (SIGNAME)`.
    _expect(code, f"error: process didn't exit successfully: `target/release/cuzk-bench` (signal: {code.number}, "
                  f"{code.name})")
    assert code_meaning(f"exited with code {status}") == f"{code.name} (128 + {code.number}): {code.text}"


@pytest.mark.parametrize("code", BASH_CODES, ids=lambda c: c.name)
def test_bash_126_and_127_are_decided_by_their_entries(code: Code) -> None:
    _expect(code, f"fleet: ERROR: fetch-params.sh exited with code {code.number}")
    assert decode(f"exit code {code.number}") == ("bash", code)


def test_the_worker_exit_codes_include_is_generated_from_the_table() -> None:
    path = WORKER / "lib" / "exit-codes.sh"
    assert path.read_text() == render_worker_exit_codes(), (
        "worker-image/lib/exit-codes.sh is stale: regenerate it with the command in its header")
    assert ". \"$(dirname \"${BASH_SOURCE[0]}\")/exit-codes.sh\"" in (WORKER / "lib" / "fleet.sh").read_text()


_FAIL = re.compile(r'(?:fleet_fail|fail_warmup|bench_config_error) "\$FLEET_EXIT_([A-Z_]+)" "((?:[^"\\]|\\.)*)"'
                   r'|(bench_config_error) "((?:[^"\\]|\\.)*)"')
_VAR = re.compile(r"\$\{[^}]*\}|\$\([^)]*\)|\$[A-Za-z_*][A-Za-z0-9_]*|\$\*")


def _failures() -> list[tuple[str, str, str]]:
    out = []
    for script in sorted(WORKER.glob("*.sh")):
        for m in _FAIL.finditer(script.read_text()):
            name, message = (m.group(1), m.group(2)) if m.group(1) else ("CONFIG", m.group(4))
            if message != "$*":  # a helper passing its caller's message on: the caller's call is checked
                out.append((script.name, name, message))
    return out


def test_every_exit_code_the_scripts_use_is_in_the_table() -> None:
    used = set()
    for script in [*WORKER.glob("*.sh"), *(WORKER / "lib").glob("*.sh")]:
        used |= set(re.findall(r"\$\{?FLEET_EXIT_([A-Z_]+)", script.read_text()))
    assert used and used <= {c.name for c in WORKER_EXITS}, used - {c.name for c in WORKER_EXITS}


@pytest.mark.parametrize(("script", "name", "message"), _failures())
def test_every_worker_failure_message_is_judged_by_its_exit_codes_entry(script: str, name: str, message: str) -> None:
    code = next(c for c in WORKER_EXITS if c.name == name)
    # What the worker logs (fleet_fail: `fleet: ERROR: <message>`), its variables filled with plain words.
    line = "fleet: ERROR: " + _VAR.sub("x1", message.replace('\\"', '"'))
    match = classify([line])
    assert match is not None, (script, line)
    assert match.blame == code.blame, (script, line, match.name, code.signature)
