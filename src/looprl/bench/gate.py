"""Compare two bench reports with paired bootstrap CIs, and gate a checkpoint on the result.

    cmp = compare(load("base.json"), load("cand.json"))   # per-metric diff (B - A) with 95% CIs
    cmp.passed                                             # the promotion gate

Tasks are resampled with replacement (paired: both reports on the same task ids), so the CI says
how much of a difference could be task-set noise. The gate passes when the candidate's pass@1 is
not worse than the base by more than ``max_drop`` at the CI's lower bound
(non-inferiority), and, if ``min_gain`` > 0, when the lower bound also exceeds ``min_gain``
(so an interval that includes 0 fails). It never passes when both reports' pass@1 is 0: a
difference of zero between two models that solve nothing says nothing.

Infrastructure failures come first: pass@k leaves out the samples infrastructure took, so a
report where more than ``max_infra_share`` of them failed that way is no evidence, and the gate
refuses to judge (``Comparison.refused``: fix the infrastructure and evaluate again). And a
candidate whose rollouts fail as infrastructure more than its parent's (by more than
``max_infra_increase``) is not promoted, whatever its pass@1: a policy can make failures land
outside the score (a workspace that makes the grader raise), and the samples it loses that way
would otherwise raise its pass@k.

``precision`` splits the pass@1 difference's variance into the spread of the true per-task
differences and the noise of k samples per task, to say what an evaluation must cost for a given
interval: more samples shrink only the second part, more tasks shrink both. ``runs_precision``
does the same for several runs of one config (seeds) on the same tasks, where part of the spread
over tasks is each run's own and shrinks with more runs.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.bench.report import infra_share
from looprl.config import Share
from looprl.errors import ConfigError

METRICS = ("pass@1", "output_tokens", "tool_calls", "turns", "wall_s", "broken_tool_calls")
HIGHER_IS_BETTER = {"pass@1": True, "output_tokens": False, "tool_calls": False, "turns": False,
                    "wall_s": False, "broken_tool_calls": False}


@dataclass(frozen=True)
class GateSettings:
    """When a candidate checkpoint passes (``compare``'s ``max_drop`` and ``min_gain``)."""

    max_drop: Share = 0.02
    """The candidate fails when its pass@1 may be worse by more than this: the 95% CI's lower
    bound of (candidate - base) below ``-max_drop`` (non-inferiority)."""
    min_gain: Share = 0.0
    """With > 0, the CI's lower bound must also exceed this (superiority)."""
    max_infra_share: Share = 0.05
    """Refuse to gate when more than this share of either report's samples failed as
    infrastructure (excluded from pass@k, so the comparison would not say much)."""
    max_infra_increase: Share = 0.0
    """The candidate fails when its infrastructure share exceeds the base's by more than this."""


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


Z95 = 1.96
"""The normal quantile of a two-sided 95% interval."""


@dataclass(frozen=True)
class Precision:
    """How wide the 95% interval of a pass@1 difference is, and would be with other sizes.

    The variance of one task's observed difference is ``between + sampling / k``: the variance
    over tasks of the true differences, plus each sample's pass/fail noise (p(1-p) of both
    arms) averaged over the k samples. Its mean over n tasks has 1.96 x sqrt(that / n) as the
    interval's half-width (normal approximation of the paired bootstrap).
    """

    n_tasks: int
    k: int
    between: float
    sampling: float

    def half_width(self, n_tasks: int | None = None, k: int | None = None) -> float:
        n, kk = n_tasks or self.n_tasks, k or self.k
        return Z95 * math.sqrt((self.between + self.sampling / kk) / n)

    def tasks_for(self, half_width: float, k: int | None = None) -> int:
        """The fewest tasks whose interval is at most ``half_width`` with ``k`` samples each."""
        kk = k or self.k
        return math.ceil(Z95 ** 2 * (self.between + self.sampling / kk) / half_width ** 2)

    def samples_for(self, half_width: float) -> int | None:
        """The fewest samples per task that reach ``half_width`` on these tasks; None when even
        infinitely many would not (the between-task spread alone is wider)."""
        room = half_width ** 2 * self.n_tasks / Z95 ** 2 - self.between
        if room <= 0:
            return None
        return max(1, math.ceil(self.sampling / room))

    def markdown(self, target: float = 0.03) -> str:
        pts = f"±{target * 100:g} points"
        by_k = self.samples_for(target)
        k_part = (f"k = {by_k} on these {self.n_tasks}" if by_k is not None else
                  f"no k on these {self.n_tasks} tasks (±{self.half_width(k=10 ** 9) * 100:.1f} "
                  "at best)")
        return (f"pass@1 interval ±{self.half_width() * 100:.1f} points on {self.n_tasks} tasks x "
                f"{self.k} (variance over tasks {self.between:.4f}, per sample {self.sampling:.3f}); "
                f"{pts} takes {self.tasks_for(target)} tasks at k = {self.k}, or {k_part}.")


def _noise(row: dict[str, Any]) -> float:
    """Unbiased p(1-p) of one sample, from a task's row of n > 1 samples."""
    n, p = int(row["n"]), float(row["pass@1"])
    return p * (1 - p) * n / (n - 1)


def precision(a: dict[str, Any], b: dict[str, Any]) -> Precision | None:
    """``Precision`` of pass@1(b) - pass@1(a) over their common tasks (None when fewer than
    two tasks, or no task has two graded samples in both reports, to tell noise from spread)."""
    common = sorted(set(a["per_task"]) & set(b["per_task"]))
    rows = [(a["per_task"][t], b["per_task"][t]) for t in common]
    if len(rows) < 2:
        return None

    diffs = [float(y["pass@1"]) - float(x["pass@1"]) for x, y in rows]
    known = [(_noise(x), int(x["n"]), _noise(y), int(y["n"])) for x, y in rows
             if int(x.get("n", 1)) > 1 and int(y.get("n", 1)) > 1]
    if not known:
        return None
    sampling = statistics.fmean(sx + sy for sx, _, sy, _ in known)
    of_mean = statistics.fmean(sx / nx + sy / ny for sx, nx, sy, ny in known)
    between = max(statistics.variance(diffs) - of_mean, 0.0)
    k = round(statistics.fmean(nx + ny for _, nx, _, ny in known) / 2)
    return Precision(len(rows), k, between, sampling)


@dataclass(frozen=True)
class RunsPrecision:
    """How wide the 95% interval of several runs' pooled pass@1 difference is, and would be with
    more runs or samples.

    One run's difference on a task is the task's true gain (``shared`` by every run), plus what
    that run did to the task (``own``: which tasks one seed's training happened to help), plus
    the noise of its k samples. Pooling S runs averages the last two, so the variance of a
    task's pooled difference is ``shared + (own + sampling / k) / S``. Within a task, the runs'
    differences vary by ``own + sampling / k``; over tasks, their mean by the whole: the two
    give ``own`` and ``shared`` (method of moments, clipped at 0).
    """

    n_tasks: int
    runs: int
    k: int
    shared: float
    own: float
    sampling: float

    def half_width(self, runs: int | None = None, k: int | None = None) -> float:
        s, kk = runs or self.runs, k or self.k
        return Z95 * math.sqrt((self.shared + (self.own + self.sampling / kk) / s) / self.n_tasks)

    def runs_for(self, half_width: float, k: int | None = None) -> int | None:
        """The fewest runs whose pooled interval is at most ``half_width`` at ``k`` samples a
        task each; None when no number would (the shared spread alone is wider)."""
        room = half_width ** 2 * self.n_tasks / Z95 ** 2 - self.shared
        if room <= 0:
            return None
        return max(1, math.ceil((self.own + self.sampling / (k or self.k)) / room))

    def markdown(self, target: float = 0.03) -> str:
        def take(k: int) -> str:
            n = self.runs_for(target, k)
            return f"{n} runs at k = {k}" if n is not None else f"no number of runs at k = {k}"

        return (f"pass@1 interval ±{self.half_width() * 100:.1f} points from {self.runs} runs on "
                f"{self.n_tasks} tasks x {self.k} (variance over tasks {self.shared:.4f} shared by "
                f"the runs, {self.own:.4f} each run's own; per sample {self.sampling:.3f}); "
                f"±{target * 100:g} points takes {take(self.k)}, or {take(2 * self.k)}.")


def runs_precision(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> RunsPrecision | None:
    """``RunsPrecision`` of pass@1(b) - pass@1(a) from several runs' (a, b) report pairs on the
    same tasks (None with fewer than two runs or tasks, or without two samples a task)."""
    if len(pairs) < 2:
        return None
    common = sorted(set.intersection(*(set(a["per_task"]) & set(b["per_task"]) for a, b in pairs)))
    if len(common) < 2:
        return None

    rows = [[(a["per_task"][t], b["per_task"][t]) for a, b in pairs] for t in common]
    if any(int(x.get("n", 1)) < 2 or int(y.get("n", 1)) < 2 for row in rows for x, y in row):
        return None
    diffs = [[float(y["pass@1"]) - float(x["pass@1"]) for x, y in row] for row in rows]
    of_mean = [statistics.fmean(_noise(x) / int(x["n"]) + _noise(y) / int(y["n"]) for x, y in row)
               for row in rows]
    within = [statistics.variance(d) for d in diffs]
    s = len(pairs)
    own = max(statistics.fmean(w - m for w, m in zip(within, of_mean, strict=True)), 0.0)
    shared = max(statistics.variance([statistics.fmean(d) for d in diffs])
                 - statistics.fmean(within) / s, 0.0)
    sampling = statistics.fmean(_noise(x) + _noise(y) for row in rows for x, y in row)
    k = round(statistics.fmean(int(x["n"]) + int(y["n"]) for row in rows for x, y in row) / 2)
    return RunsPrecision(len(common), s, k, shared, own, sampling)


@dataclass(frozen=True)
class Comparison:
    n_tasks: int
    diffs: tuple[MetricDiff, ...]
    passed: bool
    reason: str
    precision: Precision | None = None
    infra_shares: tuple[float, float] = (0.0, 0.0)
    """The share of each report's samples that infrastructure took (base, candidate)."""
    refused: bool = False
    """The gate did not judge: a report had too many infrastructure failures (``passed`` is
    False)."""


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
            max_drop: Share = 0.02, min_gain: float = 0.0, max_infra_share: float = 0.05,
            max_infra_increase: float = 0.0) -> Comparison:
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
    shares = (infra_share(a), infra_share(b))
    worst = max(range(2), key=lambda i: shares[i])
    if shares[worst] > max_infra_share:
        rep = (a, b)[worst]
        return Comparison(len(common), tuple(diffs), False, (
            f"refused: infrastructure failed {rep.get('infra_errors', 0)} of "
            f"{rep.get('n_samples', 0)} samples ({shares[worst]:.1%}) of the "
            f"{('base', 'candidate')[worst]} report ({_by_kind(rep)}), above "
            f"max_infra_share={max_infra_share:g}; pass@k leaves them out, so fix the "
            "infrastructure and evaluate again"), precision(a, b), shares, refused=True)
    if shares[1] > shares[0] + max_infra_increase:
        return Comparison(len(common), tuple(diffs), False, (
            f"not promoted: its rollouts failed as infrastructure more than its parent's "
            f"({shares[1]:.1%}: {_by_kind(b)} vs {shares[0]:.1%}; max_infra_increase="
            f"{max_infra_increase:g}); pass@1 diff {p1.diff:+.3f}"), precision(a, b), shares)
    if p1.a == 0 and p1.b == 0:
        # Nothing passed on either side: a difference of 0 with a CI of [0, 0] is no evidence
        # the candidate works, only that neither does.
        ok, why = False, ("no evidence: pass@1 is 0 for both base and candidate on "
                          f"{len(common)} tasks, so no difference can be told from zero; "
                          "train longer or on easier tasks before gating")
    elif p1.lo < -max_drop:
        ok, why = False, (f"pass@1 may have dropped: CI lower bound {p1.lo:+.3f} < "
                          f"-{max_drop} (diff {p1.diff:+.3f})")
    elif min_gain > 0 and p1.lo <= min_gain:
        ok, why = False, f"pass@1 gain not shown: CI lower bound {p1.lo:+.3f} <= {min_gain}"
    else:
        ok, why = True, f"pass@1 diff {p1.diff:+.3f}, 95% CI [{p1.lo:+.3f}, {p1.hi:+.3f}]"
    return Comparison(len(common), tuple(diffs), ok, why, precision(a, b), shares)


def _by_kind(rep: dict[str, Any]) -> str:
    kinds = rep.get("infra_by_kind") or {}
    return ", ".join(f"{k} {n}" for k, n in kinds.items()) or "no class recorded"


def comparison_markdown(c: Comparison) -> str:
    verdict = "REFUSED" if c.refused else "PASSED" if c.passed else "FAILED"
    lines = [f"{c.n_tasks} common tasks — gate {verdict}: {c.reason}", "",
             f"Infrastructure failures (excluded from pass@k): A {c.infra_shares[0]:.1%}, "
             f"B {c.infra_shares[1]:.1%} of samples.",
             "", "| metric | A | B | B - A | 95% CI | better |", "|---|---|---|---|---|---|"]
    for d in c.diffs:
        better = (d.lo > 0) if HIGHER_IS_BETTER[d.metric] else (d.hi < 0)
        worse = (d.hi < 0) if HIGHER_IS_BETTER[d.metric] else (d.lo > 0)
        verdict = "B" if better else ("A" if worse else "=")
        lines.append(f"| {d.metric} | {d.a:.4g} | {d.b:.4g} | {d.diff:+.4g} | "
                     f"[{d.lo:+.4g}, {d.hi:+.4g}] | {verdict} |")
    if c.precision:
        lines += ["", c.precision.markdown()]
    return "\n".join(lines)
