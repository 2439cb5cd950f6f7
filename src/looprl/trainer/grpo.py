"""Asynchronous single-epoch GRPO: rollouts keep producing groups while the trainer steps.

    loop = GRPOLoop(step, engine, runner, sampler, LoopConfig(), store=store, run_dir=run_dir)
    summary = await loop.run()

Rollout workers (``RolloutRunner``) put scored groups into a bounded queue; the trainer takes
``groups_per_step`` of them, steps once (single epoch: the sampler walks the task set once, so no
task is trained on twice), publishes the new weights to the ``WeightStore`` and hands them to the
engine, which applies them between decode steps — trajectories in flight continue on the new
version, and every token records the version that sampled it. Groups whose oldest token lags the
trainer by more than ``max_staleness`` versions are dropped and counted, their task handed out
once more (it was never trained on); zero-variance groups are
skipped and counted; infra-failed trajectories never reach here (the runner drops them).

Resume: ``loop.resume()`` loads the newest checkpoint under ``run_dir/ckpt`` (model, optimizer,
RNGs, weight version and the ids of the tasks already trained); ``run`` then hands those weights to
the engine first. A killed run's groups after its last checkpoint never reached the saved weights,
so their tasks are sampled again: no group is lost and none is trained twice into one model.

``sync=True`` runs the same code synchronously (generate a step's groups, then train), the
baseline for ``benchmarks/async.py``. Per-step metrics go to ``metrics.jsonl`` and TensorBoard;
``reward_curve.png`` is written at the end.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprl.protocols import Engine, WeightStore
from looprl.rewards.composite import reward_metrics
from looprl.rollout.runner import GroupResult, RolloutRunner
from looprl.trainer.batch import passed_tests
from looprl.trainer.checkpoint import Resumed, latest_checkpoint, load_checkpoint, save_checkpoint
from looprl.trainer.step import GRPOStep
from looprl.types import Group, Task


@dataclass(frozen=True)
class LoopConfig:
    """The asynchronous loop's knobs (the step's live in ``GRPOConfig``)."""

    groups_per_step: int = 4
    """Groups (tasks) per optimizer step."""
    max_staleness: int = 2
    """Drop a group whose oldest token was sampled more than this many versions ago."""
    queue_size: int = 8
    """Scored groups waiting for the trainer; producers block beyond it (bounds policy lag).
    When the trainer is the slower side the queue stays full and a group waits
    ``queue_size / groups_per_step`` steps before it is trained on: keep that under
    ``max_staleness`` or finished groups go stale in the queue."""
    max_steps: int = 1_000
    max_minutes: float = 30.0
    """Wall-clock budget of the loop; it stops after the step that crosses it."""
    sync: bool = False
    """Synchronous baseline: roll out a step's groups, then train, then roll out again."""
    checkpoint_every: int = 0
    """Steps between checkpoints (0 = only at the end)."""
    seed: int = 0
    """Shuffles the task order (single epoch)."""


class TaskSampler:
    """Walks the task set once in a seeded order; remembers what was trained so a resumed run
    neither loses nor repeats a task. A task whose group was dropped untrained (stale) can be
    handed out once more (``requeue``): it was never trained on, and tasks are the scarce thing."""

    def __init__(self, tasks: Sequence[Task], seed: int = 0, trained: Sequence[str] = ()):
        self.tasks = list(tasks)
        random.Random(seed).shuffle(self.tasks)
        self.trained: set[str] = set(trained)
        self.issued = 0
        self._again: deque[Task] = deque()
        self._requeued: set[str] = set()

    def __iter__(self) -> Iterator[Task]:
        fresh = iter(self.tasks)
        while True:
            t = self._again.popleft() if self._again else next(fresh, None)
            if t is None:
                return
            if t.id not in self.trained:
                self.issued += 1
                yield t

    def requeue(self, task: Task) -> bool:
        """Hand ``task`` out again, next (once per task); False if it was requeued before or
        trained since.

        >>> from looprl.types import Grader
        >>> s = TaskSampler([Task(i, "/r", "p", Grader("pytest")) for i in "ab"])
        >>> it = iter(s); first = next(it)
        >>> s.requeue(first), s.requeue(first), next(it) is first
        (True, False, True)
        """
        if task.id in self._requeued or task.id in self.trained:
            return False
        self._requeued.add(task.id)
        self._again.append(task)
        return True

    def mark_trained(self, task_ids: Sequence[str]) -> None:
        self.trained.update(task_ids)

    def state_dict(self) -> dict[str, Any]:
        return {"trained": sorted(self.trained)}


