"""Where looprl keeps things on disk. ``LOOPRL_HOME`` (default ``~/.cache/looprl``) holds fetched
packages, built task sets, the default model, search indexes and the local weight store."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def home(create: bool = True) -> Path:
    p = Path(os.environ.get("LOOPRL_HOME", Path.home() / ".cache" / "looprl"))
    if create:
        p.mkdir(parents=True, exist_ok=True)
    return p


def sub(name: str) -> Path:
    """A subdirectory of the looprl home (created): 'packages', 'tasks', 'models', 'weights', ..."""
    p = home() / name
    p.mkdir(parents=True, exist_ok=True)
    return p


def installed_program(name: str) -> str | None:
    """A program of looprl's own environment: the one next to this interpreter (the venv's
    ``bin``), else the one on PATH, else None."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else shutil.which(name)
