"""The examples in the trainer modules' docstrings (and the task split's) run."""

import doctest

import pytest

from looprl.tasks import taskset
from looprl.trainer import advantages, batch, grpo


@pytest.mark.parametrize("module", [advantages, batch, grpo, taskset])
def test_doctests(module):
    res = doctest.testmod(module)
    assert res.attempted > 0 and res.failed == 0
