"""Whether a controller address keeps worker tokens and logs off the network in clear text.

Workers send their per-instance token and their logs to the controller's URL; operators send the read token to
its page. A controller that listens on a non-loopback address without TLS (in the process, `--tls-cert`, or in a
reverse proxy in front of it, `--behind-tls-proxy`), or a spec whose `controller.url` is `http://` on a
non-loopback host, sends them in clear: `fleet reconcile --listen` / `fleet controller serve` warn at start and
in status, `fleet validate` warns on the spec. Pure functions.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

#: Names that resolve to this host only.
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """`host` (an address or a name, IPv6 possibly in brackets) reaches this machine only."""
    name = host.strip().strip("[]").lower()
    if name in _LOCAL_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def listen_warning(host: str, *, tls: bool, behind_tls_proxy: bool) -> str | None:
    """Why listening on `host` exposes tokens in clear, or None."""
    if tls or behind_tls_proxy or is_loopback(host):
        return None
    return (f"listening on {host} without TLS: worker tokens, logs and the page's sign-in cross the network in "
            "clear; give --tls-cert/--tls-key, or put a TLS proxy in front (listen on 127.0.0.1, or declare it "
            "with --behind-tls-proxy)")


def controller_url_warning(url: str) -> str | None:
    """Why workers reaching `url` (the spec's `controller.url`) send their tokens in clear, or None."""
    parts = urlsplit(url)
    if parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return None
    return (f"{url} is plain http:// on a non-loopback host: workers would send their tokens and logs in clear; "
            "use https:// (TLS in the controller or a proxy in front of it)")


def served_over_tls(url: str | None) -> bool:
    """`url` (the spec's `controller.url`) is https: whoever terminates TLS, browsers reach the page over it."""
    return url is not None and urlsplit(url).scheme == "https"
