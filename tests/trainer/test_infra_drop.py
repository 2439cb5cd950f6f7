"""A group that infrastructure failures emptied (the runner dropped it: too few trajectories
survived) was never trained: its task goes out again, so the pass still trains every task once."""

import asyncio
import dataclasses

from looprl.trainer.config import GRPOConfig, GRPOExperimental, LoopConfig
from looprl.trainer.grpo import GRPOLoop
from looprl.trainer.losses import LossParams
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOStep
from looprl.types import Grader, Group, GroupResult, Task
from tests.trainer.helpers import group, segment, tiny_llama, trajectory


class DropsFirstTry:
    """``GroupSource`` double: the first group of each task comes back dropped (what the runner
    returns when infrastructure took too many of its trajectories), later ones scored."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def run(self, tasks, *, max_ready=None):
        for task in tasks:
            if task is None:
                await asyncio.sleep(0)
                continue
            first = task.id not in self.seen
            self.seen.append(task.id)
            if first:
                yield GroupResult(task, None, infra_errors=6, dropped="only 1 of 2 survived")
                continue
            g = group([trajectory([segment([1, 2], [3, 4])], 1.0, task.id),
                       trajectory([segment([1, 2], [5, 6])], 0.0, task.id)], task.id)
            yield GroupResult(task, Group(task.id, g.group_id, tuple(
                dataclasses.replace(t, task_id=task.id) for t in g.trajectories),
                {"min_policy_version": 0}))


class Sink:
    async def update_weights(self, state_dict, version):
        pass


def test_a_group_infrastructure_dropped_is_handed_out_again_and_trained():
    tasks = [Task(f"t{i}", "/r", "p", Grader("pytest")) for i in range(3)]
    source = DropsFirstTry()
    loop = GRPOLoop(GRPOStep(tiny_llama(), GRPOConfig(lr=1e-3, experimental=GRPOExperimental(
        objective=LossParams(norm_tokens=8))), pad_id=0), Sink(),
                    source, TaskSampler(tasks), LoopConfig(groups_per_step=1, loggers=()))
    stats = asyncio.run(loop.run())
    assert sorted(loop.sampler.trained) == ["t0", "t1", "t2"]
    assert all(n == 1 for n in loop.sampler.trained.values())
    assert stats.groups_dropped == 3 and stats.groups_requeued == 3 and stats.infra_errors == 18
    assert sorted(source.seen) == ["t0", "t0", "t1", "t1", "t2", "t2"]
