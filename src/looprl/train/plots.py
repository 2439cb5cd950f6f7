"""The charts of a ``looprl train`` run's report: ``reward_curve.png`` (mean reward, pass rate, the
trainer/engine IS ratio and the engine KL per GRPO step), drawn from the loop's metrics rows when
RL ends.

    plot_curves(stats.history, RunDir(run_dir).reward_curve)   # GRPOLoop.run's LoopStats

``report.md`` shows the picture; the dashboard draws the same rows as live charts of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from looprl.trainer.loggers import scalars


def rolling_mean(ys: Sequence[float], w: int) -> list[float]:
    """Mean of each value and the ``w - 1`` before it, skipping NaN (a step that logged none).

    >>> rolling_mean([1.0, float("nan"), 3.0, 5.0], 2)
    [1.0, 1.0, 3.0, 4.0]
    """
    out = []
    for i in range(len(ys)):
        window = [y for y in ys[max(0, i - w + 1):i + 1] if y == y]
        out.append(sum(window) / len(window) if window else float("nan"))
    return out


def plot_curves(history: list[dict[str, float]], path: Path) -> Path:
    """Reward, pass rate, IS ratio and engine KL per step in one PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for ax, key, title in ((axes[0], "reward/total_mean", "mean reward"),
                           (axes[1], "rollout/pass_rate", "pass rate (hidden tests)"),
                           (axes[2], "train/is_ratio_mean", "IS ratio trainer/engine (mean)"),
                           (axes[3], "train/engine_kl", "engine KL (engine - trainer logprob)")):
        ys = [scalars(h).get(key, float("nan")) for h in history]  # a skipped step: a gap
        trend = key.startswith(("reward/", "rollout/")) and len(ys) >= 20
        ax.plot(steps, ys, marker="o", ms=3, lw=0.8, alpha=0.4 if trend else 1.0, label="per step")
        if trend:  # one step's 4 groups swing widely: the trend is what tells whether RL learns
            w = len(ys) // 10
            ax.plot(steps, rolling_mean(ys, w), lw=2.2, label=f"mean of the last {w} steps")
            ax.legend(fontsize=8, loc="lower right")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
