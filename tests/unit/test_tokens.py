"""Instance tokens: deterministic HMAC, bound to one instance id and one secret, strict header parsing."""

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.domain.tokens import (
    SecretError,
    bearer_token,
    check_secret,
    instance_token,
    is_well_formed_token,
    same_secret,
    verify_instance_token,
)

SECRET = b"controller-secret-for-tests-0123"


def test_token_is_hex_hmac_sha256_of_the_instance_id() -> None:
    token = instance_token(SECRET, "rtx4090-0-3f9a1c")
    assert token == hmac.new(SECRET, b"rtx4090-0-3f9a1c", hashlib.sha256).hexdigest()
    assert is_well_formed_token(token)
    assert verify_instance_token(SECRET, "rtx4090-0-3f9a1c", token)


def test_token_for_another_instance_or_secret_is_rejected() -> None:
    other_instance = instance_token(SECRET, "rtx4090-1-aaaaaa")
    other_secret = instance_token(b"another-secret-of-sufficient-len", "rtx4090-0-3f9a1c")
    assert not verify_instance_token(SECRET, "rtx4090-0-3f9a1c", other_instance)
    assert not verify_instance_token(SECRET, "rtx4090-0-3f9a1c", other_secret)
    assert not verify_instance_token(SECRET, "rtx4090-0-3f9a1c", "")
    assert not verify_instance_token(SECRET, "rtx4090-0-3f9a1c", instance_token(SECRET, "rtx4090-0-3f9a1c").upper())


@given(st.text(max_size=80))
def test_arbitrary_presented_strings_never_verify_or_raise(presented: str) -> None:
    assert verify_instance_token(SECRET, "p-0-abc", presented) is (presented == instance_token(SECRET, "p-0-abc"))


@pytest.mark.parametrize(("header", "expected"), [
    ("Bearer abc", "abc"),
    ("bearer abc", "abc"),
    ("  Bearer   abc  ", "abc"),
    ("Basic abc", None),
    ("Bearer", None),
    ("Bearer ", None),
    ("Bearer a b", None),
    ("", None),
    (None, None),
])
def test_bearer_header_parsing(header: str | None, expected: str | None) -> None:
    assert bearer_token(header) == expected


def test_short_secret_is_refused_without_echoing_it() -> None:
    with pytest.raises(SecretError) as err:
        check_secret(b"hunter2")
    assert "hunter2" not in str(err.value) and "7 bytes" in str(err.value)
    assert check_secret(SECRET) == SECRET


def test_admin_token_comparison() -> None:
    assert same_secret("admin-token", "admin-token")
    assert not same_secret("admin-token", "admin-tokeN")
    assert not same_secret("admin-token", "\udc80")


def test_machine_claim_binds_instance_machine_and_secret() -> None:
    from reconciler.domain.tokens import machine_claim

    base = machine_claim(b"k" * 32, "rtx4090-0-abc123", "41001")
    assert len(base) == 64 and int(base, 16) >= 0
    assert base == machine_claim(b"k" * 32, "rtx4090-0-abc123", "41001")
    assert base != machine_claim(b"k" * 32, "rtx4090-0-abc123", "41002")
    assert base != machine_claim(b"k" * 32, "rtx4090-0-abc124", "41001")
    assert base != machine_claim(b"j" * 32, "rtx4090-0-abc123", "41001")
    # not the instance token: one cannot stand in for the other
    from reconciler.domain.tokens import instance_token
    assert base != instance_token(b"k" * 32, "rtx4090-0-abc123")
    # the NUL separators keep ("a", "bc") and ("ab", "c") apart
    assert machine_claim(b"k" * 32, "a", "bc") != machine_claim(b"k" * 32, "ab", "c")
