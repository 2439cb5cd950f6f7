"""Length (effort) penalty: a concave, nonlinear cost of how much work a trajectory took.

Effort ``C`` is a weighted sum of a trajectory's counters (thinking, output, tool-call and
tool-output tokens, tool calls, turns). The penalty is

    penalty(C) = -λ · ((1 + k·C)^(1-q) - 1) / (k·(1-q))        (q ≠ 1)
    penalty(C) = -λ · log(1 + k·C) / k                          (q = 1, the limit)

``q`` sets the curvature: q = 0 is linear (−λ·C); 0 < q < 1 grows like a power; q = 1 grows
like a log; q > 1 saturates at λ/(k·(q−1)). Every q > 0 is steep near C = 0 (slope −λ) and flat
for large C, so the first extra tool call costs more than the hundredth: the model is pushed to
answer quickly on easy tasks without being crushed on hard ones. ``docs/length_penalty.png``
plots it (``scripts/plot_length_penalty.py``).

    from looprl.rewards.length import LengthConfig, length_penalty
    length_penalty(task, trajectory, LengthConfig(coef=1e-3, k=1e-2, q=1.0))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from looprl.config import Range
from looprl.types import Counters, Task, Trajectory

Weight = Annotated[float, Range(0.0, 1e6)]
"""An effort weight: the cost of one token, call or turn (>= 0)."""


@dataclass(frozen=True)
class LengthConfig:
    """Weights of the effort sum and the shape of the penalty curve."""

    thinking_token_weight: Weight = 0.5
    """Extra cost per thinking token, on top of ``output_token_weight`` (output tokens already
    include thinking): thinking is pure latency for the user."""
    output_token_weight: Weight = 1.0
    """Cost per model-sampled token (the unit of effort)."""
    tool_call_token_weight: Weight = 0.0
    """Extra cost per token inside ``<tool_call>`` blocks (0: they are already output tokens)."""
    tool_output_token_weight: Weight = 0.1
    """Cost per token of tool results read back: cheap to prefill, but it fills the context."""
    tool_call_weight: Weight = 20.0
    """Cost per tool call: each one is a sandbox round trip the user waits for."""
    turn_weight: Weight = 50.0
    """Cost per assistant turn: each one is a full generation request (prefill + decode)."""
    coef: Annotated[float, Range(0.0, 1000.0)] = 1e-3
    """λ: the slope of the penalty at C = 0 (reward lost per unit of effort for the first units)."""
    k: Annotated[float, Range(0.0, 1e6, lo_open=True,
                              hint="for a linear penalty set q=0 instead")] = 1e-2
    """Scale at which the curve bends: effort well below 1/k is penalised almost linearly."""
    q: Annotated[float, Range(0.0, 1000.0)] = 1.0
    """Curvature: 0 linear, 1 logarithmic (default), >1 saturating."""
    max_penalty: Annotated[float, Range(0.0, 1e6)] | None = 0.9
    """Cap on the penalty's size (None: no cap). Below 1 so that a correct but long solution still
    beats a wrong one (the tests term is worth 1)."""


def effort(counters: Counters, cfg: LengthConfig = LengthConfig()) -> float:
    """The weighted effort sum C of a trajectory's counters.

    >>> effort(Counters(turns=2, tool_calls=3, thinking_tokens=100, output_tokens=300,
    ...                 tool_output_tokens=1000))
    610.0
    """
    return float(cfg.thinking_token_weight * counters.thinking_tokens
                 + cfg.output_token_weight * counters.output_tokens
                 + cfg.tool_call_token_weight * counters.tool_call_tokens
                 + cfg.tool_output_token_weight * counters.tool_output_tokens
                 + cfg.tool_call_weight * counters.tool_calls
                 + cfg.turn_weight * counters.turns)


def penalty_curve(c: float, coef: float, k: float, q: float) -> float:
    """-λ · ((1 + k·C)^(1-q) - 1) / (k·(1-q)), and its log limit at q = 1 (always <= 0).

    Written as ``expm1((1-q)·log1p(k·C)) / (1-q)`` so that q → 1 is continuous and exact.

    >>> round(penalty_curve(100.0, coef=1e-3, k=1e-2, q=1.0), 6)     # -0.1 · log 2
    -0.069315
    >>> round(penalty_curve(300.0, coef=1e-3, k=1e-2, q=0.5), 6)     # -0.1 · (2 - 1) / 0.5
    -0.2
    >>> round(penalty_curve(300.0, coef=1e-3, k=1e-2, q=2.0), 6)     # -0.1 · (1 - 1/4)
    -0.075
    >>> penalty_curve(300.0, coef=1e-3, k=1e-2, q=0.0)               # linear: -λ·C
    -0.3
    >>> penalty_curve(0.0, coef=1e-3, k=1e-2, q=1.5)
    0.0
    """
    assert c >= 0, f"effort must be >= 0, got {c}"
    log_term = math.log1p(k * c)
    a = 1.0 - q
    scaled = log_term if abs(a) < 1e-12 else math.expm1(a * log_term) / a
    return -coef * scaled / k + 0.0  # + 0.0 turns -0.0 into 0.0


def penalty_of_effort(c: float, cfg: LengthConfig = LengthConfig()) -> float:
    """The capped penalty for effort ``c`` under ``cfg``.

    >>> round(penalty_of_effort(610.0), 4)        # -0.1 · log(7.1)
    -0.196
    >>> penalty_of_effort(1e12)                   # capped by max_penalty
    -0.9
    """
    p = penalty_curve(c, cfg.coef, cfg.k, cfg.q)
    return p if cfg.max_penalty is None else max(p, -cfg.max_penalty)


def length_penalty(task: Task, trajectory: Trajectory,
                   cfg: LengthConfig = LengthConfig()) -> float | None:
    """Reward term ``length``: the penalty of the trajectory's effort; None for infra errors.

    >>> from looprl.types import Grader, StopReason
    >>> task = Task("t", "/repo", "fix it", Grader("pytest"))
    >>> traj = Trajectory("t", "g", (), (), Counters(turns=2, tool_calls=3, output_tokens=30),
    ...                   StopReason.FINISHED)
    >>> round(length_penalty(task, traj), 6)       # C = 100 + 60 + 30 = 190: -0.1 · log 2.9
    -0.106471
    """
    if trajectory.is_infra_error:
        return None
    return penalty_of_effort(effort(trajectory.counters, cfg), cfg)
