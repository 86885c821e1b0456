"""Settings: every environment variable and secret the package reads, read once, into one typed object.

The process environment is an outside thing like any other; this is its adapter. Nothing else in the
package reads `os.environ` for configuration (the local marketplace only passes a few variables through
to the worker processes it starts). Secrets are kept as `Secret`, whose repr and str never show the
value, so a Settings object can be logged or put in an exception without leaking.

Precedence everywhere: an explicit argument (a CLI flag, a `--*-file`, a Pulumi stack config secret),
then the environment variable named here, then nothing (the caller says what is missing and where to
set it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reconciler.domain import errors

CONTROLLER_SECRET_ENV = "FLEET_CONTROLLER_SECRET"  # noqa: S105 - variable names, not values
ADMIN_TOKEN_ENV = "FLEET_ADMIN_TOKEN"  # noqa: S105
READ_TOKEN_ENV = "FLEET_READ_TOKEN"  # noqa: S105
VAST_API_KEY_ENV = "VAST_API_KEY"
IMAGE_DIGEST_ENV = "FLEET_IMAGE_DIGEST"
WEBHOOK_URL_ENV = "FLEET_WEBHOOK_URL"
CI_ENV = "CI"
REGISTRY_PASSWORD_ENV = "FLEET_REGISTRY_PASSWORD"  # noqa: S105
TEST_PAUSE_AT_ENV = "FLEET_TEST_PAUSE_AT"
TEST_PAUSE_FIFO_ENV = "FLEET_TEST_PAUSE_FIFO"
CACHE_HOME_ENV = "XDG_CACHE_HOME"

#: Every variable the package reads, with what it is for (`fleet --help` lists these).
ENVIRONMENT = {
    CONTROLLER_SECRET_ENV: "HMAC key of worker tokens (>= 16 bytes); controller and provisioner must agree",
    ADMIN_TOKEN_ENV: "controller admin token: read API, POST .../destroyed",
    READ_TOKEN_ENV: "controller read-only token: status page and read API",
    VAST_API_KEY_ENV: "vast.ai API key (backend vastai)",
    IMAGE_DIGEST_ENV: "desired worker image digest sha256:<hex> (stale-image checks)",
    WEBHOOK_URL_ENV: "webhook URL for verdicts, breaker trips, spend cap, orphans (a secret)",
    CI_ENV: "true/1 in CI: `fleet demo` never waits for Ctrl-C there",
    REGISTRY_PASSWORD_ENV: "the worker image registry's password/token: set it where the controller runs so that "
                           "a worker log line printing it is redacted",
    TEST_PAUSE_AT_ENV: "crash tests only: stop the process at this step of publishing (write, push, fenced, pushed)",
    TEST_PAUSE_FIFO_ENV: "crash tests only: FIFO on which the paused step is announced",
    CACHE_HOME_ENV: "where the record index of a spec directory outside git is kept (default ~/.cache)",
}


class SettingError(errors.PermanentError):
    """A setting is present but unusable (unreadable or empty file). Names the source, never the value."""

    reason = errors.CONFIG_MISSING


class Secret:
    """A secret string that does not print itself."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str):
        self._value = value
        self.source = source  # where it came from, for error messages: "$VAST_API_KEY", "file /run/key"

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(<redacted> from {self.source})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class Settings:
    controller_secret: Secret | None = None
    admin_token: Secret | None = None
    read_token: Secret | None = None
    vast_api_key: Secret | None = None
    image_digest: str | None = None
    webhook_url: Secret | None = None
    ci: bool = False
    cache_home: Path | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def secret(name: str) -> Secret | None:
            value = env.get(name, "").strip()
            return Secret(value, f"${name}") if value else None

        digest = env.get(IMAGE_DIGEST_ENV, "").strip() or None
        cache_home = env.get(CACHE_HOME_ENV, "").strip()
        return cls(controller_secret=secret(CONTROLLER_SECRET_ENV), admin_token=secret(ADMIN_TOKEN_ENV),
                   read_token=secret(READ_TOKEN_ENV), vast_api_key=secret(VAST_API_KEY_ENV), image_digest=digest,
                   webhook_url=secret(WEBHOOK_URL_ENV), ci=env.get(CI_ENV, "").strip().lower() in ("true", "1"),
                   cache_home=Path(cache_home) if cache_home else None)


WEBHOOK_ENV_PREFIX = "FLEET_WEBHOOK_"


def webhook_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every FLEET_WEBHOOK_* variable (FLEET_WEBHOOK_URL, FLEET_WEBHOOK_<NAME>_URL/_FORMAT/_EVENTS), for
    `reconciler.adapters.webhooks.targets_from_env`. The URLs are secrets: never print this mapping."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith(WEBHOOK_ENV_PREFIX)}


def named_secret(name: str, environ: Mapping[str, str] | None = None) -> Secret | None:
    """A secret held in an environment variable the spec names (e.g. a webhook's `url_env`)."""
    env = os.environ if environ is None else environ
    value = env.get(name, "").strip()
    return Secret(value, f"${name}") if value else None


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The process's settings. Read on each call (cheap): a long-running process sees a rotated secret on
    its next operation, and tests pass their own `environ` instead of patching the process's."""
    return Settings.from_environ(environ)


def test_pause_point(step: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The FIFO to announce `step` on when a crash test asked this process to stop there, else None."""
    env = os.environ if environ is None else environ
    fifo = env.get(TEST_PAUSE_FIFO_ENV, "")
    return fifo if fifo and env.get(TEST_PAUSE_AT_ENV) == step else None


def known_secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Secret values this process knows (controller secret and tokens, vast.ai key, registry password,
    webhook URL): redaction masks them by value wherever a worker prints them."""
    current = settings(environ)
    env = os.environ if environ is None else environ
    values = [s.reveal() for s in (current.controller_secret, current.admin_token, current.read_token,
                                   current.vast_api_key, current.webhook_url) if s is not None]
    registry = env.get(REGISTRY_PASSWORD_ENV, "").strip()
    return [*values, registry] if registry else values


def secret_from_file(path: Path, what: str) -> Secret:
    """A secret kept in a file (`--secret-file`): not in argv (visible in `ps`) and not in the environment."""
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SettingError(f"cannot read the {what} file {path}: {detail}") from None
    if not value:
        raise SettingError(f"the {what} file {path} is empty")
    return Secret(value, f"file {path}")


def secret_setting(file: Path | None, from_env: Secret | None, what: str) -> Secret | None:
    """`--*-file` if given, else the environment's value, else None."""
    return secret_from_file(file, what) if file is not None else from_env
