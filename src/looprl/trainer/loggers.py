"""Where per-step training metrics go: one small seam (``MetricLogger``), several trackers.

    loggers = make_loggers(("tensorboard", "wandb"), run_dir, run_name="qs", config=cfg_dict)
    loggers.log(step, row)        # metrics.jsonl, then each tracker named
    loggers.rewind(last_step)     # a resumed run forgets the steps its checkpoint never saw
    loggers.close()

``metrics.jsonl`` (``JsonlLogger``) is always written: it is the run's own record, which resume,
the report and the dashboard read. ``LoopConfig.loggers`` names the trackers beside it:

- ``tensorboard``: event files under ``run_dir/tb`` (``tensorboard --logdir runs``);
- ``wandb``: Weights & Biases (``pip install 'looprl[wandb]'``). Project from ``WANDB_PROJECT``
  (default ``looprl``); ``WANDB_MODE=offline`` keeps everything under ``run_dir/wandb`` for a
  later ``wandb sync``. A resumed run continues the same W&B run (its id is kept in
  ``run_dir/wandb_run_id``). W&B history is append-only: after a resume the lost steps' points
  stay, and the steps trained again are logged beside them (x axis ``step``);
- any ``module:attr`` or entry point of group ``looprl.loggers`` (``looprl.plugins``): a class
  called as ``cls(run_dir, run_name=..., config=...)`` whose instances follow ``MetricLogger``.

Only numbers are sent to trackers (a row's task list stays in ``metrics.jsonl``), and of a
skipped step (``step_skipped``: no group of its batch had reward variance, so it trained on no
token) not the trainer-side metrics (``TRAINED_ONLY``): its loss, IS ratio, grad norm, ... were not
measured, and a 0 there would read as a collapse. ``metrics.jsonl`` keeps the row as the step
wrote it.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from looprl.errors import ConfigError
from looprl.plugins import find
from looprl.rundir import RunDir


@runtime_checkable
class MetricLogger(Protocol):
    """A destination for one training run's per-step metrics."""

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Record ``row`` (metric -> value, JSON-able) as step ``step``."""

    def rewind(self, last_step: int) -> None:
        """Forget the steps after ``last_step`` where the destination can (resume)."""

    def close(self) -> None:
        """Flush and release; called once, at the end of the run."""


TRAINED_ONLY = frozenset({
    "train/loss", "train/kl_mean", "train/is_ratio_mean", "train/is_ratio_max",
    "train/clip_fraction", "train/grad_norm", "train/mean_staleness", "train/mtp_kl",
    "train/mtp_accept", "train/engine_kl", "train/engine_mismatch_frac"})
"""Metrics measured on the trained tokens: undefined on a step that trained on none."""


def step_skipped(row: Mapping[str, Any]) -> bool:
    """The step trained on no token (every group of its batch without reward variance).

    >>> step_skipped({"step": 3, "train/tokens": 0.0}), step_skipped({"step": 3, "train/tokens": 96})
    (True, False)
    """
    return row.get("train/tokens") == 0


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The measured numbers of a row (what trackers plot): finite, and no trainer-side metric of a
    skipped step.

    >>> scalars({"step": 3, "train/loss": 0.5, "tasks": ["a"], "ok": True, "kl": float("nan")})
    {'step': 3.0, 'train/loss': 0.5}
    >>> scalars({"step": 4, "train/tokens": 0, "train/loss": 0.0, "reward/total_mean": -0.1})
    {'step': 4.0, 'train/tokens': 0.0, 'reward/total_mean': -0.1}
    """
    skipped = step_skipped(row)
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and not (skipped and k in TRAINED_ONLY)}


