"""The composite reward: hidden-test score plus the shaping terms, as one explainable breakdown.

    from looprl.rewards import RewardConfig, compute_reward, reward_metrics
    rb = compute_reward(task, trajectory, grade, RewardConfig())   # RewardBreakdown | None
    rb.components   # {"tests": 1.0, "length": -0.11, "broken_calls": -0.1, "style_lint": 0.0, ...}
    rb.flags        # ("broken_tool_calls",)
    reward_metrics(scored_trajectories)   # {"reward/total_mean": ..., "monitor/edited_tests_rate": ...}

``grade`` is the hidden tests' result: a float score in [0, 1], or any object with ``.score`` and
``.edited_tests`` (``looprl.rewards.tests.GradeResult``, whose ``.flags`` join the monitors'), or
None when grading could not run. Rules: an infra-error trajectory or a None grade is skipped
(None); an edit to tests or grader config, or any other attempt on the test run
(``hacking.ATTACK_FLAGS``), cancels the tests' score and costs ``grader_attack_penalty`` more
(the ``grader_attack`` component), so it scores below an honest failure; a broken tool call
costs a negative term but the trajectory is kept. Shaping terms are picked by name from ``TERMS``
(``cfg.terms``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Protocol

from looprl.config import FieldError, Range
from looprl.errors import ConfigError
from looprl.plugins import find
from looprl.protocols import RewardFn
from looprl.rewards import hacking, length, style
from looprl.rewards.hacking import HackingConfig, MonitorStats
from looprl.rewards.length import LengthConfig
from looprl.rewards.style import StyleConfig
from looprl.types import Metadata, RewardBreakdown, Task, Trajectory


class GradeLike(Protocol):
    """What ``compute_reward`` reads from a grade (``looprl.rewards.tests.GradeResult`` has it,
    and ``flags``, the monitors the grader raised, read when present; read-only, as a frozen
    record's fields are)."""

    @property
    def score(self) -> float: ...

    @property
    def edited_tests(self) -> bool: ...


@dataclass(frozen=True)
class RewardExperimental:
    """The weights of the reward's terms: research switches and tuning knobs (``experimental``
    in ``looprl.config``)."""

    tests_weight: Annotated[float, Range(0.0, 1000.0)] = 1.0
    """Weight of the hidden-test score (in [0, 1]) — the reward's main term."""
    penalize_grader_attacks: bool = True
    """An edit to tests or grader config, or any other attempt on the test run (a flag of
    ``hacking.ATTACK_FLAGS``), cancels the tests' score and costs
    ``hacking.grader_attack_penalty`` (the reward-hacking guard)."""
    length: LengthConfig = field(default_factory=LengthConfig)
    """Effort weights and the length-penalty curve (λ, k, q)."""
    hacking: HackingConfig = field(default_factory=HackingConfig)
    """Broken-call, clarifying-question and suspicious-tool-use penalties."""
    style: StyleConfig = field(default_factory=StyleConfig)
    """Lint and diff-size terms."""


@dataclass(frozen=True)
class RewardConfig:
    """How a trajectory's reward is assembled (``reward.*`` in a run config)."""

    terms: tuple[str, ...] = ("length", "broken_calls", "clarifying_question", "no_edit",
                              "suspicious_tool_use", "style_lint", "style_diff_size")
    """Shaping terms added to the test score, by name: built-ins (``TERMS``) or plugins
    (``looprl.plugins``: an entry point of ``looprl.rewards`` or ``module:attr``)."""
    experimental: RewardExperimental = field(default_factory=RewardExperimental)

    def __post_init__(self) -> None:
        for t in self.terms:
            try:
                term_fn(t, self)
            except ConfigError as e:
                raise FieldError("terms", f"has {e}") from None


TERMS: dict[str, Callable[[RewardConfig], RewardFn]] = {
    "length": lambda cfg: partial(length.length_penalty, cfg=cfg.experimental.length),
    "broken_calls": lambda cfg: partial(hacking.broken_calls_penalty,
                                        cfg=cfg.experimental.hacking),
    "clarifying_question": lambda cfg: partial(hacking.clarifying_question_penalty,
                                               cfg=cfg.experimental.hacking),
    "no_edit": lambda cfg: partial(hacking.no_edit_penalty, cfg=cfg.experimental.hacking),
    "suspicious_tool_use": lambda cfg: partial(hacking.suspicious_tool_use_penalty,
                                               cfg=cfg.experimental.hacking),
    "style_lint": lambda cfg: partial(style.style_lint_penalty, cfg=cfg.experimental.style),
    "style_diff_size": lambda cfg: partial(style.diff_size_penalty, cfg=cfg.experimental.style),
}
"""The built-in shaping terms: name -> the ``RewardFn`` made with this config's knobs. Every
term, built-in or plugin, is a ``RewardFn``: ``(task, trajectory) -> float | None`` (usually
<= 0; None when it cannot judge)."""


def term_fn(name: str, cfg: RewardConfig) -> RewardFn:
    """The ``RewardFn`` of term ``name``: a built-in made with ``cfg``, or a plugin as it is."""
    if name in TERMS:
        return TERMS[name](cfg)
    fn = find("rewards", name, TERMS)  # not a built-in: TERMS only names the choices
    if not callable(fn):
        raise ConfigError(f"reward term {name!r} is {fn!r}, not a function (task, trajectory) "
                          "-> float | None")
    return fn  # type: ignore[return-value]


def _read_grade(grade: GradeLike | float) -> tuple[float, tuple[str, ...]]:
    """(score, the flags the grader raised) from a float or a GradeResult-like object."""
    if isinstance(grade, bool):
        raise TypeError("grade must be a float score or an object with .score, not a bool; "
                        "pass float(passed) if that is what you mean")
    if isinstance(grade, (int, float)):
        score, flags = float(grade), ()
    elif hasattr(grade, "score"):
        score = float(grade.score)
        flags = (("edited_tests",) if getattr(grade, "edited_tests", False) else ()) + tuple(
            getattr(grade, "flags", ()))
    else:
        raise TypeError(f"grade must be a float score or have .score (GradeResult), "
                        f"got {type(grade).__name__}")
    if not math.isfinite(score):
        raise ValueError(f"grade score must be finite, got {score}")
    return score, flags


def _details(task: Task, trajectory: Trajectory, cfg: RewardConfig, score: float) -> Metadata:
    details: Metadata = {"tests_score": score,
                         "effort": length.effort(trajectory.counters, cfg.experimental.length),
                         "broken_tool_calls": trajectory.counters.broken_tool_calls}
    if "style_lint" in cfg.terms:  # cached: costs nothing after the term ran
        details["new_lint_diagnostics"] = style.new_lint_diagnostics(task, trajectory,
                                                                     cfg.experimental.style)
    details["diff_size_ratio"] = style.diff_size_ratio(task, trajectory)
    edited = hacking.edited_test_paths(task, trajectory.diff)
    if edited:
        details["edited_test_paths"] = ",".join(edited)
    return details


def compute_reward(task: Task, trajectory: Trajectory, grade: GradeLike | float | None,
                   cfg: RewardConfig = RewardConfig()) -> RewardBreakdown | None:
    """The trajectory's reward as named components, their total and the monitors' flags.

    >>> from looprl.types import Counters, Grader, StopReason
    >>> task = Task("t", "/nonexistent", "fix it", Grader("pytest", fail_to_pass=("t::x",)))
    >>> traj = Trajectory("t", "g", (), (), Counters(turns=1, output_tokens=50, tool_calls=1,
    ...                   broken_tool_calls=1), StopReason.FINISHED, diff="")
    >>> rb = compute_reward(task, traj, 1.0)   # effort C = 50 + 20 + 50: length = -0.1·log 2.2
    >>> {k: round(v, 4) for k, v in rb.components.items()}
    {'tests': 1.0, 'length': -0.0788, 'broken_calls': -0.1, 'clarifying_question': 0.0, 'no_edit': 0.0, 'suspicious_tool_use': 0.0}
    >>> round(rb.total, 4), rb.flags
    (0.8212, ('broken_tool_calls', 'finish_without_edit'))
    >>> compute_reward(task, traj, None) is None
    True
    """
    if trajectory.is_infra_error or grade is None:
        return None
    score, grader_flags = _read_grade(grade)
    components = {"tests": cfg.experimental.tests_weight * score}
    for name in cfg.terms:
        value = term_fn(name, cfg)(task, trajectory)
        if value is not None:  # None: the term cannot judge this trajectory (e.g. no gold patch)
            components[name] = float(value)
    flags = hacking.detect(task, trajectory)
    flags += tuple(f for f in dict.fromkeys(grader_flags) if f not in flags)
    details = _details(task, trajectory, cfg, score)
    attacks = [f for f in flags if f in hacking.ATTACK_FLAGS]
    if cfg.experimental.penalize_grader_attacks and attacks:
        # positive shaping cannot lift an attack either: at most what the failure would get
        shaping = min(sum(v for k, v in components.items() if k != "tests"), 0.0)
        total = shaping - cfg.experimental.hacking.grader_attack_penalty
        components["grader_attack"] = total - sum(components.values())
        details["grader_attack"] = ",".join(attacks)
    return RewardBreakdown.of(components, flags, details)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def reward_metrics(trajectories: Iterable[Trajectory], prefix: str = "") -> dict[str, float]:
    """Per-step metrics of a batch: every reward term's mean, the total's mean, summaries per
    trajectory, the broken-call rate and each monitor flag's rate (JSONL/TensorBoard ready).

    Means are over scored trajectories (a term that skipped a trajectory is averaged over the
    ones it judged); infra errors only count in ``infra_error_rate``.

    >>> from looprl.types import Counters, StopReason
    >>> def traj(total, broken, summaries, flags=()):
    ...     rb = RewardBreakdown.of({"tests": total}, flags)
    ...     return Trajectory("t", "g", (), (), Counters(tool_calls=4, broken_tool_calls=broken,
    ...                       summaries=summaries), StopReason.FINISHED, reward=rb)
    >>> m = reward_metrics([traj(1.0, 0, 1), traj(0.0, 2, 0, ("broken_tool_calls",))])
    >>> m["reward/total_mean"], m["reward/tests_mean"], m["summaries_per_trajectory"]
    (0.5, 0.5, 0.5)
    >>> m["broken_call_rate"], m["monitor/broken_tool_calls_rate"]
    (0.25, 0.5)
    """
    trajs = list(trajectories)
    kept = [t for t in trajs if not t.is_infra_error]
    scored = [t for t in kept if t.reward is not None]
    per_term: dict[str, list[float]] = {}
    for t in scored:
        for name, value in t.reward.components.items():  # type: ignore[union-attr]
            per_term.setdefault(name, []).append(value)
    totals = [t.reward.total for t in scored if t.reward is not None]
    out: dict[str, float] = {"reward/total_mean": _mean(totals)}
    out.update({f"reward/{name}_mean": _mean(vals) for name, vals in per_term.items()})
    tool_calls = sum(t.counters.tool_calls for t in kept)
    out["summaries_per_trajectory"] = _mean([float(t.counters.summaries) for t in kept])
    out["broken_call_rate"] = (sum(t.counters.broken_tool_calls for t in kept) / tool_calls
                               if tool_calls else 0.0)
    out["trajectories_with_broken_calls"] = _mean(
        [float(t.counters.broken_tool_calls > 0) for t in kept])
    out.update(MonitorStats.of(scored).to_metrics())
    out["infra_error_rate"] = (len(trajs) - len(kept)) / len(trajs) if trajs else 0.0
    out["num_trajectories"] = float(len(trajs))
    out["num_scored"] = float(len(scored))
    return {prefix + k: v for k, v in out.items()}
