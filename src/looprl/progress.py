"""Progress bars that also show in a log file. Where the console is not a terminal (output sent
to a file, CI), rich draws a bar only once, when it stops: a 27-minute RL stage would say nothing
until its end. There a ``Bar`` prints one plain line per task every ``every`` seconds instead:

    pretrain 120/300 (40%) loss 3.21 [2:05]
"""

from __future__ import annotations

import time
from typing import Any

from rich.progress import Progress, TaskID


class Bar(Progress):
    """``rich.progress.Progress`` that, off a terminal, logs each task's state every ``every``
    seconds of wall time as it advances."""

    def __init__(self, *columns: Any, every: float = 60.0, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self.every = every
        self._logged: dict[TaskID, float] = {}

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        self._log(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def _log(self, task_id: TaskID) -> None:
        if self.disable or self.console.is_terminal:
            return
        now = time.monotonic()
        if now - self._logged.setdefault(task_id, now) < self.every:
            return
        self._logged[task_id] = now
        self.console.print(line(next(t for t in self.tasks if t.id == task_id)),
                           markup=False, highlight=False)


def line(task: Any) -> str:
    """One task's state as plain text: description, done/total (share), numeric fields, time."""
    done = f"{task.completed:g}" + (f"/{task.total:g} ({task.percentage:.0f}%)"
                                     if task.total else "")
    fields = "".join(f" {k} {v:.3g}" for k, v in task.fields.items() if isinstance(v, float))
    elapsed = int(task.elapsed or 0)
    return f"{task.description or 'progress'} {done}{fields} [{elapsed // 60}:{elapsed % 60:02d}]"
