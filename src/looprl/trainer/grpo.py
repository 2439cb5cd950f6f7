"""Asynchronous single-epoch GRPO: rollouts keep producing groups while the trainer steps.

    loop = GRPOLoop(step, engine, runner, sampler, LoopConfig(), store=store, run_dir=run_dir)
    summary = await loop.run()

A ``GroupSource`` (``looprl.rollout``'s runner, in process or over a Ray fleet) puts scored groups
into a bounded queue; the trainer takes
``groups_per_step`` of them, steps once (single epoch: every batch of rollouts is stepped on once;
the sampler walks the task set ``passes`` times, so no task is trained on twice within a pass),
publishes the new weights to the ``WeightStore`` and hands them to the
engine, which applies them between decode steps — trajectories in flight continue on the new
version, and every token records the version that sampled it. Groups whose oldest token lags the
trainer by more than ``max_staleness`` versions are dropped and counted, their task handed out
once more (it was never trained on); zero-variance groups are
skipped and counted; infra-failed trajectories never reach here (the runner drops them), and a
group that too few survived is handed out once more like a stale one. Each row logs the run's
infrastructure failures by class (``infra``: ``looprl.faults.InfraLedger``). A group
the runner's difficulty screen stopped (``RolloutConfig.screen``: none of its first rollouts
passed) takes no place in the queue: its task waits and is handed out again once the fresh tasks
run out (``TaskSampler.defer``), to a policy that may solve it by then.

Resume (exact at any kill point, including ``kill -9`` during a publish or a checkpoint write)::

    loop = GRPOLoop(step, engine, runner, sampler, cfg, store=store, run_dir=run_dir)
    resumed = loop.resume()       # before run(); None: no checkpoint, a fresh start
    stats = await loop.run()

The checkpoint is the source of truth. ``resume()`` loads the newest complete checkpoint under
``run_dir/ckpt`` (model, optimizer, RNGs, step, weight version, the ids of the tasks trained into
those weights), then rolls the store back to that version (``WeightStore.rollback``): versions
published after it — by steps whose weights the checkpoint never saw, with ``checkpoint_every >
1`` or a kill between a publish and its checkpoint — are removed (``resumed.discarded_versions``),
and the checkpoint's version is republished if the store lost or damaged it. Store and checkpoint
then hold one version; ``run`` hands those weights to the engine before any rollout, so every
resumed token is sampled from them, and the next publish is version + 1. Without a checkpoint the
store is rolled back to the start version. ``metrics.jsonl`` and TensorBoard drop the rows of
the lost steps (``MetricLogger.rewind``), so they describe the resumed model. The lost steps' tasks are not in the
checkpoint's trained set, so they are sampled again: no task is lost, and none is trained twice
into one model. A fresh run (no ``resume()``) into a store that already holds newer versions is
refused before it trains (resume it, or give it an empty store).

Under torchrun (``GRPOStep(..., dist=...)``) every rank runs this loop with its own engine and
runner on its own share of the tasks, and takes ``groups_per_step / world_size`` groups a step;
the step all-reduces gradients (``trainer.ddp``), so ranks may bring different numbers of groups
(a rank that has run out of tasks trains on padding). Rank 0's clock decides when the budget is
spent; the loop ends when no rank has a group left. Every rank learns which tasks the step
trained (they join every sampler's trained set, so rank 0's checkpoint holds them all) and its
engine takes the new weights; rank 0 alone publishes, checkpoints and writes the log, about all
ranks' groups. Pass the weight store to rank 0 only, and the same ``run_dir`` to every rank: all
of them resume from its checkpoint.

The schedule (``LoopExperimental.schedule``): ``async`` as above; ``sync`` runs the same code
synchronously (roll out a step's groups, then train: the engine never decodes during a step);
``auto``, the default, measures which is faster on this run and keeps it. Overlap hides the
shorter of rollout and training only where the two do not contend: with rollouts on their own
cores or nodes async wins, but on one small machine the decode thread and the trainer share its
cores, caches and the GIL, and overlap can cost more than it hides (``benchmarks/async.py``,
``docs/experiments.md``). Which case a run is in depends on the machine, its other load and the
model, so ``auto`` measures it. It runs ``schedule_probe_steps`` steps sync (after one unmeasured
warm-up step) and reads how many of the machine's cores those steps left idle (``/proc/stat``,
other jobs' load included): overlap can only use cycles the sync schedule leaves unused, so
under ``MIN_SPARE_CORES`` it keeps sync without trying async (a probe that would cost more than
it could find). Otherwise it runs as many steps async (after one that fills the pipeline) and
keeps the schedule whose steps took less wall time (median; a tie goes to sync, whose groups are
never stale). The decision is logged in one line and in the next row
(``loop/schedule_decision``). Leaving async, the groups already in flight finish and are trained
first; none is lost. Every row says the schedule in use and the step's trainer and engine
busy/idle seconds (``_log``).

Per-step metrics go to ``metrics.jsonl`` and the trackers of
``LoopConfig.loggers`` (``looprl.trainer.loggers``: TensorBoard, W&B, plugins); ``looprl
train`` draws them in its report once the loop ends (``looprl.train.plots``). Which task comes
next is the ``TaskSampler``'s (``trainer.sampler``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from looprl.errors import WeightStoreError
from looprl.faults import InfraLedger
from looprl.protocols import GroupSource, WeightSink, WeightStore
from looprl.rundir import RunDir
from looprl.trainer import ddp
from looprl.trainer.checkpoint import Resumed, latest_checkpoint
from looprl.trainer.config import LoopConfig
from looprl.trainer.loggers import Loggers, make_loggers, read_metrics
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOStep
from looprl.types import Group, GroupResult, Task, Trajectory

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass
class LoopStats:
    steps: int = 0
    groups_trained: int = 0
    groups_stale: int = 0
    groups_requeued: int = 0
    """Stale groups, and groups infrastructure failures emptied, whose task was handed out
    again (``TaskSampler.requeue``)."""
    groups_dropped: int = 0
    groups_screened_out: int = 0
    """Groups stopped after the screen (``rollout.experimental.screen``): no screen trajectory passed."""
    screen_rollouts: int = 0
    """Trajectories those screens ran (the rollouts the screen did not save)."""
    zero_variance_groups: int = 0
    infra_errors: int = 0
    """Rollout attempts lost to infrastructure failures in the groups handed back so far."""
    trainer_busy_s: float = 0.0
    trainer_idle_s: float = 0.0
    rollout_tokens: int = 0
    train_tokens: int = 0
    schedule: str = ""
    """The schedule in use (``sync`` or ``async``; ``auto`` starts on sync)."""
    schedule_decision: str = ""
    """What ``auto`` measured and kept, one line (empty before it decides, or without ``auto``)."""
    history: list[dict[str, Any]] = field(default_factory=list)  # rows: metrics and task ids

    @property
    def idle_fraction(self) -> float:
        total = self.trainer_busy_s + self.trainer_idle_s
        return self.trainer_idle_s / total if total else 0.0


BatchMetrics = Callable[[list[Trajectory]], dict[str, float]]
"""A step's trajectories -> metrics logged in its row (``looprl.rewards.reward_metrics``: each
reward term's mean, broken-call and monitor rates), wired by the composition root."""


