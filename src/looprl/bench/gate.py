"""Compare two bench reports with paired bootstrap CIs, and gate a checkpoint on the result.

    cmp = compare(load("base.json"), load("cand.json"))   # per-metric diff (B - A) with 95% CIs
    cmp.passed                                             # the promotion gate

Tasks are resampled with replacement (paired: both reports on the same task ids), so the CI says
how much of a difference could be task-set noise. The gate passes when the candidate's pass@1 is
not worse than the base by more than ``max_drop`` at the CI's lower bound
(non-inferiority), and, if ``min_gain`` > 0, when the lower bound also exceeds ``min_gain``.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.errors import ConfigError

METRICS = ("pass@1", "output_tokens", "tool_calls", "turns", "wall_s", "broken_tool_calls")
HIGHER_IS_BETTER = {"pass@1": True, "output_tokens": False, "tool_calls": False, "turns": False,
                    "wall_s": False, "broken_tool_calls": False}


@dataclass(frozen=True)
class GateSettings:
    """When a candidate checkpoint passes (``compare``'s ``max_drop`` and ``min_gain``)."""

    max_drop: float = 0.02
    """The candidate fails when its pass@1 may be worse by more than this: the 95% CI's lower
    bound of (candidate - base) below ``-max_drop`` (non-inferiority)."""
    min_gain: float = 0.0
    """With > 0, the CI's lower bound must also exceed this (superiority)."""


@dataclass(frozen=True)
class MetricDiff:
    metric: str
    a: float
    b: float
    diff: float
    """b - a, the mean over common tasks."""
    lo: float
    hi: float
    """95% paired bootstrap interval of diff."""


@dataclass(frozen=True)
class Comparison:
    n_tasks: int
    diffs: tuple[MetricDiff, ...]
    passed: bool
    reason: str


def load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        rep = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read bench report {p}: {e}; make one with `looprl bench run`"
                          ) from None
    if "per_task" not in rep:
        raise ConfigError(f"{p} is not a bench report (no 'per_task'); use `looprl bench run`")
    return rep


def _bootstrap(a: list[float], b: list[float], n_boot: int, rng: random.Random
               ) -> tuple[float, float]:
    n = len(a)
    stats = []
    for _ in range(n_boot):
        idx = [rng.randrange(n) for _ in range(n)]
        stats.append(sum(b[i] - a[i] for i in idx) / n)
    stats.sort()
    return stats[int(0.025 * n_boot)], stats[min(n_boot - 1, int(0.975 * n_boot))]


def compare(a: dict[str, Any], b: dict[str, Any], *, n_boot: int = 2000, seed: int = 0,
            max_drop: float = 0.02, min_gain: float = 0.0) -> Comparison:
    common = sorted(set(a["per_task"]) & set(b["per_task"]))
    if not common:
        raise ConfigError("the two reports share no task ids; run both on the same task file")
    rng = random.Random(seed)
    diffs = []
    for m in METRICS:
        xa = [float(a["per_task"][t][m]) for t in common]
        xb = [float(b["per_task"][t][m]) for t in common]
        lo, hi = _bootstrap(xa, xb, n_boot, rng)
        diffs.append(MetricDiff(m, statistics.fmean(xa), statistics.fmean(xb),
                                statistics.fmean(xb) - statistics.fmean(xa), lo, hi))
    p1 = diffs[0]
    if p1.lo < -max_drop:
        ok, why = False, (f"pass@1 may have dropped: CI lower bound {p1.lo:+.3f} < "
                          f"-{max_drop} (diff {p1.diff:+.3f})")
    elif min_gain > 0 and p1.lo <= min_gain:
        ok, why = False, f"pass@1 gain not shown: CI lower bound {p1.lo:+.3f} <= {min_gain}"
    else:
        ok, why = True, f"pass@1 diff {p1.diff:+.3f}, 95% CI [{p1.lo:+.3f}, {p1.hi:+.3f}]"
    return Comparison(len(common), tuple(diffs), ok, why)


def comparison_markdown(c: Comparison) -> str:
    lines = [f"{c.n_tasks} common tasks — gate {'PASSED' if c.passed else 'FAILED'}: {c.reason}",
             "", "| metric | A | B | B - A | 95% CI | better |", "|---|---|---|---|---|---|"]
    for d in c.diffs:
        better = (d.lo > 0) if HIGHER_IS_BETTER[d.metric] else (d.hi < 0)
        worse = (d.hi < 0) if HIGHER_IS_BETTER[d.metric] else (d.lo > 0)
        verdict = "B" if better else ("A" if worse else "=")
        lines.append(f"| {d.metric} | {d.a:.4g} | {d.b:.4g} | {d.diff:+.4g} | "
                     f"[{d.lo:+.4g}, {d.hi:+.4g}] | {verdict} |")
    return "\n".join(lines)
