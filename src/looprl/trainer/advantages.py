"""Group advantages for GRPO: named functions in a dict, picked by ``GRPOConfig.std_norm``.

Every trajectory of a group (the G runs of one task) gets ``A_i = r_i - mean(r)``; the variants
differ only in whether they divide by the group's standard deviation:

- ``never``        (Dr. GRPO): no division. The scale of the reward is kept, and easy or hopeless
  tasks (small spread) do not get their tiny differences blown up.
- ``always``       (original GRPO): ``A_i / (std(r) + eps)``, population std (ddof=0).
- ``unless_equal``: divide like ``always``, but when every reward is equal skip the division and
  return exact zeros (no float noise amplified by ``1 / eps``).

A group whose rewards are all equal carries no learning signal (every advantage is 0): detect it
with ``is_zero_variance`` to skip and count it.

    >>> group_advantages([1.0, 0.0, 0.0, 1.0], "never")
    [0.5, -0.5, -0.5, 0.5]
    >>> [round(a, 4) for a in group_advantages([2.0, 0.0], "always")]
    [1.0, -1.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from looprl.errors import ConfigError

AdvantageFn = Callable[[Sequence[float], float], list[float]]


def is_zero_variance(rewards_G: Sequence[float], tol: float = 1e-9) -> bool:
    """True when all rewards of the group are equal (within ``tol``): no signal to learn from."""
    return len(rewards_G) == 0 or max(rewards_G) - min(rewards_G) <= tol


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _std(xs: Sequence[float]) -> float:
    m = _mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / len(xs))


def mean_centered(rewards_G: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Dr. GRPO: ``A_i = r_i - mean(r)``; ``eps`` is unused (kept for a uniform signature)."""
    m = _mean(rewards_G)
    return [r - m for r in rewards_G]


def std_normalized(rewards_G: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GRPO: ``A_i = (r_i - mean(r)) / (std(r) + eps)``, population std."""
    s = _std(rewards_G)
    return [a / (s + eps) for a in mean_centered(rewards_G)]


def std_normalized_unless_equal(rewards_G: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Like ``std_normalized``, but a group of equal rewards gets exact zeros."""
    if is_zero_variance(rewards_G):
        return [0.0] * len(rewards_G)
    return std_normalized(rewards_G, eps)


ADVANTAGES: dict[str, AdvantageFn] = {
    "never": mean_centered,
    "always": std_normalized,
    "unless_equal": std_normalized_unless_equal,
}


def group_advantages(rewards_G: Sequence[float], std_norm: str = "never",
                     eps: float = 1e-6) -> list[float]:
    """Advantages of one group by the named variant (see ``ADVANTAGES``)."""
    if std_norm not in ADVANTAGES:
        raise ConfigError(f"unknown std_norm {std_norm!r}; choose one of {sorted(ADVANTAGES)} "
                          f"(e.g. -o grpo.std_norm=never)")
    if len(rewards_G) == 0:
        return []
    return ADVANTAGES[std_norm](rewards_G, eps)
