"""Single-epoch sampling and the loop's staleness bound: a stale group is dropped, counted, and its
task (never trained on) handed out once more; a trained task never comes back."""

from looprl.rollout.runner import GroupResult
from looprl.trainer.grpo import GRPOLoop, LoopConfig, TaskSampler
from looprl.types import Grader, Group, Task


def _tasks(n):
    return [Task(f"t{i}", "/r", "p", Grader("pytest")) for i in range(n)]


def _result(task, oldest):
    return GroupResult(task, Group(task.id, f"{task.id}@g", (), {"min_policy_version": oldest}))


def test_the_sampler_walks_the_tasks_once_in_a_seeded_order():
    a, b = TaskSampler(_tasks(10), seed=3), TaskSampler(_tasks(10), seed=3)
    ids = [t.id for t in a]
    assert ids == [t.id for t in b] and sorted(ids) == sorted(f"t{i}" for i in range(10))
    assert ids != [f"t{i}" for i in range(10)]
    assert [t.id for t in TaskSampler(_tasks(10), seed=3, trained=ids[:4])] == ids[4:]


def test_a_stale_group_is_dropped_and_its_task_handed_out_once_more():
    sampler = TaskSampler(_tasks(4))
    loop = GRPOLoop(None, None, None, sampler, LoopConfig(max_staleness=2))  # type: ignore[arg-type]
    loop.version = 5
    it = iter(sampler)
    first, second = next(it), next(it)
    assert loop._admit(_result(first, oldest=3)) is not None  # lag 2: within the bound
    assert loop._admit(_result(second, oldest=2)) is None     # lag 3: stale
    assert (loop.stats.groups_stale, loop.stats.groups_requeued) == (1, 1)
    assert next(it) is second                                 # handed out again, next
    assert loop._admit(_result(second, oldest=1)) is None     # stale twice: not a third time
    assert (loop.stats.groups_stale, loop.stats.groups_requeued) == (2, 1)
    sampler.mark_trained([first.id])
    assert not sampler.requeue(first)                         # trained tasks never come back
    rest = list(it)
    assert len(rest) == 2 and second not in rest and first not in rest
