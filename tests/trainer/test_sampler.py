"""Sampling and the loop's staleness bound: a stale group is dropped, counted, and its task (never
trained on) handed out once more; a trained task never comes back within a pass."""

import dataclasses

from looprl.trainer.config import LoopConfig, LoopExperimental
from looprl.trainer.grpo import GRPOLoop
from looprl.trainer.sampler import TaskSampler
from looprl.types import Grader, Group, GroupResult, StopReason, Task

from .helpers import group, segment, trajectory


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
    loop = GRPOLoop(None, None, None, sampler,  # type: ignore[arg-type]
                    LoopConfig(experimental=LoopExperimental(max_staleness=2)))
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
    rest = [next(it), next(it)]
    assert second not in rest and first not in rest
    assert next(it) is None  # the loop's walk waits for the two still out: they may come back
    sampler.returned()
    sampler.returned()
    assert next(it, "done") == "done"


def test_passes_walk_the_tasks_again_each_in_its_own_order_and_resume_within_a_pass():
    tasks = _tasks(6)
    sampler = TaskSampler(tasks, seed=3, passes=2)
    walked = []
    for t in sampler:
        walked.append(t.id)
        sampler.mark_trained([t.id])
        if len(walked) == 8:  # stopped two tasks into the second pass
            break
    first, second = walked[:6], walked[6:]
    assert sorted(first) == [t.id for t in tasks]
    assert second != first[:2]  # the second pass has its own order
    assert first == [t.id for t in TaskSampler(tasks, seed=3)]  # the first is the one-pass order
    resumed = TaskSampler(tasks, seed=3, passes=2, trained=sampler.state_dict()["trained"])
    rest = [t.id for t in resumed]
    assert sorted(second + rest) == sorted(first) and not set(rest) & set(second)
    # the second pass's order: what a sampler walks when every task was trained once
    order = [t.id for t in TaskSampler(tasks, seed=3, passes=2, trained=first)]
    assert order[:2] == second and sorted(order) == sorted(first)
    # a task not trained in the first pass (its group had no pass) is walked in both
    late = TaskSampler(tasks, seed=3, passes=2, trained=first[1:])
    assert [t.id for t in late] == [first[0]] + order


def test_passes_must_be_positive():
    import pytest

    from looprl.config import ConfigError, load_config
    with pytest.raises(ConfigError, match=r"experimental.passes must be in \[1, 10000\], got 0"):
        load_config(LoopConfig, None, ["experimental.passes=0"])



def test_signal_first_hands_out_mixed_groups_tasks_first_and_all_passed_last():
    """Pass 1 records what each task's group showed; with ``signal_first`` pass 2 hands out the
    tasks with passes and failures first, then the failed and unseen ones, then the all-passed,
    each class in the pass's own shuffled order; a resumed sampler (its checkpoint's state) walks
    pass 2 the same way. An infra error says nothing about the policy: its task counts as unseen."""
    tasks = _tasks(12)
    outcome = {t.id: ("mixed", "fail", "pass")[i % 3] for i, t in enumerate(tasks[:9])}
    outcome["t9"] = "infra"  # t10, t11: trained, never recorded
    tests = {"mixed": (1.0, 0.0), "fail": (0.0, 0.0), "pass": (1.0, 1.0)}

    def group_of(tid):
        if outcome[tid] == "infra":
            trajs = [trajectory([segment([1], [2])], None, tid, stop=StopReason.INFRA_ERROR)]
        else:
            trajs = [trajectory([segment([1], [2])], r, tid) for r in tests[outcome[tid]]]
        return dataclasses.replace(group(trajs, tid), task_id=tid)

    s = TaskSampler(tasks, seed=1, passes=2, signal_first=True)
    it = iter(s)
    first = [next(it).id for _ in tasks]
    s.mark_trained(first)
    s.record([group_of(i) for i in first if i in outcome])
    walked = [t.id for t in it]
    kinds = [outcome.get(i, "unseen") for i in walked]
    assert kinds[:3] == ["mixed"] * 3
    assert sorted(kinds[3:9]) == ["fail"] * 3 + ["infra", "unseen", "unseen"]
    assert kinds[9:] == ["pass"] * 3
    plain_second = [t.id for t in TaskSampler(tasks, seed=1, passes=2)][len(tasks):]
    assert walked[:3] == [i for i in plain_second if outcome.get(i) == "mixed"]
    resumed = TaskSampler(tasks, seed=1, passes=2, signal_first=True)
    resumed.load_state_dict(s.state_dict())
    assert [t.id for t in resumed] == walked
    assert [t.id for t in TaskSampler(tasks, seed=1, passes=2)][len(tasks):] != walked  # off: shuffled
