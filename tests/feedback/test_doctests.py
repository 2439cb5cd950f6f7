"""The examples in the feedback modules' docstrings run."""

import doctest

import pytest

from looprl.feedback import ab, sentiment, signals, store


@pytest.mark.parametrize("module", [ab, sentiment, signals, store])
def test_doctests(module):
    res = doctest.testmod(module)
    assert res.attempted > 0 and res.failed == 0
