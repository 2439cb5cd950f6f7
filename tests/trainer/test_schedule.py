"""The loop's schedules (``LoopExperimental.schedule``): sync never lets the engine decode during a
train step and async does (read from the real torch engine's busy time, which the loop records
per step); auto keeps sync where overlap costs more than it hides and async where it is free,
trains every task once across the switch, and says what it measured in its rows."""

import asyncio
import dataclasses
import time

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.errors import ConfigError
from looprl.inference import TorchEngine
from looprl.models.tokenizer import build_tokenizer
from looprl.trainer import grpo
from looprl.trainer.config import GRPOConfig, GRPOExperimental, LoopConfig, LoopExperimental
from looprl.trainer.grpo import GRPOLoop
from looprl.trainer.losses import LossParams
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOStep
from looprl.types import Grader, Group, GroupResult, SamplingParams, Segment, Task, Trajectory
from tests.trainer.helpers import group, segment, tiny_llama, trajectory

CFG = GRPOConfig(lr=1e-3, experimental=GRPOExperimental(objective=LossParams(norm_tokens=8)))
TICK = 0.005
_END = object()


def _tasks(n: int) -> list[Task]:
    return [Task(f"t{i}", "/r", "p", Grader("pytest")) for i in range(n)]


async def _concurrently(tasks, one, in_flight: int, max_ready: int | None):
    """``one(task)`` for up to ``in_flight`` tasks at once, results in completion order, no new
    task while ``max_ready`` results wait (the runner's admission, in brief)."""
    done: asyncio.Queue = asyncio.Queue()
    running: set[asyncio.Task] = set()
    it, drawn_all = iter(tasks), False

    async def put(task):
        try:
            await done.put(await one(task))
        except BaseException as e:  # noqa: BLE001 — raised to the consumer below
            await done.put(e)

    try:
        while True:
            while not drawn_all and len(running) < in_flight and (
                    max_ready is None or done.qsize() < max_ready):
                task = next(it, _END)
                if task is _END:
                    drawn_all = True
                elif task is None:
                    break
                else:
                    t = asyncio.create_task(put(task))
                    running.add(t)
                    t.add_done_callback(running.discard)
            if drawn_all and not running and done.empty():
                return
            try:
                item = await asyncio.wait_for(done.get(), timeout=0.01)
            except asyncio.TimeoutError:
                continue
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        for t in running:
            t.cancel()


def _group_of(task: Task, trajs: list[Trajectory], oldest: int) -> GroupResult:
    return GroupResult(task, Group(task.id, task.id, tuple(trajs), {"min_policy_version": oldest}))


# -- sync vs async on the real engine -------------------------------------------------------------

class EngineSource:
    """``GroupSource``: each group is two generations of a real ``TorchEngine`` (no harness or
    sandbox: what is tested is when the engine decodes)."""

    def __init__(self, engine: TorchEngine, tokens: int):
        self.engine, self.tokens = engine, tokens

    async def run(self, tasks, *, max_ready=None):
        async def one(task: Task) -> GroupResult:
            prompt = [5, 6, 7]
            gens = await asyncio.gather(*(self.engine.generate(
                prompt, SamplingParams(max_new_tokens=self.tokens, seed=i)) for i in range(2)))
            trajs = [trajectory([Segment(tuple(prompt + list(g.token_ids)),
                                         (0.0,) * 3 + tuple(g.logprobs), (0,) * 3 + (1,) * len(g.token_ids),
                                         (-1,) * 3 + tuple(g.policy_versions))], float(i), task.id)
                     for i, g in enumerate(gens)]
            trajs = [dataclasses.replace(t, task_id=task.id) for t in trajs]
            return _group_of(task, trajs, min(min(g.policy_versions) for g in gens))

        async for r in _concurrently(tasks, one, in_flight=3, max_ready=max_ready):
            yield r


def _llama(tok):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512))


@pytest.mark.parametrize("schedule", ["sync", "async"])
def test_sync_never_decodes_during_a_train_step_and_async_does(schedule):
    tok = build_tokenizer(None)
    model = _llama(tok)
    engine = TorchEngine(_llama(tok), tok, max_len=512, stop_on_eos=False)
    loop = GRPOLoop(GRPOStep(model, CFG, pad_id=tok.pad_token_id), engine,
                    EngineSource(engine, tokens=24), TaskSampler(_tasks(4)),
                    LoopConfig(groups_per_step=1, max_steps=4, loggers=(), experimental=LoopExperimental(
                        schedule=schedule, queue_size=1, max_staleness=100)))
    try:
        stats = asyncio.run(loop.run())
    finally:
        engine.close()
    rows = stats.history
    assert stats.steps == 4 and {r["loop/schedule"] for r in rows} == {schedule}
    overlap = [r["loop/overlap_s"] for r in rows]
    if schedule == "sync":
        assert overlap == [0.0] * 4, "the engine decoded while the trainer stepped"
    else:
        assert sum(overlap) > 0, "async never decoded during a step"
    for r in rows:  # the step's wall time, split both ways
        assert r["loop/trainer_busy_s"] + r["loop/trainer_idle_s"] == pytest.approx(
            r["loop/step_s"], rel=0.02, abs=0.05)  # less the budget checks between them
        assert r["loop/engine_busy_s"] + r["loop/engine_idle_s"] >= r["loop/step_s"] - 1e-6
    assert sum(r["loop/engine_busy_s"] for r in rows) > 0


