"""Which task the GRPO loop rolls out next: a seeded walk over the task set, ``passes`` times.

    sampler = TaskSampler(tasks, seed=0, passes=1)
    for task in sampler:              # None: none to hand out now, but some may come back
        ...
    sampler.mark_trained([task.id])   # after the step that trained its group

The loop (``trainer.grpo``) hands a stale group's task, or one whose group infrastructure
failures emptied, out again (``requeue``), a screened-out one later (``defer``), and keeps the
sampler's ``state_dict`` in every checkpoint, so a resumed run neither loses nor repeats a task
within a pass.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Any

from looprl.types import Group, Task


class TaskSampler:
    """Walks the task set ``passes`` times, each pass in its own seeded order; remembers how
    often each task was trained so a resumed run neither loses nor repeats a task within a pass.
    A task whose group was dropped untrained (stale) can be handed out once more (``requeue``):
    it was never trained on, and tasks are the scarce thing. With ``max_screens`` (for a runner
    with ``RolloutConfig.screen``), a task screened out (the policy could not solve it yet) waits
    (``defer``) and is handed out again once the fresh tasks run out, to the policy as it is
    then, up to ``max_screens`` times in all. While none is left to hand out in the last pass but
    some are still out (``returned`` not yet called for them: they may come back screened out,
    stale or emptied by infrastructure failures, to go out again), the walk yields None, meaning
    ask again; ``waits`` (the loop sets it: it returns every task it takes) does so always,
    else only with ``max_screens``.

    >>> from looprl.types import Grader
    >>> s = TaskSampler([Task(i, "/r", "p", Grader("pytest")) for i in "abc"], passes=2)
    >>> first = [next(it := iter(s)).id]; s.mark_trained(first)
    >>> walked = first + [t.id for t in it]
    >>> sorted(walked[:3]) == sorted(walked[3:]) == ["a", "b", "c"], s.passes_begun
    (True, 2)

    With ``signal_first`` a later pass orders the tasks by what their last group showed
    (``record``): mixed outcomes first, all failed or unseen next, all passed last.
    """

    def __init__(self, tasks: Sequence[Task], seed: int = 0, trained: Sequence[str] = (),
                 max_screens: int = 0, passes: int = 1, signal_first: bool = False):
        self.tasks = list(tasks)
        self.seed, self.passes, self.signal_first = seed, passes, signal_first
        self.signal: dict[str, int] = {}
        """Each recorded task's last group: ``MIXED``, ``NO_PASS`` or ``ALL_PASS``."""
        self.trained: Counter[str] = Counter(trained)
        """Times each task was trained (once a pass at most)."""
        self.max_screens = max_screens
        self.waits = False
        """Wait for the tasks still out at the end of the walk (class docstring)."""
        self.issued = 0
        self.passes_begun = 0
        self.out = 0
        """Tasks handed out whose group has not come back (``returned``)."""
        self._again: deque[Task] = deque()
        self._requeued: set[tuple[str, int]] = set()
        self._later: deque[Task] = deque()
        self._screens: dict[str, int] = {}

    MIXED, NO_PASS, ALL_PASS = 0, 1, 2
    """A group's outcome classes, in the order ``signal_first`` hands tasks out."""

    def _order(self, n: int) -> list[Task]:
        order = list(self.tasks)
        random.Random(self.seed if n == 0 else f"{self.seed}/{n}").shuffle(order)
        if self.signal_first and n > 0:  # stable: the pass's own order within each class
            order.sort(key=lambda t: self.signal.get(t.id, self.NO_PASS))
        return order

    def record(self, groups: Sequence[Group]) -> None:
        """What ``groups`` (trained this step) showed, for ``signal_first``'s next pass: infra
        errors are left out; a group with none left says nothing.

        >>> from looprl.types import Grader
        >>> tasks = [Task(i, "/r", "p", Grader("pytest")) for i in "abcd"]
        >>> s = TaskSampler(tasks, passes=2, signal_first=True)
        >>> it = iter(s); first = [next(it) for _ in tasks]; s.mark_trained([t.id for t in first])
        >>> s.signal.update(a=s.ALL_PASS, b=s.MIXED, c=s.NO_PASS)   # what record() would note
        >>> second = [t.id for t in it]
        >>> second[0], sorted(second[1:3]), second[3]   # d, unseen, goes with the no-pass
        ('b', ['c', 'd'], 'a')
        """
        for g in groups:
            passed = [t.passed for t in g.trajectories if not t.is_infra_error]
            if passed:
                self.signal[g.task_id] = (self.ALL_PASS if all(passed) else
                                          self.MIXED if any(passed) else self.NO_PASS)

    def _done(self, task_id: str) -> bool:
        """Trained in the pass under way."""
        return self.trained[task_id] >= self.passes_begun

    def __iter__(self) -> Iterator[Task | None]:
        for n in range(self.passes):
            self.passes_begun = n + 1
            fresh = iter(self._order(n))
            while True:
                t = self._again.popleft() if self._again else next(fresh, None)
                if t is None and self._later:
                    t = self._later.popleft()
                if t is None:
                    if n + 1 < self.passes or not (self.out and (self.waits or self.max_screens)):
                        break
                    yield None
                    continue
                if not self._done(t.id):
                    self.issued += 1
                    self.out += 1
                    yield t

    def returned(self) -> None:
        """A handed-out task's group came back (trained, dropped, stale or screened out)."""
        self.out = max(self.out - 1, 0)

    def requeue(self, task: Task) -> bool:
        """Hand ``task`` out again, next (once per task); False if it was requeued before or
        trained since.

        >>> from looprl.types import Grader
        >>> s = TaskSampler([Task(i, "/r", "p", Grader("pytest")) for i in "ab"])
        >>> it = iter(s); first = next(it)
        >>> s.requeue(first), s.requeue(first), next(it) is first
        (True, False, True)
        """
        key = (task.id, self.passes_begun)
        if key in self._requeued or self._done(task.id):
            return False
        self._requeued.add(key)
        self._again.append(task)
        return True

    def defer(self, task: Task) -> bool:
        """``task`` was screened out: hand it out again after the fresh tasks, unless it has been
        screened ``max_screens`` times (False: given up).

        >>> from looprl.types import Grader
        >>> s = TaskSampler([Task(i, "/r", "p", Grader("pytest")) for i in "ab"], max_screens=2)
        >>> it = iter(s); a = next(it); s.returned(); s.defer(a)
        True
        >>> b = next(it); b is not a, next(it) is a   # the fresh task first
        (True, True)
        >>> s.returned(); s.defer(a), next(it)        # b is still out: wait for it
        (False, None)
        >>> s.returned(); next(it, "done")
        'done'
        """
        self._screens[task.id] = n = self._screens.get(task.id, 0) + 1
        if n >= self.max_screens or self._done(task.id):
            return False
        self._later.append(task)
        return True

    def mark_trained(self, task_ids: Sequence[str]) -> None:
        self.trained.update(task_ids)

    def state_dict(self) -> dict[str, Any]:
        """``trained`` lists a task once per pass it was trained in; ``signal`` is ``record``'s."""
        return {"trained": sorted(self.trained.elements()), "signal": dict(self.signal)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's ``state_dict`` (one from before ``signal`` was kept has none)."""
        self.mark_trained(state.get("trained", []))
        self.signal.update(state.get("signal", {}))
