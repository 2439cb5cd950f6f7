"""The examples in the trainer modules' docstrings (and the quickstart's task split) run."""

import doctest

import pytest

from looprl import quickstart
from looprl.trainer import advantages, batch, grpo


@pytest.mark.parametrize("module", [advantages, batch, grpo, quickstart])
def test_doctests(module):
    res = doctest.testmod(module)
    assert res.attempted > 0 and res.failed == 0
