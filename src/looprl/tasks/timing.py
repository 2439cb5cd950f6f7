"""Where task building spends its time: wall seconds summed per named stage.

    with stage("venv"):
        build_venv(...)
    totals()            # -> {"download": 1.2, "venv": 6.3, ...} since the last reset()
    reset()

Stages that run concurrently (two screening sandboxes) add up their own wall times, so a stage
can exceed the elapsed time: read the figures as busy-seconds. Process-wide and not
thread-safe beyond CPython's dict updates, which is all the build needs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

STAGES = ("download", "unpack", "venv", "compile", "baseline_runs", "coverage_map", "screen",
          "write_tasks", "validate_oracle", "validate_untouched", "release")
"""The build's stages, in pipeline order (other names are allowed and listed after these)."""

_totals: dict[str, float] = {}
_counts: dict[str, int] = {}


@contextmanager
def stage(name: str) -> Iterator[None]:
    t0 = time.monotonic()
    try:
        yield
    finally:
        _totals[name] = _totals.get(name, 0.0) + time.monotonic() - t0
        _counts[name] = _counts.get(name, 0) + 1


def totals() -> dict[str, float]:
    """Seconds per stage since the last ``reset``, in pipeline order."""
    order = [s for s in STAGES if s in _totals] + sorted(set(_totals) - set(STAGES))
    return {s: _totals[s] for s in order}


def counts() -> dict[str, int]:
    return dict(_counts)


def reset() -> None:
    _totals.clear()
    _counts.clear()


def breakdown(totals_s: dict[str, float], counts_n: dict[str, int] | None = None) -> str:
    """One line: 'download 1.2s | venv 6.3s | screen 40.1s (212x) | ...'."""
    counts_n = counts_n or {}
    parts = []
    for name, s in totals_s.items():
        n = counts_n.get(name, 1)
        parts.append(f"{name} {s:.1f}s" + (f" ({n}x)" if n > 1 else ""))
    return " | ".join(parts)
