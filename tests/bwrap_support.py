"""Whether sandboxed tests can run here: bubblewrap usable, user namespaces on, and root (for the
overlay mounts and per-sandbox uids). Shared by every test package that needs a real sandbox."""

from __future__ import annotations

import os

import pytest

from looprl.errors import SandboxUnavailableError


def bwrap_ok() -> bool:
    from looprl.sandbox.bwrap import check_bwrap

    try:
        check_bwrap()
    except SandboxUnavailableError:
        return False
    return os.geteuid() == 0


needs_bwrap = [pytest.mark.needs_bwrap,
               pytest.mark.skipif(not bwrap_ok(), reason="needs bubblewrap, user namespaces and root")]