class GRPOLoop:
    """Owns one training run's async loop; see the module docstring."""

    def __init__(self, step: GRPOStep, engine: WeightSink, runner: GroupSource,
                 sampler: TaskSampler, cfg: LoopConfig, *, store: WeightStore | None = None,
                 run_dir: Path | None = None, start_version: int = 0, config_to_save: Any = None,
                 batch_metrics: BatchMetrics | None = None, infra: InfraLedger | None = None,
                 push_start: bool = False):
        self.step, self.engine, self.runner, self.sampler, self.cfg = step, engine, runner, sampler, cfg
        self.batch_metrics = batch_metrics
        self.infra = infra
        """The run's infrastructure failures by class (``looprl.faults``): each row logs them."""
        self.push_start = push_start
        """The engine did not load this loop's starting weights (a server started apart from the
        run): they are pushed to it, as ``start_version``, before the first rollout."""
        sampler.waits = True  # every task taken comes back through _admit: none left behind
        self.store = store
        self._ckpt_root = RunDir(run_dir).ckpt if run_dir else None
        # the log and the trackers are rank 0's (about every rank's groups)
        self.run_dir = Path(run_dir) if run_dir and self.dist.is_main else None
        self.version = start_version
        self.stats = LoopStats()
        self.config_to_save = config_to_save
        self._resumed: Resumed | None = None
        self._loggers: Loggers | None = None
        self._mark = 0.0
        """When the last step ended (the next one's wall time starts there)."""
        self._idle_step_s = 0.0
        """The trainer's wait for groups since the last step."""
        self._engine_busy = 0.0
        """The engine's busy seconds when the last step ended."""
        self._decision: dict[str, Any] = {}
        """``auto``'s decision, for the next row."""
        if self.run_dir:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._loggers = make_loggers(cfg.loggers, self.run_dir, run_name=self.run_dir.name,
                                         config=_as_dict(config_to_save))

    @property
    def dist(self) -> ddp.DistInfo:
        """The ranks this loop runs on (the step's: one process unless under torchrun)."""
        return self.step.sharding.dist

    def resume(self, ckpt_root: Path | None = None) -> Resumed | None:
        """Continue from the newest complete checkpoint (default ``run_dir/ckpt``) and roll the
        store back to its version; None if there is none (the store is then rolled back to the
        start version). Call before ``run``; see the module docstring."""
        root = Path(ckpt_root) if ckpt_root else self._ckpt_root
        # rank 0 picks it (and clears leftovers of interrupted saves); every rank loads it
        path = ddp.broadcast_object(latest_checkpoint(root) if root and self.dist.is_main
                                    else None, self.dist)
        r = None
        if path is not None:
            r = self.step.sharding.load(path, self.step.optimizer)
            self.sampler.load_state_dict(r.sampler_state)
            self.version = int(r.weight_version if r.weight_version is not None else r.step)
            self.stats.steps = r.step
        weights = self._weights() if r is not None else None  # a collective under FSDP
        if self.store is not None:
            discarded = tuple(self.store.rollback(self.version, weights))
            r = dataclasses.replace(r, discarded_versions=discarded) if r is not None else None
        self._resumed = r
        self._trim_metrics(self.stats.steps)
        if r is not None:
            self._restore_counts()
        return r

    def _restore_counts(self) -> None:
        """A resumed loop's counters continue from the kept steps' rows, so its rows and the
        report count the whole run, not only the part since the resume."""
        rows, s = self.stats.history, self.stats
        if not rows:
            return
        s.groups_trained = sum(len(row.get("tasks", ())) for row in rows)
        s.zero_variance_groups = sum(int(row.get("train/zero_variance_groups", 0)) for row in rows)
        last = rows[-1]
        for name, key in (("groups_stale", "loop/groups_stale"),
                          ("groups_requeued", "loop/groups_requeued"),
                          ("groups_dropped", "loop/groups_dropped"),
                          ("groups_screened_out", "loop/groups_screened_out"),
                          ("screen_rollouts", "loop/screen_rollouts"),
                          ("infra_errors", "runner/infra_errors")):
            setattr(s, name, int(last.get(key, 0)))

    @property
    def kept_s(self) -> float:
        """RL time the steps kept from earlier lives took (0 unless resumed); a resumed run's
        clock and budget continue from it. Read before ``run``, which logs new rows."""
        return float(self.stats.history[-1].get("elapsed_s", 0.0)) \
            if self._resumed is not None and self.stats.history else 0.0

    def _trim_metrics(self, last_step: int) -> None:
        """Keep the metrics rows of steps up to ``last_step`` (the others' weights were lost);
        a row cut short by a kill is dropped. Rewritten atomically."""
        if self.run_dir is None:
            return
        self.stats.history = read_metrics(RunDir(self.run_dir).metrics, last_step)
        if self._loggers is not None:
            self._loggers.rewind(last_step)
        trajs = RunDir(self.run_dir).train_trajectories
        if trajs.exists():  # the lost steps' trajectories go with their metrics rows
            kept = [line for line in trajs.read_text(encoding="utf-8").splitlines()
                    if _train_step(line) <= last_step]
            tmp = trajs.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(tmp, trajs)

    def _weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.step.sharding.state_dict().items()}

    async def run(self, progress: Any = None) -> LoopStats:
        """Train until the task set is exhausted, ``max_steps`` or ``max_minutes`` (a resumed
        run's budget counts the time its kept steps took before the stop)."""
        self._t0 = time.monotonic() - self.kept_s
        ddp.per_rank(self.cfg.groups_per_step, self.dist, "loop.groups_per_step")
        latest = self.store.latest() if self.store is not None else None
        if latest is not None and latest > self.version:
            raise WeightStoreError(
                f"the weight store already holds version {latest}, beyond this run's {self.version}: "
                "resume the run that published it (loop.resume(), --resume) or use an empty store")
        if self._resumed is not None or self.push_start:  # the engine samples from these weights
            await self.engine.update_weights(self._weights(), self.version)
        tasks = iter(self.sampler)  # one walk, whichever schedule draws from it
        self._mark = time.monotonic()
        self._idle_step_s = 0.0
        self._engine_busy = self._engine_busy_s()
        schedule = self.cfg.experimental.schedule
        self.stats.schedule = "sync" if schedule == "auto" else schedule
        if schedule == "auto":
            await self._run_auto(tasks, progress)
        elif schedule == "sync":
            await self._run_sync(tasks, progress)
        else:
            await self._run_async(tasks, progress)
        self._finish()
        return self.stats

    def _out_of_budget(self) -> bool:
        return (self.stats.steps >= self.cfg.max_steps
                or time.monotonic() - self._t0 > 60 * self.cfg.max_minutes)

    async def _stop(self) -> bool:
        """Out of budget (rank 0's clock decides for every rank)."""
        return await self._broadcast(self._out_of_budget())

    async def _any_rank(self, items: Sequence[Any]) -> bool:
        """Whether some rank has ``items``; in a thread, so this rank's rollouts go on while it
        waits for the others."""
        return await asyncio.to_thread(ddp.any_rank, bool(items), self.dist)

    @property
    def _per_rank(self) -> int:
        return ddp.per_rank(self.cfg.groups_per_step, self.dist, "loop.groups_per_step")

    async def _run_auto(self, tasks: Iterator[Task | None], progress: Any) -> None:
        """Time the sync schedule, then (if the machine had cycles to spare) the async one, and
        keep the faster (module docstring)."""
        n = self.cfg.experimental.schedule_probe_steps
        if len(await self._run_sync(tasks, progress, steps=1)) < 1:  # warms up, unmeasured
            return
        idle0, t0 = idle_core_s(), time.monotonic()
        sync_s = await self._run_sync(tasks, progress, steps=n)
        if len(sync_s) < n:  # the budget or the tasks ran out while probing
            return
        idle1 = idle_core_s()
        spare = ((idle1 - idle0) / max(time.monotonic() - t0, 1e-9)
                 if idle0 is not None and idle1 is not None else math.inf)
        if await self._broadcast(spare < MIN_SPARE_CORES):
            self._decided("sync", f"schedule auto: the sync steps left {spare:.2f} cores of this "
                          f"machine idle (under {MIN_SPARE_CORES}): overlap has no cycles to use; "
                          f"keeping sync ({statistics.median(sync_s):.2f} s/step)")
            await self._run_sync(tasks, progress)
            return
        self.stats.schedule = "async"
        carry = await self._run_async(tasks, progress, probe=sync_s)
        if carry is not None:
            await self._run_sync(tasks, progress, carry=carry)

    async def _run_async(self, tasks: Iterator[Task | None], progress: Any,
                         probe: list[float] | None = None) -> list[GroupResult] | None:
        """Overlap rollouts with training. With ``probe`` (the sync schedule's step times),
        decide after as many async steps (and one more) which schedule to keep; if sync, stop
        handing out tasks, let the groups in flight finish and return them (None: stayed async
        to the end)."""
        queue: asyncio.Queue[GroupResult] = asyncio.Queue(maxsize=self.cfg.experimental.queue_size)
        exhausted, closed = asyncio.Event(), asyncio.Event()

        async def produce() -> None:
            try:
                # Finished groups wait in ``queue``, not in the runner: it admits no new group
                # while one it finished is still untaken, so the queue bounds the policy lag.
                async for result in self.runner.run(_until(tasks, closed), max_ready=1):
                    if result.screened_out:  # nothing to train: never holds a place in the queue
                        self._admit(result)
                    else:
                        await queue.put(result)
            finally:
                exhausted.set()

        producer = asyncio.create_task(produce())
        step_s: list[float] = []
        try:
            while not await self._stop():
                groups = await self._take(queue, exhausted, producer)
                if not await self._any_rank(groups):
                    break
                step_s.append(await self._train(groups, progress))
                if probe is not None and len(step_s) == len(probe) + 1:  # the first fills up
                    if await self._decide(probe, step_s[1:]) == "sync":
                        closed.set()  # the runner finishes what it started, admits nothing new
                        return await self._drain(queue, producer)
                    probe = None
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
        return None

    async def _drain(self, queue: asyncio.Queue[GroupResult],
                     producer: asyncio.Task[None]) -> list[GroupResult]:
        """Every group still in flight or queued, once the producer has finished them."""
        t0, carry = time.monotonic(), []
        while not (producer.done() and queue.empty()):
            try:
                carry.append(await asyncio.wait_for(queue.get(), timeout=0.1))
            except asyncio.TimeoutError:
                continue
        producer.result()  # a rollout failure that ended the producer surfaces here
        self._waited(time.monotonic() - t0)
        return carry

    async def _decide(self, sync_s: list[float], async_s: list[float]) -> str:
        """``auto``'s choice from the probe steps' wall times (rank 0's, for every rank)."""
        choice = await self._broadcast(pick_schedule(sync_s, async_s))
        self._decided(choice, f"schedule auto: sync {statistics.median(sync_s):.2f} s/step, "
                      f"async {statistics.median(async_s):.2f} s/step (median of {len(sync_s)} "
                      f"steps each, after step {self.stats.steps}): keeping {choice}")
        return choice

    def _decided(self, choice: str, why: str) -> None:
        """Keep ``choice``; ``why`` goes to the log, ``LoopStats`` and the next row."""
        self.stats.schedule, self.stats.schedule_decision = choice, why
        self._decision = {"loop/schedule_decision": why}
        log.info(why)

    async def _broadcast(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        return await asyncio.to_thread(ddp.broadcast_object, value, self.dist)

    async def _take(self, queue: asyncio.Queue[GroupResult], exhausted: asyncio.Event,
                    producer: asyncio.Task[None]) -> list[Group]:
        groups: list[Group] = []
        t0 = time.monotonic()
        while len(groups) < self._per_rank:
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
        self._waited(time.monotonic() - t0)
        return groups

    def _waited(self, seconds: float) -> None:
        """The trainer waited ``seconds`` for groups (this step's idle time and the run's)."""
        self.stats.trainer_idle_s += seconds
        self._idle_step_s += seconds

    def _admit(self, result: GroupResult) -> Group | None:
        self.sampler.returned()
        self.stats.infra_errors += result.infra_errors
        if result.screened_out:
            self.stats.groups_screened_out += 1
            self.stats.screen_rollouts += len(result.screened_out)
            self.sampler.defer(result.task)
            return None
        if result.group is None:
            self.stats.groups_dropped += 1
            # infrastructure took the group: its task was never trained, so it goes out again
            self.stats.groups_requeued += self.sampler.requeue(result.task)
            return None
        oldest = int(result.group.metadata.get("min_policy_version", self.version) or 0)
        if oldest >= 0 and self.version - oldest > self.cfg.experimental.max_staleness:
            self.stats.groups_stale += 1
            self.stats.groups_requeued += self.sampler.requeue(result.task)
            return None
        return result.group

    async def _run_sync(self, tasks: Iterator[Task | None], progress: Any, steps: int | None = None,
                        carry: Sequence[GroupResult] = ()) -> list[float]:
        """Roll out a step's groups, then train, ``steps`` times (None: to the end); the groups
        in ``carry`` (left in flight by the async schedule) go first. Returns the steps' wall
        times."""
        left, step_s = list(carry), list[float]()
        while (steps is None or len(step_s) < steps) and not await self._stop():
            t0, groups = time.monotonic(), list[Group]()
            while left and len(groups) < self._per_rank:
                if (g := self._admit(left.pop(0))) is not None:
                    groups.append(g)
            batch = [t for _, t in zip(range(self._per_rank - len(groups)), tasks, strict=False)
                     if t is not None]
            if not await self._any_rank(groups + batch):
                break
            if batch:
                groups += [g for r in [r async for r in self.runner.run(batch)]
                           if (g := self._admit(r)) is not None]
            self._waited(time.monotonic() - t0)
            if await self._any_rank(groups):
                step_s.append(await self._train(groups, progress))
        return step_s

    async def _train(self, groups: list[Group], progress: Any) -> float:
        """Step on ``groups``, publish and hand over the weights, log; returns the step's wall
        time (since the previous step ended: waiting for groups included)."""
        t0, engine0 = time.monotonic(), self._engine_busy_s()
        metrics = await asyncio.to_thread(self.step.on_groups, groups, current_version=self.version)
        overlap_s = self._engine_busy_s() - engine0
        if self.dist.enabled:  # every rank's groups: all are marked trained, rank 0 logs them
            groups = [g for share in await asyncio.to_thread(ddp.gather_objects, groups, self.dist)
                      for g in share]
        self.version += 1
        state = self._weights()
        publish_s = 0.0
        if self.store is not None:
            tp = time.monotonic()
            await asyncio.to_thread(self.store.publish, state, self.version)
            publish_s = time.monotonic() - tp
        await self.engine.update_weights(state, self.version)
        self.sampler.mark_trained([g.task_id for g in groups])
        self.sampler.record(groups)
        now = time.monotonic()
        busy_s, step_s, self._mark = now - t0, now - self._mark, now
        self.stats.trainer_busy_s += busy_s
        self.stats.steps += 1
        self.stats.groups_trained += len(groups)
        self.stats.zero_variance_groups += metrics.zero_variance_groups
        self.stats.train_tokens += metrics.tokens
        engine = self._engine_busy_s()
        engine_s, self._engine_busy = engine - self._engine_busy, engine
        self._log(groups, metrics.to_dict(), publish_s, {
            "loop/step_s": step_s, "loop/trainer_busy_s": busy_s,
            "loop/trainer_idle_s": self._idle_step_s,
            **({"loop/engine_busy_s": engine_s, "loop/engine_idle_s": max(step_s - engine_s, 0.0),
                "loop/overlap_s": overlap_s} if engine else {})})
        self._idle_step_s = 0.0
        if progress is not None:
            progress(self.stats)
        every = self.cfg.experimental.checkpoint_every
        if every and self.stats.steps % every == 0:
            self.checkpoint()
        return step_s

    def _engine_busy_s(self) -> float:
        """The engine's decode-busy seconds so far (``engine/busy_s``; 0 if it reports none)."""
        return self._engine_metrics().get("engine/busy_s", 0.0)

    def _log(self, groups: list[Group], step_metrics: dict[str, float], publish_s: float,
             schedule: dict[str, float]) -> None:
        """One row of ``metrics.jsonl`` and the trackers. ``schedule``: the step's wall time and
        where it went: ``loop/trainer_busy_s`` (step, publish, hand-over), ``loop/trainer_idle_s``
        (waiting for groups), ``loop/engine_busy_s``/``loop/engine_idle_s`` (the engine's decode
        thread, for an engine that reports it) and ``loop/overlap_s`` (engine busy during the
        trainer's step: 0 under the sync schedule)."""
        trajs = [t for g in groups for t in g.trajectories]
        rollout_tokens = sum(t.counters.output_tokens for t in trajs)
        self.stats.rollout_tokens += rollout_tokens
        elapsed = time.monotonic() - self._t0
        row = {
            "step": self.stats.steps, "version": self.version, "elapsed_s": round(elapsed, 2),
            "tasks": [g.task_id for g in groups],
            **{f"train/{k}": v for k, v in step_metrics.items()},
            **(self.batch_metrics(trajs) if self.batch_metrics else {}),
            "rollout/pass_rate": sum(t.passed for t in trajs) / max(len(trajs), 1),
            "rollout/tokens_per_s": self.stats.rollout_tokens / max(elapsed, 1e-9),
            "train/tokens_per_s": self.stats.train_tokens / max(self.stats.trainer_busy_s, 1e-9),
            "loop/trainer_idle_fraction": self.stats.idle_fraction,
            "loop/groups_stale": self.stats.groups_stale,
            "loop/groups_requeued": self.stats.groups_requeued,
            "loop/groups_dropped": self.stats.groups_dropped,
            "loop/groups_screened_out": self.stats.groups_screened_out,
            "loop/screen_rollouts": self.stats.screen_rollouts,
            "loop/pass": self.sampler.passes_begun,
            "loop/publish_s": publish_s,
            "loop/schedule": self.stats.schedule,
            "loop/async": float(self.stats.schedule == "async"),
            **schedule,
            **self._decision,
            "runner/infra_errors": self.stats.infra_errors,
            **self._engine_metrics(),
            # last: the injected process kill (``looprl.faults``) strikes here, books written
            **(self.infra.step_row(self.stats.steps) if self.infra is not None else {}),
        }
        self._decision = {}
        self.stats.history.append(row)
        if self._loggers is not None:
            self._loggers.log(self.stats.steps, row)
        if self.run_dir:
            if self.cfg.experimental.save_trajectories:
                RunDir(self.run_dir).trajectories.mkdir(exist_ok=True)
                with open(RunDir(self.run_dir).train_trajectories, "a", encoding="utf-8") as f:
                    f.writelines(dataclasses.replace(
                        t, metadata={**t.metadata, "train_step": self.stats.steps}).to_json() + "\n"
                        for t in trajs)
                hinted = [t for g in groups for t in g.hinted]
                if hinted:  # targeted feedback's continuations: apart, never counted as rollouts
                    with open(RunDir(self.run_dir).trajectories / "hinted.jsonl", "a",
                              encoding="utf-8") as f:
                        f.writelines(dataclasses.replace(t, metadata={
                            **t.metadata, "train_step": self.stats.steps}).to_json() + "\n"
                            for t in hinted)

    def _engine_metrics(self) -> dict[str, float]:
        """What the engine reports of itself (the torch engine: speculation's acceptance, tokens
        per verify step and share of steps that drafted; decoding counters), finite values only."""
        metrics = getattr(self.engine, "metrics", None)
        if not callable(metrics):
            return {}
        return {k: float(v) for k, v in metrics().items() if math.isfinite(v)}

    def checkpoint(self, keep: int = 3) -> Path | None:
        """Save a checkpoint (every rank calls it; rank 0 writes it and gets its path) and keep
        the newest ``keep``. While the loop runs 3 stay; a finished run keeps 1, all that resume
        reads (saves are atomic: the newest is complete or absent), a model's size less each."""
        if self._ckpt_root is None:
            return None
        return self.step.sharding.save(self._ckpt_root, self.stats.steps, self.step.optimizer,
                                       sampler_state=self.sampler.state_dict(),
                                       weight_version=self.version, config=self.config_to_save,
                                       keep=keep)

    def _finish(self) -> None:
        if self._loggers is not None:
            self._loggers.close()


def pick_schedule(sync_step_s: Sequence[float], async_step_s: Sequence[float]) -> str:
    """The schedule whose probe steps took less wall time (median); a tie goes to sync, whose
    groups are never stale.

    >>> pick_schedule([2.0, 2.2], [1.1, 1.3]), pick_schedule([2.0, 2.2], [4.0, 3.5])
    ('async', 'sync')
    """
    return "async" if statistics.median(async_step_s) < statistics.median(sync_step_s) else "sync"


MIN_SPARE_CORES = 0.25
"""``auto`` tries async only if the sync steps left at least this many cores idle: overlap can
only speed a step up with cycles the sync schedule leaves unused (other jobs' load counts). A
quarter of a core: sync steps that left 0.4-0.5 of two cores idle still ran 1.15x slower than
async (docs/experiments.md, ``benchmarks/async.py``), and on a machine other jobs fill (~0 idle)
async lost; under a quarter, the probe costs more than overlap could find."""


def idle_core_s() -> float | None:
    """Idle core-seconds of this machine so far, every CPU (``/proc/stat``: idle + iowait);
    None where there is no ``/proc/stat`` (then ``auto`` always times both schedules)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _until(tasks: Iterator[Task | None], closed: asyncio.Event) -> Iterator[Task | None]:
    """``tasks`` until ``closed`` is set, checked before each is drawn, so none drawn is lost
    and the rest stay in ``tasks`` for the next schedule."""
    while not closed.is_set():
        try:
            yield next(tasks)
        except StopIteration:
            return


def _as_dict(config: Any) -> dict[str, Any] | None:
    """The config to hand trackers (W&B shows it beside the run)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return config if isinstance(config, dict) else None


def _train_step(line: str) -> int:
    """The ``train_step`` of a saved trajectory line; a line cut short by a kill sorts last."""
    try:
        return int(json.loads(line)["metadata"]["train_step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62
