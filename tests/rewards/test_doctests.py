"""The reward modules' doctests are their worked examples: they must run and pass."""

import doctest
import importlib

import pytest

MODULES = ["looprl.rewards.length", "looprl.rewards.hacking", "looprl.rewards.verifier",
           "looprl.rewards.isolation", "looprl.rewards.style", "looprl.rewards.composite",
           "looprl.rewards.logparse", "looprl.rewards.graded", "looprl.rewards.evalscript"]


@pytest.mark.parametrize("name", MODULES)
def test_doctests_pass(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no doctest"
    assert result.failed == 0
