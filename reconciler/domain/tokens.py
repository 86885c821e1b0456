"""Per-instance worker tokens: hex HMAC-SHA256(controller secret, instance_id).

The slot provider mints a token when it creates an instance and passes it to the worker in env
(FLEET_TOKEN); the controller recomputes it on every request, so no token table exists to lose or leak.
A token only ever authorises reports about its own instance: a worker (or anyone who reads its env) cannot
write to another instance's record. Pure functions; secrets never appear in exceptions or logs.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from reconciler.domain import errors

#: A well-formed token: 64 lowercase hex characters (SHA-256 output).
TOKEN_PATTERN = re.compile(r"[0-9a-f]{64}\Z")

#: Shortest controller secret we accept: below this an HMAC key is guessable.
MIN_SECRET_BYTES = 16


class SecretError(errors.PermanentError, ValueError):
    """The configured secret cannot be used (missing or too short). Message never contains the secret."""

    reason = errors.SECRET_INVALID


def check_secret(secret: bytes, name: str = "controller secret") -> bytes:
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(f"{name} is {len(secret)} bytes long; at least {MIN_SECRET_BYTES} are required")
    return secret


def instance_token(secret: bytes, instance_id: str) -> str:
    """The bearer token a worker for `instance_id` presents."""
    return hmac.new(secret, instance_id.encode("utf-8"), hashlib.sha256).hexdigest()


def machine_claim(secret: bytes, instance_id: str, machine_id: str) -> str:
    """Proof, minted by the provisioner that rented `machine_id` for `instance_id`, that the pair belongs
    together. The token alone binds only the instance id; without this a worker (or a host with root on it)
    could report another machine's id and get that machine recorded bad."""
    message = b"machine-claim\x00" + instance_id.encode("utf-8") + b"\x00" + machine_id.encode("utf-8")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def verify_instance_token(secret: bytes, instance_id: str, presented: str) -> bool:
    """Constant-time check that `presented` is the token for `instance_id`."""
    expected = instance_token(secret, instance_id)
    return hmac.compare_digest(expected.encode("ascii"), presented.encode("utf-8", "surrogatepass"))


def is_well_formed_token(presented: str) -> bool:
    return TOKEN_PATTERN.fullmatch(presented) is not None


def bearer_token(authorization: str | None) -> str | None:
    """The credential in an `Authorization: Bearer <token>` header, or None if absent/another scheme."""
    if not authorization:
        return None
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential or " " in credential:
        return None
    return credential


def same_secret(expected: str, presented: str) -> bool:
    """Constant-time comparison for the admin token (a plain shared secret, not an HMAC)."""
    return hmac.compare_digest(expected.encode("utf-8", "surrogatepass"), presented.encode("utf-8", "surrogatepass"))
