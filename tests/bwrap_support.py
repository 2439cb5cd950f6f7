"""Whether sandboxed tests can run here: bubblewrap usable, user namespaces on, and root (for the
overlay mounts and per-sandbox uids). Shared by every test package that needs a real sandbox."""

from __future__ import annotations

import functools
import os

import pytest

from looprl.errors import SandboxUnavailableError


@functools.cache
def sandbox_unavailable() -> str | None:
    """Why sandboxed tests cannot run here, or None when they can. Checked once a session, so
    the skip reason says what failed (a check that fails under load skips every sandbox test)."""
    from looprl.sandbox.bwrap import check_bwrap

    if os.geteuid() != 0:
        return "needs root (overlay mounts, per-sandbox uids)"
    try:
        check_bwrap()
    except SandboxUnavailableError as e:
        return str(e)
    return None


def bwrap_ok() -> bool:
    return sandbox_unavailable() is None


needs_bwrap = [pytest.mark.needs_bwrap,
               pytest.mark.skipif(not bwrap_ok(),
                                  reason=f"needs a sandbox: {sandbox_unavailable()}")]
