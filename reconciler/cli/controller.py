"""`fleet controller serve|token`: run the worker-report API on its own, or mint a worker token.

`serve` is the standalone shell around `reconciler.adapters.controller.server.ControllerServer` (uvicorn +
Starlette) + the controller store (`--db`: a SQLite file, or a `postgresql://` URI shared by several
replicas; the reconcile loop embeds the same server in its own process). Routes beside
the API (live page, /metrics) come from `controller_routes`, the one place the cli adds them. Secrets come
from the environment (FLEET_CONTROLLER_SECRET, FLEET_ADMIN_TOKEN) or files, never from argv (visible in
`ps`), and are never printed or logged. Without a controller secret it refuses to start: anyone could
forge worker reports.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from reconciler.adapters.controller.protocol import INSTANCE_ID
from reconciler.adapters.settings import ADMIN_TOKEN_ENV, CONTROLLER_SECRET_ENV, SettingError, secret_setting, settings
from reconciler.adapters.store.port import ControllerStore, StoreError
from reconciler.adapters.stores import StoreTargetError, open_store, store_target
from reconciler.domain.tokens import SecretError, check_secret, instance_token

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

SECRET_ENV = CONTROLLER_SECRET_ENV


class ConfigError(Exception):
    """A setting the command cannot run without; the message says which and how to provide it."""


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-cert", type=Path, default=None, metavar="PEM",
                        help="serve HTTPS with this certificate chain (PEM; needs --tls-key)")
    parser.add_argument("--tls-key", type=Path, default=None, metavar="PEM",
                        help="private key of --tls-cert (PEM)")
    parser.add_argument("--behind-tls-proxy", action="store_true",
                        help="a reverse proxy in front terminates TLS: sign-in cookies are Secure, and listening on "
                             "a non-loopback address without --tls-cert is not warned about")


def page_over_tls(args: argparse.Namespace, controller_url: str | None) -> bool:
    """Browsers reach this process's page over TLS: its own (--tls-cert), a proxy's (--behind-tls-proxy), or
    the spec's `controller.url` says https. Sign-in cookies are then Secure."""
    from reconciler.domain.exposure import served_over_tls

    return args.tls_cert is not None or args.behind_tls_proxy or served_over_tls(controller_url)


def exposure_warning(host: str, args: argparse.Namespace) -> str | None:
    """The warning for listening on `host` with these TLS arguments (docs/security.md), or None."""
    from reconciler.domain.exposure import listen_warning

    return listen_warning(host, tls=args.tls_cert is not None, behind_tls_proxy=args.behind_tls_proxy)


