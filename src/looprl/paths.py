"""Where looprl keeps things on disk. ``LOOPRL_HOME`` (default ``~/.cache/looprl``) holds fetched
packages, built task sets, the default model, search indexes and the local weight store."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    p = Path(os.environ.get("LOOPRL_HOME", Path.home() / ".cache" / "looprl"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def sub(name: str) -> Path:
    """A subdirectory of the looprl home (created): 'packages', 'tasks', 'models', 'weights', ..."""
    p = home() / name
    p.mkdir(parents=True, exist_ok=True)
    return p
