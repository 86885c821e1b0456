"""The live status page, its refresh fragment, `/status.json` and `/metrics` over real HTTP on 127.0.0.1 (uvicorn,
the routes `fleet reconcile --listen` mounts), from a real git clone and controller store; the page rendered
by headless Chromium, whose screenshot is checked for the pools table and a chart.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from reconciler.adapters.git import GitStore
from reconciler.adapters.store.sqlite import SqliteStore
from reconciler.cli.surfaces import Surfaces, build_surfaces, market_view, slot_prices
from reconciler.render.live import COOKIE_NAME
from reconciler.render.metrics import METRIC_NAMES
from tests.browser_support import profile_cookies, profile_history, run_chromium, sign_in
from tests.html_support import FIRST, RUNNING, parse, table_rows, text_of
from tests.live_support import ADMIN_TOKEN, READ_TOKEN, RUNNING_PRICE, LiveFleet, at_now, make_live_fleet, serve_asgi
from tests.scenarios import DIGEST


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, Surfaces]]:
    fleet: LiveFleet = make_live_fleet(tmp_path)
    store = SqliteStore(fleet.db)
    git = GitStore(fleet.bot)
    surfaces = build_surfaces(spec_dir=fleet.bot / "fleet-spec", store=store, admin_token=ADMIN_TOKEN,
                              read_token=READ_TOKEN, desired_image_digest=DIGEST, last_pass_file=None,
                              commits=lambda: git.recent_commits(5), prices=slot_prices(fleet.state_dir),
                              market=market_view(fleet.state_dir),
                              refresh_s=1.0, sessions=store)
    surfaces.source._now = at_now  # the recorded incident's "now", so ages and windows are as recorded
    try:
        with serve_asgi(status_app_of(surfaces)) as url:
            yield url, surfaces
    finally:
        surfaces.close()
        git.close()
        store.close()


def status_app_of(surfaces: Surfaces) -> object:
    from starlette.applications import Starlette

    return Starlette(routes=surfaces.routes)


def test_the_page_needs_a_token_and_a_browser_signs_in_with_a_session(live: tuple[str, Surfaces],
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    url, _ = live
    caplog.set_level(logging.INFO, logger="uvicorn.access")
    with httpx.Client(base_url=url, follow_redirects=False) as client:
        denied = client.get("/")
        assert denied.status_code == 401 and 'action="/login"' in denied.text and "fleet status" in denied.text
        assert client.get("/status/fragment").status_code == 401
        assert client.get("/metrics").status_code == 401
        # A token in a URL signs nothing in, right or wrong: 204, the browser stays put and records nothing.
        for token in (READ_TOKEN, "wrong-token-0123456789abcdef"):
            linked = client.get(f"/?token={token}")
            assert linked.status_code == 204 and "set-cookie" not in linked.headers and linked.content == b""

        signed = client.post("/login", data={"token": READ_TOKEN})
        assert signed.status_code == 303 and signed.headers["location"] == "/"
        cookie = signed.headers["set-cookie"]
        assert READ_TOKEN not in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert "Max-Age=43200" in cookie and "Secure" not in cookie  # plain HTTP here: no Secure flag
        assert signed.headers["referrer-policy"] == "no-referrer"
        client.cookies.set(COOKIE_NAME, signed.cookies[COOKIE_NAME])
        page = client.get("/")
        assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
        nonce = page.headers["content-security-policy"].split("'nonce-")[1].split("'")[0]
        assert f'<script nonce="{nonce}">' in page.text and 'action="/logout"' in page.text
        # Signing out ends the session on the server: the same cookie is no longer good.
        session = signed.cookies[COOKIE_NAME]
        out = client.post("/logout")
        assert out.status_code == 303 and f'{COOKIE_NAME}=""' in out.headers["set-cookie"]
        client.cookies.set(COOKIE_NAME, session)
        assert client.get("/").status_code == 401

    with httpx.Client(base_url=url, follow_redirects=False) as client:
        form = client.post("/login", data={"token": ADMIN_TOKEN})
        assert form.status_code == 303
        client.cookies.set(COOKIE_NAME, form.cookies[COOKIE_NAME])
        assert client.get("/").status_code == 200
        assert client.post("/login", data={"token": "nope"}).status_code == 401
        assert client.get("/status.json", headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 200
    # The token travelled in a query string twice above: the access log masks it.
    assert READ_TOKEN not in caplog.text and "[REDACTED]" in caplog.text


def test_sessions_expire_are_shared_by_replicas_and_end_with_the_token(tmp_path: Path) -> None:
    """A session lives in the controller store: another replica's page knows it, it ends at its expiry, when
    revoked (every session at once), or when the token that signed it in is rotated."""
    from starlette.applications import Starlette

    from reconciler.render.live import ReadAccess, StatusRoutes

    store = SqliteStore(tmp_path / "c.db")
    clock = [at_now()]
    replicas = [ReadAccess((READ_TOKEN,), sessions=store, clock=lambda: clock[0], cookie_max_age_s=600)
                for _ in range(2)]

    def snapshot(query: object) -> object:
        raise AssertionError("not reached: only access is tested")

    def page(access: ReadAccess) -> Starlette:
        return Starlette(routes=StatusRoutes(snapshot, access).routes())  # type: ignore[arg-type]

    try:
        with serve_asgi(page(replicas[0])) as first, serve_asgi(page(replicas[1])) as second:
            signed = httpx.post(f"{first}/login", data={"token": READ_TOKEN})
            session = {COOKIE_NAME: signed.cookies[COOKIE_NAME]}
            assert httpx.get(f"{second}/status.json", cookies=session).status_code != 401  # the other replica knows it
            clock[0] += timedelta(seconds=601)
            assert httpx.get(f"{second}/status.json", cookies=session).status_code == 401  # expired
            clock[0] = at_now()
            session = {COOKIE_NAME: httpx.post(f"{first}/login", data={"token": READ_TOKEN}).cookies[COOKIE_NAME]}
            from reconciler.cli import main  # as an operator ends them: every replica's at once

            assert main(["controller", "revoke-sessions", "--db", str(tmp_path / "c.db")]) == 0
            assert httpx.get(f"{first}/status.json", cookies=session).status_code == 401  # revoked
        rotated = ReadAccess(("a-new-read-token-0123456789abcd",), sessions=store, clock=lambda: clock[0])
        with serve_asgi(page(replicas[0])) as old, serve_asgi(page(rotated)) as new:
            session = {COOKIE_NAME: httpx.post(f"{old}/login", data={"token": READ_TOKEN}).cookies[COOKIE_NAME]}
            assert httpx.get(f"{new}/status.json", cookies=session).status_code == 401  # rotated: ended
    finally:
        store.close()


def test_the_page_and_fragment_show_pools_spend_slo_machines_commits(live: tuple[str, Surfaces]) -> None:
    url, _ = live
    auth = {"Authorization": f"Bearer {READ_TOKEN}"}
    dom = parse(httpx.get(url + "/", headers=auth).text)
    rows = {cells[0]: cells for cells in table_rows(dom, "pools")}
    pro = rows["rtx-pro-4000"]
    assert pro[:9] == ["rtx-pro-4000", "RTX PRO 4000", "2", "4", "1", "0", "1", "29", "1/1"]
    # proofs/h 0 of the SLO 2 x 29; $/h: the benchmarking instance's $0.41 of the cap 2 x $0.60, 3 unpriced.
    assert pro[9] == "0"  # serving
    assert pro[10] == "0 / 58" and pro[11] == f"${RUNNING_PRICE:.2f} / $1.20, 3 unpriced"
    assert f"paused: image {DIGEST[:19]} suspect" in pro[-1]
    assert text_of(dom.find("dd", id="fleet-spend")[0]) == "$0.41/h of cap $5.00/h"
    (orphan,) = table_rows(dom, "orphans")
    assert orphan[:3] == ["7781234", "gpu-fleet/rtx4090-3", "due"] and "$0.33/h" in orphan[3]
    machines = {cells[0]: cells for cells in table_rows(dom, "machines")}
    assert machines["40213"][2] == "benchmark-error (blame: image)"
    assert "connection refused" in machines["40213"][3]
    # By default the page charts the machines of the instances that need the operator; ?all=1 adds the rest
    # (here the destroyed rtx4090 instance on 90001).
    assert {s.attrs["data-machine"] for s in dom.find("svg", class_="sparkline")} == {
        "40213", "51877", "62001", "90002"}
    everything = parse(httpx.get(url + "/?all=1", headers=auth).text)
    assert {s.attrs["data-machine"] for s in everything.find("svg", class_="sparkline")} == {
        "40213", "51877", "62001", "90001", "90002"}
    assert httpx.get(url + "/?page=x", headers=auth).status_code == 400
    commits = table_rows(dom, "commits")
    assert len(commits) == 1 and commits[0][3] == "seed"
    fragment = httpx.get(url + "/status/fragment", headers=auth)
    assert fragment.status_code == 200 and fragment.text.lstrip().startswith("<header>")
    assert "<script" not in fragment.text and 'id="pools"' in fragment.text
    doc = httpx.get(url + "/status.json", headers=auth).json()
    econ = {e["pool"]: e for e in doc["economics"]}
    assert econ["rtx-pro-4000"]["usd_per_hour"] == RUNNING_PRICE and not econ["rtx-pro-4000"]["meets_slo"]
    assert doc["instances"][0]["instance_id"] == FIRST.instance_id


def test_metrics_in_prometheus_format(live: tuple[str, Surfaces]) -> None:
    url, _ = live
    reply = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(reply.text) for s in family.samples}
    assert samples[("fleet_up", ())] == 1
    assert samples[("fleet_instances", (("pool", "rtx-pro-4000"), ("state", "benchmarking")))] == 1
    assert samples[("fleet_instances", (("pool", "rtx-pro-4000"), ("state", "failed")))] == 3
    assert samples[("fleet_instances", (("pool", "rtx4090"), ("state", "destroyed")))] == 1
    assert samples[("fleet_recorded_verdicts", (("blame", "image"), ("verdict", "benchmark-error")))] == 2
    assert samples[("fleet_recorded_verdicts", (("blame", "machine"), ("verdict", "below-min-rate")))] == 1
    assert samples[("fleet_pool_usd_per_hour", (("pool", "rtx-pro-4000"),))] == RUNNING_PRICE
    assert samples[("fleet_usd_per_hour", ())] == RUNNING_PRICE
    assert samples[("fleet_spend_cap_usd_per_hour", ())] == 5.0
    assert samples[("fleet_pool_serving_instances", (("pool", "rtx-pro-4000"),))] == 0
    assert samples[("fleet_orphans", ())] == 1 and samples[("fleet_orphans_usd_per_hour", ())] == 0.33
    assert samples[("fleet_pool_slo_proofs_per_hour", (("pool", "rtx4090"),))] == 10 * 40  # count x min rate
    assert samples[("fleet_image_suspects", ())] == 1
    assert samples[("fleet_bad_machines", (("pool", "rtx-pro-4000"),))] == 1
    assert samples[("fleet_controller_ingested_total", (("kind", "registrations"),))] == 6
    assert samples[("fleet_reconcile_passes_total", (("outcome", "ok"),))] == 0
    families = {f.name for f in text_string_to_metric_families(reply.text)}
    assert families == set(METRIC_NAMES)


def test_the_live_page_in_chromium_refreshes_and_shows_pools_and_charts(
        chromium: str, live: tuple[str, Surfaces], tmp_path: Path) -> None:
    url, _ = live
    # Signed in with the form (a session cookie in the profile); virtual time lets the refresh script run a few times.
    sign_in(chromium, tmp_path, url, READ_TOKEN)
    dumped = run_chromium(chromium, tmp_path, "--virtual-time-budget=5000", "--dump-dom", f"{url}/")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = parse(dumped.stdout)
    (state,) = dom.find("div", id="refresh-state")
    assert int(state.attrs.get("data-refreshed", "0")) >= 1, "the page did not refresh itself"
    assert "updated" in text_of(state)
    assert [r[0] for r in table_rows(dom, "pools")] == ["rtx-pro-4000", "rtx4090"]
    assert [s.attrs["data-pool"] for s in dom.find("svg", class_="rate-plot")] == ["rtx-pro-4000", "rtx4090"]
    assert dom.find("div", data_instance=RUNNING.instance_id)

    shot = tmp_path / "live.png"
    taken = run_chromium(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1400,1800",
                         "--hide-scrollbars", f"{url}/")
    assert taken.returncode == 0, taken.stderr[-2000:]
    check_screenshot(shot)


def test_cookies_are_secure_over_tls(tmp_path: Path) -> None:
    """Served over TLS (the controller's own, `--behind-tls-proxy`, or an https `controller.url`): the session
    cookie carries Secure, so a browser never sends it in clear."""
    from starlette.applications import Starlette

    from reconciler.render.live import ReadAccess, StatusRoutes

    store = SqliteStore(tmp_path / "c.db")
    try:
        access = ReadAccess((READ_TOKEN,), secure_cookie=True, sessions=store)
        with serve_asgi(Starlette(routes=StatusRoutes(lambda q: None, access).routes())) as url:  # type: ignore
            cookie = httpx.post(f"{url}/login", data={"token": READ_TOKEN}).headers["set-cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    finally:
        store.close()


def test_signing_in_leaves_no_token_in_the_browser_history(chromium: str, live: tuple[str, Surfaces],
                                                           tmp_path: Path) -> None:
    """Issue 30: a fresh Chromium profile kept `/?token=...` in its History database. Signed in with the form and
    then handed an old-style link: the profile's History holds no token, its cookie is HTTP-only, SameSite=Strict
    and expires."""
    url, _ = live
    sign_in(chromium, tmp_path, url, READ_TOKEN)
    shown = run_chromium(chromium, tmp_path, "--dump-dom", f"{url}/")
    assert shown.returncode == 0 and 'id="pools"' in shown.stdout, shown.stdout[:500]
    # The link's answer is 204: the browser stays where it was and commits no navigation, so a headless
    # `--dump-dom` (Chromium 150) would wait for a page load forever; `--timeout` stops it and dumps the blank tab.
    linked = run_chromium(chromium, tmp_path, "--timeout=5000", "--dump-dom", f"{url}/?token={READ_TOKEN}")
    assert linked.returncode == 0, linked.stderr[-2000:]
    assert 'id="pools"' not in linked.stdout, linked.stdout[:500]  # the old link does not show the page
    history = profile_history(tmp_path)
    assert f"{url}/" in history and f"{url}/login" in history, history
    assert not any(READ_TOKEN in visited for visited in history), history
    (cookie,) = profile_cookies(tmp_path, COOKIE_NAME)
    assert cookie["httponly"] == 1 and cookie["samesite"] == 2 and cookie["has_expires"] == 1, cookie
    assert cookie["secure"] == 0  # plain HTTP on 127.0.0.1; Secure over TLS: test_cookies_are_secure_over_tls


def _near(pixel: tuple[int, ...], rgb: tuple[int, int, int], tolerance: int = 12) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], rgb, strict=True))


def check_screenshot(path: Path) -> None:
    """The pools table (the header's dark band, table rows with alert backgrounds) and a chart (a dashed
    min-rate line: a row with many red dashes) are drawn, not just present in the DOM."""
    image = Image.open(path).convert("RGB")
    assert image.size == (1400, 1800)
    width, height = image.size
    pixels = image.load()
    assert pixels is not None
    header_dark = sum(1 for x in range(0, width, 4) if _near(pixels[x, 5], (0x1C, 0x24, 0x30)))
    assert header_dark > width // 4 * 0.9, "no page header drawn"
    alert_rows = sum(1 for y in range(height) if sum(
        1 for x in range(0, width, 8) if _near(pixels[x, y], (0xFF, 0xF3, 0xF0), 3)) > 50)
    assert alert_rows >= 10, "no pool row in alert colour (the paused pool) drawn"
    red_rows = [y for y in range(height) if sum(
        1 for x in range(width) if _near(pixels[x, y], (0xC6, 0x28, 0x28), 30)) > 120]
    assert red_rows, "no min-rate line drawn (the rate chart is missing)"
    colours = {pixels[x, y] for x in range(0, width, 3) for y in range(0, height, 3)}
    assert len(colours) > 200, "the page looks blank"


def test_fleet_reconcile_listen_serves_the_page_and_metrics_beside_the_api(chromium: str, tmp_path: Path) -> None:
    """The real process: `fleet reconcile --listen` on the recorded incident, its page in Chromium, its /metrics
    counting its own passes, the worker API still answering on the same port."""
    fleet = make_live_fleet(tmp_path)
    env = {**os.environ, "FLEET_CONTROLLER_SECRET": "c" * 40, "FLEET_ADMIN_TOKEN": ADMIN_TOKEN,
           "FLEET_READ_TOKEN": READ_TOKEN, "FLEET_IMAGE_DIGEST": DIGEST, "PYTHONUNBUFFERED": "1"}
    env.pop("FLEET_WEBHOOK_URL", None)
    argv = [sys.executable, "-m", "reconciler.cli", "reconcile", "--repo", str(fleet.origin), "--workdir",
            str(fleet.bot), "--controller-db", str(fleet.db), "--listen", "127.0.0.1:0", "--interval", "1",
            "--slot-state-dir", str(fleet.state_dir), "--status-refresh", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        url = None
        for line in proc.stdout:  # blocking reads of the process's own progress: no sleeps
            seen.append(line)
            if url is None and "controller listening on " in line:
                url = line.split("controller listening on ", 1)[1].split()[0]
            if url is not None and ("nothing new" in line or "committed" in line):
                break
        assert url is not None, "".join(seen)
        auth = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert httpx.get(url + "/healthz").status_code == 200  # the controller API shares the port
        dom = parse(httpx.get(url + "/", headers=auth).text)
        assert [r[0] for r in table_rows(dom, "pools")] == ["rtx-pro-4000", "rtx4090"]
        metrics = httpx.get(url + "/metrics", headers=auth).text
        got = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(metrics) for s in f.samples}
        assert got[("fleet_reconcile_passes_total", (("outcome", "ok"),))] >= 1
        assert got[("fleet_pool_usd_per_hour", (("pool", "rtx-pro-4000"),))] == RUNNING_PRICE
        assert httpx.get(url + "/metrics").status_code == 401

        shot = tmp_path / "reconcile.png"
        sign_in(chromium, tmp_path, url, READ_TOKEN)
        taken = run_chromium(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1400,1800",
                             "--hide-scrollbars", f"{url}/")
        assert taken.returncode == 0, taken.stderr[-2000:]
        check_screenshot(shot)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert READ_TOKEN not in out and ADMIN_TOKEN not in out  # not in the access log, not anywhere