def tls_files(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """(cert, key) from --tls-cert/--tls-key, None for plain HTTP; ConfigError when only one is given or a
    file is unusable (checked before anything listens)."""
    cert, key = args.tls_cert, args.tls_key
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("--tls-cert and --tls-key go together (the certificate chain and its private key)")
    from reconciler.adapters.controller.server import tls_context  # uvicorn/starlette only when serving

    try:
        tls_context(cert, key)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return cert, key


def controller_routes(store: ControllerStore) -> list[BaseRoute]:
    """Starlette routes mounted before the controller API (e.g. the live page at `/`, `/metrics`); the
    adapter stays free of render/flows imports because the cli passes them in (see build_app)."""
    return []


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("controller", help="the worker-report HTTP API (serve) and worker tokens (token)")
    actions = p.add_subparsers(dest="controller_command", required=True, metavar="ACTION")

    serve = actions.add_parser("serve", help="run the controller API until SIGINT/SIGTERM")
    serve.add_argument("--db", required=True, metavar="PATH|URI",
                       help="controller store: a SQLite file (created if missing; one process) or a PostgreSQL URI "
                            "postgresql://user@host:port/dbname shared by several replicas (password from the URI, "
                            "PGPASSWORD or ~/.pgpass)")
    serve.add_argument("--host", default="127.0.0.1", help="listen address (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8080, help="listen port, 0 = any free port (default: %(default)s)")
    serve.add_argument("--secret-file", type=Path, help=f"file holding the token secret (else ${SECRET_ENV})")
    serve.add_argument("--admin-token-file", type=Path, help=f"file holding the admin token (else ${ADMIN_TOKEN_ENV})")
    serve.add_argument("--allow-open-reads", action="store_true",
                       help="serve GET /api/... without the admin token (local demo on loopback only)")
    serve.add_argument("--allow-unclaimed-machine-ids", action="store_true",
                       help="accept a machine_id without the provisioner's machine_claim (workers of a "
                            "provisioner older than this controller); default: refuse, so a worker cannot "
                            "get another machine recorded bad")
    serve.add_argument("--ring-lines", type=int, default=5000,
                       help="log lines kept per instance (default: %(default)s)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_tls_arguments(serve)
    serve.set_defaults(func=run_serve)

    revoke = actions.add_parser("revoke-sessions",
                                help="sign every browser out of the status page (all replicas' sessions)")
    revoke.add_argument("--db", required=True, metavar="PATH|URI", help="the controller store (as for serve)")
    revoke.set_defaults(func=run_revoke_sessions)

    token = actions.add_parser("token", help="print the worker token for an instance id")
    token.add_argument("instance_id")
    token.add_argument("--secret-file", type=Path, help=f"file holding the token secret (else ${SECRET_ENV})")
    token.set_defaults(func=run_token)


def _read_setting(file: Path | None, env: str, what: str) -> bytes | None:
    current = settings()
    from_env = {CONTROLLER_SECRET_ENV: current.controller_secret, ADMIN_TOKEN_ENV: current.admin_token}[env]
    try:
        value = secret_setting(file, from_env, what)
    except SettingError as exc:
        raise ConfigError(str(exc)) from None
    return value.reveal().encode("utf-8") if value is not None else None


def load_secret(file: Path | None) -> bytes:
    secret = _read_setting(file, SECRET_ENV, "controller secret")
    if secret is None:
        raise ConfigError(f"no controller secret: set ${SECRET_ENV} or pass --secret-file (refusing to start: "
                          "without it anyone could forge worker reports)")
    try:
        return check_secret(secret)
    except SecretError as exc:
        raise ConfigError(str(exc)) from None


def load_admin_token(file: Path | None) -> str | None:
    token = _read_setting(file, ADMIN_TOKEN_ENV, "admin token")
    if token is None:
        return None
    try:
        return check_secret(token, "admin token").decode("utf-8")
    except (SecretError, UnicodeDecodeError) as exc:
        raise ConfigError(f"admin token unusable: {exc}") from None


def run_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        secret = load_secret(args.secret_file)
        admin_token = load_admin_token(args.admin_token_file)
        if args.ring_lines < 1:
            raise ConfigError(f"--ring-lines must be >= 1, got {args.ring_lines}")
        tls = tls_files(args)
        target = store_target(args.db)
        store = open_store(target, ring_lines=args.ring_lines)
    except (ConfigError, StoreError) as exc:
        print(f"fleet controller serve: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError | StoreTargetError) else 1
    if admin_token is None:
        logging.getLogger(__name__).warning(
            "no admin token ($%s): the read API %s and POST .../destroyed is disabled", ADMIN_TOKEN_ENV,
            "is open (--allow-open-reads)" if args.allow_open_reads else "is disabled")
    if (exposure := exposure_warning(args.host, args)) is not None:
        logging.getLogger(__name__).warning("%s", exposure)
    if args.allow_open_reads and args.host not in ("127.0.0.1", "::1", "localhost"):
        logging.getLogger(__name__).warning(
            "--allow-open-reads on %s: anyone who can reach this address can read every instance's (redacted) "
            "logs and reports", args.host)
    # uvicorn/starlette only when serving
    from reconciler.adapters.controller.server import ControllerServer

    try:
        server = ControllerServer(store, secret, admin_token, args.host, args.port,
                                  allow_open_reads=args.allow_open_reads,
                                  require_machine_claim=not args.allow_unclaimed_machine_ids,
                                  tls_cert=tls[0] if tls else None, tls_key=tls[1] if tls else None,
                                  extra_routes=controller_routes(store))
    except ValueError as exc:
        store.close()
        print(f"fleet controller serve: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server.start()
        except OSError as exc:
            print(f"fleet controller serve: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 1
        print(f"controller listening on {server.url} (store {store.location})", flush=True)
        stop.wait()
    finally:
        server.stop()
        store.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def run_revoke_sessions(args: argparse.Namespace) -> int:
    try:
        store = open_store(store_target(args.db))
    except StoreError as exc:
        print(f"fleet controller revoke-sessions: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, StoreTargetError) else 1
    try:
        ended = store.revoke_sessions()
    except StoreError as exc:
        print(f"fleet controller revoke-sessions: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    print(f"ended {ended} status page session(s): every browser signs in again")
    return 0


def run_token(args: argparse.Namespace) -> int:
    try:
        secret = load_secret(args.secret_file)
    except ConfigError as exc:
        print(f"fleet controller token: {exc}", file=sys.stderr)
        return 2
    if not INSTANCE_ID.fullmatch(args.instance_id):
        print(f"fleet controller token: instance id {args.instance_id!r} is not valid "
              "(expected [A-Za-z0-9][A-Za-z0-9_.-]*, at most 128 characters)", file=sys.stderr)
        return 2
    print(instance_token(secret, args.instance_id))
    return 0
