"""Quickstart helpers that need no run (the run itself: README's first command)."""

import math

from looprl.quickstart import loss_ends


def test_loss_ends_average_a_tenth_of_the_steps_at_each_end():
    losses = [5.0] * 10 + [3.0] * 80 + [1.0, 2.0] * 5
    assert loss_ends(losses) == (5.0, 1.5)
    assert loss_ends([2.0]) == (2.0, 2.0)
    assert all(math.isnan(x) for x in loss_ends([]))
