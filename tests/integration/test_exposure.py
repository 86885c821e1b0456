"""Plain HTTP where tokens cross a network is said out loud (issue 30): a controller listening on a non-loopback
address without TLS (and not declared behind a TLS proxy) warns at start and in `fleet status`; `fleet validate`
warns on an `http://` controller URL that is not loopback; the page's session cookie is Secure whenever the page
is reached over TLS (the controller's own, a proxy's, or an https `controller.url`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.cli.controller import exposure_warning, page_over_tls
from reconciler.domain.exposure import controller_url_warning, is_loopback, listen_warning
from tests.controller_support import SECRET
from tests.gitrepos import make_origin
from tests.scenarios import SPEC_YAML

ALL_INTERFACES = "0.0.0.0"  # noqa: S104 - what an operator's --listen says; the tests below bind it on purpose


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    (ALL_INTERFACES, False), ("::", False), ("10.0.0.5", False), ("fleet.example.org", False),
    ("127.0.0.1.nip.io", False)])
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    assert (listen_warning(host, tls=False, behind_tls_proxy=False) is None) is loopback
    assert listen_warning(host, tls=True, behind_tls_proxy=False) is None
    assert listen_warning(host, tls=False, behind_tls_proxy=True) is None


def test_the_spec_url_and_the_cookie() -> None:
    assert controller_url_warning("http://203.0.113.7:8080") is not None
    assert controller_url_warning("http://127.0.0.1:8080") is None and controller_url_warning("https://x.org") is None

    def args(*flags: str) -> argparse.Namespace:
        return argparse.Namespace(tls_cert=Path("c.pem") if "tls" in flags else None,
                                  behind_tls_proxy="proxy" in flags)

    assert not page_over_tls(args(), "http://127.0.0.1:8080") and not page_over_tls(args(), None)
    assert page_over_tls(args("tls"), None) and page_over_tls(args("proxy"), None)
    assert page_over_tls(args(), "https://fleet.example.org")
    assert exposure_warning(ALL_INTERFACES, args()) is not None
    assert exposure_warning(ALL_INTERFACES, args("proxy")) is None


def test_validate_warns_on_plain_http_to_a_public_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "fleet.yaml"
    spec.write_text(SPEC_YAML.replace("http://127.0.0.1:8080", "http://203.0.113.7:8080"))
    assert main(["validate", str(spec)]) == 0  # a warning, not an error
    out = capsys.readouterr().out
    assert "warning: $.controller.url: http://203.0.113.7:8080 is plain http://" in out and "1 warning(s)" in out
    spec.write_text(SPEC_YAML)
    assert main(["validate", str(spec)]) == 0
    assert "warning" not in capsys.readouterr().out


def test_a_public_listen_without_tls_warns_at_start_and_in_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    origin, _ = make_origin(tmp_path, {"fleet-spec/fleet.yaml": SPEC_YAML})
    monkeypatch.setenv("FLEET_CONTROLLER_SECRET", SECRET.decode())
    workdir = tmp_path / "w"
    base = ["reconcile", "--repo", str(origin), "--workdir", str(workdir), "--controller-db", str(tmp_path / "c.db"),
            "--once"]
    assert main([*base, "--listen", "0.0.0.0:0"]) == 0
    err = capsys.readouterr().err
    assert "warning: listening on 0.0.0.0 without TLS" in err
    assert main(["status", "--workdir", str(workdir)]) == 0
    assert "warning: listening on 0.0.0.0 without TLS" in capsys.readouterr().out
    # Declared behind a TLS proxy (or on loopback): no warning, and status says none.
    assert main([*base, "--listen", "0.0.0.0:0", "--behind-tls-proxy"]) == 0
    assert "without TLS" not in capsys.readouterr().err
    assert main(["status", "--workdir", str(workdir)]) == 0
    assert "without TLS" not in capsys.readouterr().out
