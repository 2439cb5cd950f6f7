"""The examples in the trainer modules' docstrings (and those of the task split and of the
records the trainer reads) run."""

import doctest

import pytest

from looprl import types
from looprl.tasks import taskset
from looprl.trainer import advantages, batch, sampler, step


@pytest.mark.parametrize("module", [advantages, batch, sampler, step, taskset, types])
def test_doctests(module):
    res = doctest.testmod(module)
    assert res.attempted > 0 and res.failed == 0
