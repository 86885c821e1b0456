"""Settings: the process environment read in one place; secrets never print themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.adapters.settings import (
    CONTROLLER_SECRET_ENV,
    IMAGE_DIGEST_ENV,
    VAST_API_KEY_ENV,
    SettingError,
    secret_setting,
    settings,
)

KEY = "vast-key-0123456789abcdef"


def test_settings_come_from_the_given_environment_and_hide_secret_values() -> None:
    s = settings({VAST_API_KEY_ENV: f"  {KEY}\n", IMAGE_DIGEST_ENV: "sha256:" + "a" * 64})
    assert s.vast_api_key is not None and s.vast_api_key.reveal() == KEY
    assert s.vast_api_key.source == "$VAST_API_KEY"
    assert KEY not in repr(s) and KEY not in str(s.vast_api_key) and KEY not in f"{s}"
    assert s.image_digest == "sha256:" + "a" * 64
    assert s.controller_secret is None  # unset and blank are the same: nothing configured


def test_a_secret_file_wins_over_the_environment_and_bad_files_are_named(tmp_path: Path) -> None:
    env = settings({CONTROLLER_SECRET_ENV: "from-the-environment-0123"})
    file = tmp_path / "secret"
    file.write_text("from-a-file-0123456789\n")
    chosen = secret_setting(file, env.controller_secret, "controller secret")
    assert chosen is not None and chosen.reveal() == "from-a-file-0123456789" and chosen.source == f"file {file}"
    assert secret_setting(None, env.controller_secret, "controller secret") == env.controller_secret
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SettingError, match=r"the controller secret file .*empty is empty"):
        secret_setting(tmp_path / "empty", None, "controller secret")
    with pytest.raises(SettingError, match=r"cannot read the controller secret file .*missing"):
        secret_setting(tmp_path / "missing", None, "controller secret")


def test_only_the_settings_adapter_reads_configuration_from_os_environ() -> None:
    package = Path(__file__).resolve().parents[2] / "reconciler"
    readers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if "os.environ.get(" in p.read_text() or "getenv(" in p.read_text())
    assert readers == ["adapters/marketplace/local.py"], readers  # local only passes PATH through to workers
