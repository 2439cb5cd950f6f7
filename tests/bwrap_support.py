"""Whether sandboxed tests can run here: bubblewrap usable, user namespaces on, and root (for the
overlay mounts and per-sandbox uids). Shared by every test package that needs a real sandbox."""

from __future__ import annotations

import functools
import os
import time

import pytest

from looprl.errors import SandboxUnavailableError


@functools.cache
def sandbox_unavailable() -> str | None:
    """Why sandboxed tests cannot run here, or None when they can. Checked once a session, so
    the skip reason says what failed; tried three times, since a check beside busy sandboxes
    once failed where one seconds later passed."""
    from looprl.sandbox.command import check_bwrap

    if os.geteuid() != 0:
        return "needs root (overlay mounts, per-sandbox uids)"
    for attempt in range(3):
        if attempt:
            time.sleep(2 * attempt)
        try:
            check_bwrap()
            return None
        except SandboxUnavailableError as e:
            reason = str(e)
    return reason


def bwrap_ok() -> bool:
    return sandbox_unavailable() is None


skip_without_sandbox = pytest.mark.skipif(not bwrap_ok(),
                                          reason=f"needs a sandbox: {sandbox_unavailable()}")
needs_bwrap = [pytest.mark.needs_bwrap, skip_without_sandbox]
"""A module's ``pytestmark``; a single test takes ``@pytest.mark.needs_bwrap`` and
``@skip_without_sandbox``."""


START_PATHS = ["rooted", "bwrap_per_command", "stock_tools"]
"""The ways a sandbox can start a command: a prepared sandbox root (root and a C compiler),
bwrap per command with the C launcher, and bwrap per command with stock tools."""


def use_start_path(path: str, base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sandboxes created from now on start commands the ``path`` way (``START_PATHS``),
    skipping the test where that way is unavailable for a sandbox over ``base``."""
    from looprl.sandbox import bwrap
    from looprl.sandbox.launch import launcher_path

    if path == "rooted" and not bwrap.can_root([base]):
        pytest.skip("sandbox roots need root and a C compiler")
    if path != "rooted":
        monkeypatch.setattr(bwrap, "can_root", lambda paths: False)
    if path == "stock_tools":
        monkeypatch.setenv("LOOPRL_SANDBOX_LAUNCHER", "tools")
    launcher_path.cache_clear()
