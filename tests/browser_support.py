"""Headless Chromium for page tests (Debian `chromium`), and feeding reports to a real controller store.

Chromium missing: the browser tests skip loudly (a warning and the skip reason), unless CI=true or
FLEET_REQUIRE_CHROMIUM=1, where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from datetime import datetime
from pathlib import Path

import pytest

from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.domain.observations import InstanceReport, format_time
from tests.html_support import FAST, FIRST, HOSTILE, NOW, RUNNING, SECOND, SLOW

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-default-apps", "--mute-audio")


def _required() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1") or os.environ.get("FLEET_REQUIRE_CHROMIUM") == "1"


def find_chromium() -> str:
    """The browser's path; skips (or fails under CI) when it is missing. Wrap it in a fixture named `chromium`."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = ("chromium is not installed (Debian: apt-get install chromium): the HTML status page was NOT "
                   "rendered in a browser")
        if _required():
            pytest.fail(message + " (CI=true / FLEET_REQUIRE_CHROMIUM=1: a missing browser is a failure)")
        warnings.warn(message, stacklevel=1)
        pytest.skip(message)
    return found


def run_chromium(chromium: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(tmp_path)}  # nothing written to the real home
    # The timeout only guards a wedged browser; nothing is asserted about time.
    return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=180, env=env, check=False)


def sign_in(chromium: str, tmp_path: Path, url: str, token: str) -> None:
    """Sign the test's Chromium profile in to the status page at `url` as a person does: the token POSTed by the
    sign-in form, never in a URL. A local page submits the form (headless Chromium types nothing); its answer
    sets the session cookie in the profile, which the next `run_chromium` of this test sends (SameSite=Strict:
    a navigation started by the local page itself is cross-site and shows the sign-in page once)."""
    page = tmp_path / "sign-in.html"
    page.write_text(f'<html><body><form method="post" action="{url}/login"><input name="token" value="{token}">'
                    "</form><script>document.forms[0].submit()</script></body></html>", encoding="utf-8")
    done = run_chromium(chromium, tmp_path, "--virtual-time-budget=3000", "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    page.unlink()  # the token does not stay on disk either


def profile_history(tmp_path: Path) -> list[str]:
    """Every URL in the test's Chromium profile's history (its History SQLite database)."""
    import sqlite3

    db = tmp_path / "chromium-profile" / "Default" / "History"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [str(row[0]) for row in conn.execute("SELECT url FROM urls")]
    finally:
        conn.close()


def profile_cookies(tmp_path: Path, name: str) -> list[dict[str, object]]:
    """The cookies called `name` in the test's Chromium profile, with their flags (samesite 2 = Strict)."""
    import sqlite3

    db = tmp_path / "chromium-profile" / "Default" / "Cookies"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT host_key, is_httponly, samesite, is_secure, has_expires, expires_utc "
                            "FROM cookies WHERE name = ?", (name,)).fetchall()
    finally:
        conn.close()
    return [dict(zip(("host", "httponly", "samesite", "secure", "has_expires", "expires_utc"), row, strict=True))
            for row in rows]


def store_report(store: SqliteStore, clock: list[datetime], report: InstanceReport) -> None:
    """Feed a report to the real controller store as the worker protocol would have delivered it."""
    clock[0] = report.registered_at  # the controller stamps registration with its own clock
    store.register(report.instance_id, {
        "protocol": 1, "instance_id": report.instance_id, "at": format_time(report.registered_at),
        "pool": report.pool, "slot": report.slot, "machine_id": report.machine_id, "host_id": report.host_id,
        "contract_id": report.contract_id, "gpu_name": report.gpu_name, "image_digest": report.image_digest})
    if report.log_tail:
        store.add_logs(report.instance_id, list(report.log_tail))
    for e in report.events:
        doc = {"protocol": 1, "phase": e.phase, "status": e.status, "at": format_time(e.at)}
        if e.exit_code is not None:
            doc |= {"exit_code": e.exit_code, "message": e.message, "log_tail": list(e.log_tail)}
        clock[0] = e.at  # arrives when sent: the timeline is on the controller's clock (one clock)
        store.add_event(report.instance_id, doc)
    if (r := report.result) is not None:
        result = {"protocol": 1, "outcome": r.outcome, "at": format_time(r.at), "requested": r.requested,
                  "completed": r.completed, "failed": r.failed, "exit_code": r.exit_code,
                  "proofs_per_hour": r.proofs_per_hour, "seconds_per_proof": r.seconds_per_proof,
                  "image_digest": r.image_digest, "log_tail": list(r.log_tail)}
        if r.started_at is not None:
            result["started_at"] = format_time(r.started_at)
        clock[0] = r.at
        store.set_result(report.instance_id, result)
    if report.destroyed_at is not None:
        store.mark_destroyed(report.instance_id, report.destroyed_at)


def store_incident(db: Path) -> Path:
    """The seed incident's six instances (tests.html_support) in a real controller store at `db`."""
    clock = [NOW]
    store = SqliteStore(db, now=lambda: clock[0])
    try:
        for report in (FIRST, SECOND, SLOW, RUNNING, FAST, HOSTILE):
            store_report(store, clock, report)
    finally:
        store.close()
    return db
