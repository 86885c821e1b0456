"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from tests.browser_support import find_chromium


@pytest.fixture(scope="module")
def chromium() -> str:
    """Headless Chromium's path (see tests/browser_support.py for when a missing browser skips or fails)."""
    return find_chromium()