# -- auto's decision ------------------------------------------------------------------------------

class Contention:
    """Work that runs at ``1 / slowdown`` speed while the other side is working too: ``slowdown
    = 1`` makes overlap free, more makes it cost more than it hides (cores two jobs share)."""

    def __init__(self, slowdown: float, work_s: float = 0.06):
        self.slowdown, self.work_s = slowdown, work_s
        self.active = {"train": 0, "rollout": 0}

    def _rate(self, side: str) -> float:
        other = "rollout" if side == "train" else "train"
        return 1 / self.slowdown if self.active[other] else 1.0

    def train(self) -> None:  # in the step's worker thread
        self.active["train"] += 1
        try:
            done = 0.0
            while done < self.work_s:
                time.sleep(TICK)
                done += TICK * self._rate("train")
        finally:
            self.active["train"] -= 1

    async def rollout(self) -> None:
        self.active["rollout"] += 1
        try:
            done = 0.0
            while done < self.work_s:
                await asyncio.sleep(TICK)
                done += TICK * self._rate("rollout")
        finally:
            self.active["rollout"] -= 1


class ContendedSource:
    """``GroupSource`` whose groups take ``Contention`` work each."""

    def __init__(self, contention: Contention):
        self.contention = contention

    async def run(self, tasks, *, max_ready=None):
        async def one(task: Task) -> GroupResult:
            await self.contention.rollout()
            g = group([trajectory([segment([1, 2], [3, 4])], 1.0, task.id),
                       trajectory([segment([1, 2], [5, 6])], 0.0, task.id)], task.id)
            trajs = [dataclasses.replace(t, task_id=task.id) for t in g.trajectories]
            return _group_of(task, trajs, 0)

        async for r in _concurrently(tasks, one, in_flight=2, max_ready=max_ready):
            yield r


class ContendedStep(GRPOStep):
    """The real step, after ``Contention`` work."""

    def __init__(self, *args, contention: Contention, **kwargs):
        super().__init__(*args, **kwargs)
        self.contention = contention

    def on_groups(self, groups, *, current_version=None):
        self.contention.train()
        return super().on_groups(groups, current_version=current_version)


class Sink:
    async def update_weights(self, state_dict, version):
        pass


def _auto(slowdown: float, n_tasks: int = 12) -> GRPOLoop:
    c = Contention(slowdown)
    loop = GRPOLoop(ContendedStep(tiny_llama(), CFG, pad_id=0, contention=c), Sink(),
                    ContendedSource(c), TaskSampler(_tasks(n_tasks)),
                    LoopConfig(groups_per_step=1, loggers=(), experimental=LoopExperimental(
                        schedule="auto", schedule_probe_steps=2, queue_size=2, max_staleness=100)))
    asyncio.run(loop.run())
    return loop


def _idle_cores(monkeypatch, cores: float) -> None:
    """This machine's idle cores as ``auto`` reads them: a constant, not the other jobs' load."""
    t0 = time.monotonic()
    monkeypatch.setattr(grpo, "idle_core_s", lambda: cores * (time.monotonic() - t0))


@pytest.mark.parametrize(("slowdown", "kept"), [(4.0, "sync"), (1.0, "async")])
def test_auto_keeps_sync_when_overlap_is_costly_and_async_when_it_is_free(monkeypatch, slowdown,
                                                                         kept):
    _idle_cores(monkeypatch, 8.0)
    loop = _auto(slowdown)
    rows = loop.stats.history
    # 1 + 2 steps sync, 1 + 2 async, then the faster to the end of the tasks
    assert [r["loop/schedule"] for r in rows] == ["sync"] * 3 + ["async"] * 3 + [kept] * 6
    assert loop.stats.schedule == kept
    decisions = [r["loop/schedule_decision"] for r in rows if "loop/schedule_decision" in r]
    assert len(decisions) == 1 and decisions[0].endswith(f"keeping {kept}")
    assert decisions == [loop.stats.schedule_decision]
    # across the switch (and the groups left in flight) every task is trained, once
    assert sorted(loop.sampler.trained) == sorted(t.id for t in _tasks(12))
    assert set(loop.sampler.trained.values()) == {1}


def test_auto_keeps_sync_without_trying_async_when_no_core_is_idle(monkeypatch):
    _idle_cores(monkeypatch, 0.0)
    loop = _auto(1.0)  # async would win, but the sync steps left it nothing to use
    assert {r["loop/schedule"] for r in loop.stats.history} == {"sync"}
    assert "no cycles to use; keeping sync" in loop.stats.schedule_decision
    assert loop.stats.steps == 12


def test_the_retired_sync_switch_names_its_replacement():
    from looprl.config import from_dict

    with pytest.raises(ConfigError, match="schedule"):
        from_dict(LoopConfig, {"experimental": {"sync": True}})
