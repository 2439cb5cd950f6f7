"""Reading the record files a user hands to a command: JSONL with one ``Trajectory`` per line (what
the rollout runner, the oracle and the bench write). A bad file is a ``ConfigError`` naming the
file and the line, so a command stops with one line before any work starts.

    trajectories = read_trajectories(Path("runs/x/trajectories.jsonl"))

Task files have their own reader with per-field errors: ``looprl.tasks.taskset.load_tasks``.
"""

from __future__ import annotations

from pathlib import Path

from looprl.errors import ConfigError
from looprl.types import Trajectory


def read_trajectories(path: Path) -> list[Trajectory]:
    """Every ``Trajectory`` of the JSONL file at ``path`` (blank lines skipped)."""
    if not path.is_file():
        raise ConfigError(f"trajectory file {path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a JSONL text file of Trajectory records") from None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Trajectory.from_json(line))
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise ConfigError(f"{path}:{i} is not a Trajectory record ({e!r}); write one "
                              "Trajectory.to_json() per line") from None
    return out