def read_metrics(path: Path, last_step: int | None = None) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` up to ``last_step``; a line cut short by a kill is left out.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "m.jsonl"
    >>> _ = p.write_text('{"step": 1}\\n{"step": 2}\\n{"step": 3, "lo')
    >>> [r["step"] for r in read_metrics(p)], [r["step"] for r in read_metrics(p, 1)]
    ([1, 2], [1])
    """
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            if last_step is None or int(row["step"]) <= last_step:
                rows.append(row)
        except (ValueError, TypeError, KeyError):
            continue
    return rows


def groups_without_pass(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(groups trained, those of them where no rollout passed the tests) over metrics rows.
    Equal and nonzero: RL never saw a pass, so the tests gave it no signal and only the shaping
    terms (length, broken calls, ...) moved the policy.

    >>> groups_without_pass([{"tasks": ["a", "b"], "train/no_pass_groups": 2.0},
    ...                      {"tasks": ["c"], "train/no_pass_groups": 0.0}])
    (3, 2)
    """
    groups = sum(len(r.get("tasks", ())) for r in rows if "train/no_pass_groups" in r)
    no_pass = sum(int(r["train/no_pass_groups"]) for r in rows if "train/no_pass_groups" in r)
    return groups, no_pass


class JsonlLogger:
    """``run_dir/metrics.jsonl``: one JSON object per step, appended as it is trained."""

    def __init__(self, run_dir: Path) -> None:
        self.path = RunDir(run_dir).metrics

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(row)) + "\n")

    def rewind(self, last_step: int) -> None:
        if not self.path.exists():
            return
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in read_metrics(self.path, last_step)))
        os.replace(tmp, self.path)  # atomic: a kill leaves the old file or the new one

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """Scalars under ``run_dir/tb``; a rewind hides the later events (``purge_step``)."""

    def __init__(self, run_dir: Path, run_name: str = "", config: Mapping[str, Any] | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ConfigError(f"loop.loggers has 'tensorboard' but it cannot be imported ({e}): "
                              "pip install tensorboard, or drop it from loop.loggers") from None
        self.dir = RunDir(run_dir).tensorboard
        self.writer = SummaryWriter(str(self.dir))

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        for k, v in scalars(row).items():
            self.writer.add_scalar(k, v, step)

    def rewind(self, last_step: int) -> None:
        # the purge marker SummaryWriter(purge_step=) writes, written into the open event file: a
        # second writer would start a second file, and TensorBoard reads a directory's files in
        # name order, where ".10" sorts before ".9" within one second and the purge came first
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.writer._get_file_writer().add_event(
            Event(step=last_step + 1, session_log=SessionLog(status=SessionLog.START)))

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A Weights & Biases run (see the module docstring for project, offline mode, resume)."""

    def __init__(self, run_dir: Path, run_name: str = "", config: Mapping[str, Any] | None = None):
        try:
            import wandb
        except ImportError:
            raise ConfigError("loop.loggers has 'wandb' but wandb is not installed: "
                              "pip install 'looprl[wandb]', or drop it from loop.loggers") from None
        run_dir = Path(run_dir)
        id_file = RunDir(run_dir).wandb_run_id
        if not id_file.exists():
            id_file.write_text(secrets.token_hex(8) + "\n")
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "looprl"),
                                  name=run_name or run_dir.name, id=id_file.read_text().strip(),
                                  resume="allow", dir=str(run_dir), config=dict(config or {}))
        except Exception as e:  # noqa: BLE001 — no login, no network, a bad setting: say how to fix
            why = " ".join(str(e).split())[:300]
            raise ConfigError(f"W&B could not start a run ({type(e).__name__}: {why}): run `wandb "
                              "login` or set WANDB_API_KEY, or WANDB_MODE=offline to log to "
                              "run_dir/wandb and `wandb sync` later") from None
        # our step is a metric of its own: W&B's internal step must only grow, ours may rewind
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        self.run.log({**scalars(row), "step": step})

    def rewind(self, last_step: int) -> None:
        pass  # W&B history cannot be rewritten: the steps trained again are logged beside

    def close(self) -> None:
        self.run.finish()


LOGGERS: dict[str, type] = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger}


class Loggers:
    """``metrics.jsonl`` plus every tracker, behind one ``MetricLogger``."""

    def __init__(self, loggers: Sequence[MetricLogger]) -> None:
        self.loggers = list(loggers)

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        for lg in self.loggers:
            lg.log(step, row)

    def rewind(self, last_step: int) -> None:
        for lg in self.loggers:
            lg.rewind(last_step)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


def make_loggers(names: Sequence[str], run_dir: Path, *, run_name: str = "",
                 config: Mapping[str, Any] | None = None) -> Loggers:
    """``JsonlLogger`` and the trackers ``names`` (built-in names, entry points, module:attr)."""
    out: list[MetricLogger] = [JsonlLogger(run_dir)]
    for name in dict.fromkeys(names):
        if name == "jsonl":
            continue  # always written
        cls = find("loggers", name, LOGGERS)
        lg = cls(Path(run_dir), run_name=run_name, config=config)
        if not isinstance(lg, MetricLogger):
            raise ConfigError(f"logger {name!r} makes a {type(lg).__name__}, which has no "
                              "log(step, row) / rewind(last_step) / close(): see "
                              "looprl.trainer.loggers.MetricLogger")
        out.append(lg)
    return Loggers(out)
