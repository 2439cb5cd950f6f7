"""The examples in the feedback modules' docstrings run."""

import doctest

import pytest

from looprl.feedback import ab, follow_ups, sentiment, signals, store


@pytest.mark.parametrize("module", [ab, follow_ups, sentiment, signals, store])
def test_doctests(module):
    res = doctest.testmod(module)
    assert res.attempted > 0 and res.failed == 0