@dataclass
class LoopStats:
    steps: int = 0
    groups_trained: int = 0
    groups_stale: int = 0
    groups_requeued: int = 0
    """Stale groups whose task was handed out again (``TaskSampler.requeue``)."""
    groups_dropped: int = 0
    zero_variance_groups: int = 0
    trainer_busy_s: float = 0.0
    trainer_idle_s: float = 0.0
    rollout_tokens: int = 0
    train_tokens: int = 0
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def idle_fraction(self) -> float:
        total = self.trainer_busy_s + self.trainer_idle_s
        return self.trainer_idle_s / total if total else 0.0


class GRPOLoop:
    """Owns one training run's async loop; see the module docstring."""

    def __init__(self, step: GRPOStep, engine: Engine, runner: RolloutRunner, sampler: TaskSampler,
                 cfg: LoopConfig, *, store: WeightStore | None = None, run_dir: Path | None = None,
                 start_version: int = 0, config_to_save: Any = None):
        self.step, self.engine, self.runner, self.sampler, self.cfg = step, engine, runner, sampler, cfg
        self.store = store
        self.run_dir = Path(run_dir) if run_dir else None
        self.version = start_version
        self.stats = LoopStats()
        self.config_to_save = config_to_save
        self._resumed: Resumed | None = None
        self._writer = None
        if self.run_dir:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._writer = SummaryWriter(str(self.run_dir / "tb"))
            except ImportError:  # tensorboard is optional for library users
                self._writer = None

    def resume(self, ckpt_root: Path | None = None) -> Resumed | None:
        """Continue from the newest complete checkpoint (default ``run_dir/ckpt``); None if there
        is none. Metrics rows logged after that checkpoint (steps whose weights were lost) are
        dropped from ``metrics.jsonl``, so the log and the curve describe the resumed model."""
        root = Path(ckpt_root) if ckpt_root else (self.run_dir / "ckpt" if self.run_dir else None)
        path = latest_checkpoint(root) if root else None
        if path is None:
            return None
        r = load_checkpoint(path, self.step.model, self.step.optimizer)
        self.sampler.mark_trained(r.sampler_state.get("trained", []))
        self.version = int(r.weight_version if r.weight_version is not None else r.step)
        self.stats.steps = r.step
        self._resumed = r
        if self.run_dir and (self.run_dir / "metrics.jsonl").exists():
            rows = [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()
                    if line.strip()]
            kept = [row for row in rows if int(row.get("step", 0)) <= r.step]
            self.stats.history = kept
            (self.run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in kept))
        return r

    async def run(self, progress: Any = None) -> LoopStats:
        """Train until the task set is exhausted, ``max_steps`` or ``max_minutes``."""
        self._t0 = time.monotonic()
        if self._resumed is not None:  # the engine samples from the resumed weights
            state = {k: v.detach().clone() for k, v in self.step.model.state_dict().items()}
            await self.engine.update_weights(state, self.version)
        if self.cfg.sync:
            await self._run_sync(progress)
        else:
            await self._run_async(progress)
        self._finish()
        return self.stats

    def _out_of_budget(self) -> bool:
        return (self.stats.steps >= self.cfg.max_steps
                or time.monotonic() - self._t0 > 60 * self.cfg.max_minutes)

    async def _run_async(self, progress: Any) -> None:
        queue: asyncio.Queue[GroupResult] = asyncio.Queue(maxsize=self.cfg.queue_size)
        exhausted = asyncio.Event()

        async def produce() -> None:
            try:
                # Finished groups wait in ``queue``, not in the runner: it admits no new group
                # while one it finished is still untaken, so the queue bounds the policy lag.
                async for result in self.runner.run(iter(self.sampler), max_ready=1):
                    await queue.put(result)
            finally:
                exhausted.set()

        producer = asyncio.create_task(produce())
        try:
            while not self._out_of_budget():
                groups = await self._take(queue, exhausted, producer)
                if not groups:
                    break
                await self._train(groups, progress)
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)

    async def _take(self, queue: asyncio.Queue[GroupResult], exhausted: asyncio.Event,
                    producer: asyncio.Task[None]) -> list[Group]:
        groups: list[Group] = []
        t0 = time.monotonic()
        while len(groups) < self.cfg.groups_per_step:
            if exhausted.is_set() and queue.empty():
                if producer.done() and producer.exception():
                    raise producer.exception()  # type: ignore[misc]
                break
            try:
                result = await asyncio.wait_for(queue.get(), timeout=0.1)
            except asyncio.TimeoutError:
                continue
            group = self._admit(result)
            if group is not None:
                groups.append(group)
        self.stats.trainer_idle_s += time.monotonic() - t0
        return groups

    def _admit(self, result: GroupResult) -> Group | None:
        if result.group is None:
            self.stats.groups_dropped += 1
            return None
        oldest = int(result.group.metadata.get("min_policy_version", self.version) or 0)
        if oldest >= 0 and self.version - oldest > self.cfg.max_staleness:
            self.stats.groups_stale += 1
            self.stats.groups_requeued += self.sampler.requeue(result.task)
            return None
        return result.group

    async def _run_sync(self, progress: Any) -> None:
        tasks = iter(self.sampler)
        while not self._out_of_budget():
            batch = [t for _, t in zip(range(self.cfg.groups_per_step), tasks, strict=False)]
            if not batch:
                break
            t0 = time.monotonic()
            groups = [g for r in [r async for r in self.runner.run(batch)]
                      if (g := self._admit(r)) is not None]
            self.stats.trainer_idle_s += time.monotonic() - t0
            if groups:
                await self._train(groups, progress)

    async def _train(self, groups: list[Group], progress: Any) -> None:
        t0 = time.monotonic()
        metrics = await asyncio.to_thread(self.step.on_groups, groups, current_version=self.version)
        self.version += 1
        state = {k: v.detach().clone() for k, v in self.step.model.state_dict().items()}
        publish_s = 0.0
        if self.store is not None:
            tp = time.monotonic()
            await asyncio.to_thread(self.store.publish, state, self.version)
            publish_s = time.monotonic() - tp
        await self.engine.update_weights(state, self.version)
        self.sampler.mark_trained([g.task_id for g in groups])
        self.stats.trainer_busy_s += time.monotonic() - t0
        self.stats.steps += 1
        self.stats.groups_trained += len(groups)
        self.stats.zero_variance_groups += metrics.zero_variance_groups
        self.stats.train_tokens += metrics.tokens
        self._log(groups, metrics.to_dict(), publish_s)
        if progress is not None:
            progress(self.stats)
        if self.cfg.checkpoint_every and self.stats.steps % self.cfg.checkpoint_every == 0:
            self.checkpoint()

    def _log(self, groups: list[Group], step_metrics: dict[str, float], publish_s: float) -> None:
        trajs = [t for g in groups for t in g.trajectories]
        rollout_tokens = sum(t.counters.output_tokens for t in trajs)
        self.stats.rollout_tokens += rollout_tokens
        elapsed = time.monotonic() - self._t0
        row = {
            "step": self.stats.steps, "version": self.version, "elapsed_s": round(elapsed, 2),
            "tasks": [g.task_id for g in groups],
            **{f"train/{k}": v for k, v in step_metrics.items()},
            **reward_metrics(trajs),
            "rollout/pass_rate": sum(passed_tests(t) for t in trajs) / max(len(trajs), 1),
            "rollout/tokens_per_s": self.stats.rollout_tokens / max(elapsed, 1e-9),
            "train/tokens_per_s": self.stats.train_tokens / max(self.stats.trainer_busy_s, 1e-9),
            "loop/trainer_idle_fraction": self.stats.idle_fraction,
            "loop/groups_stale": self.stats.groups_stale,
            "loop/groups_requeued": self.stats.groups_requeued,
            "loop/groups_dropped": self.stats.groups_dropped,
            "loop/publish_s": publish_s,
            "runner/infra_errors": self.runner.stats.infra_errors,
        }
        self.stats.history.append(row)
        if self.run_dir:
            with open(self.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
        if self._writer is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._writer.add_scalar(k, v, self.stats.steps)

    def checkpoint(self) -> Path | None:
        if not self.run_dir:
            return None
        return save_checkpoint(self.run_dir / "ckpt", self.stats.steps, self.step.model,
                               self.step.optimizer, sampler_state=self.sampler.state_dict(),
                               weight_version=self.version, config=self.config_to_save)

    def _finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self.run_dir and self.stats.history:
            plot_curves(self.stats.history, self.run_dir / "reward_curve.png")


def plot_curves(history: list[dict[str, float]], path: Path) -> Path:
    """Reward, pass rate and KL per step in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, title in ((axes[0], "reward/total_mean", "mean reward"),
                           (axes[1], "rollout/pass_rate", "pass rate (hidden tests)"),
                           (axes[2], "train/is_ratio_mean", "IS ratio trainer/engine (mean)")):
        ys = [h.get(key, float("nan")) for h in history]
        ax.plot(steps, ys, marker="o", ms=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
