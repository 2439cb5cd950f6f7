"""Session checks for the whole suite."""

from __future__ import annotations

import os

import pytest

from tests.bwrap_support import sandbox_unavailable

REQUIRE_SANDBOX = "LOOPRL_REQUIRE_SANDBOX"
"""Set to 1 (as CI does) to fail instead of skipping the sandboxed tests when they cannot run."""


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get(REQUIRE_SANDBOX) == "1" and (why := sandbox_unavailable()):
        raise pytest.UsageError(f"{REQUIRE_SANDBOX}=1 but sandboxed tests cannot run here: {why} "
                                f"(unset {REQUIRE_SANDBOX} to skip them instead)")
