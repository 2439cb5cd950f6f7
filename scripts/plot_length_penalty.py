"""Plot the length (effort) penalty for a few curvatures q -> docs/length_penalty.png.

    .venv/bin/python scripts/plot_length_penalty.py [--out docs/length_penalty.png]

Uses the defaults of ``looprl.rewards.length.LengthConfig`` (λ, k) and its ``penalty_curve``, so
the picture is the function the trainer uses. The dashed line is the default cap.
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")  # headless: no display on training machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from looprl.rewards.length import LengthConfig, penalty_curve  # noqa: E402

QS = (0.0, 0.5, 1.0, 1.5, 2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/length_penalty.png")
    parser.add_argument("--max-effort", type=float, default=20_000.0)
    args = parser.parse_args()
    cfg = LengthConfig()
    c_N = np.linspace(0.0, args.max_effort, 800)
    fig, (ax, ax_zoom) = plt.subplots(1, 2, figsize=(11, 4.2))
    for q in QS:
        label = f"q = {q:g}" + {0.0: " (linear)", 1.0: " (log, default)"}.get(q, "")
        p_N = [penalty_curve(float(c), cfg.coef, cfg.k, q) for c in c_N]
        ax.plot(c_N, p_N, label=label)
        zoom_N = c_N[c_N <= 1000]
        ax_zoom.plot(zoom_N, p_N[: len(zoom_N)], label=label)
    for a in (ax, ax_zoom):
        if cfg.max_penalty is not None:
            a.axhline(-cfg.max_penalty, color="gray", ls="--", lw=1, label="default cap")
        a.set_xlabel("effort C (weighted tokens, tool calls, turns)")
        a.grid(alpha=0.3)
    ax.set_ylim(-1.6, 0.05)
    ax.set_ylabel("length penalty")
    ax.set_title(f"−λ((1+kC)^(1−q) − 1)/(k(1−q)),  λ={cfg.coef:g}, k={cfg.k:g}")
    ax_zoom.set_title("small C: steep start, slope −λ")
    ax_zoom.set_ylim(-1.0, 0.02)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
