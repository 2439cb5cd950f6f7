"""The report of a real-time RL loop (``feedback.loop``): ``RUN/report.md`` and its plots.

    write_loop_report(result, store, cfg)   # RUN/report.md, RUN/ab.png, RUN/gate.png

Per A/B (each cycle's, and the final one): for each arm the sessions it served and, with 95%
bootstrap intervals, the share of sessions whose edit was kept, the share with an edit, the kept
rate, reverted rate, dissatisfied follow-ups and latency; the difference B - A with its interval
(``feedback.ab``), and kept B - A within the requests both arms edited.
The arm tables count every session of the A/B's experiment, those that finished after the
decision too; the cycle table shows what the decision saw. Per cycle: the window, the training
step, the gate's pass@1 of both versions and its interval. Then where every session went, and the
machine-readable last line (``LoopResult.line``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from looprl.feedback.ab import arm_values, mean_interval
from looprl.rundir import RunDir

PLOTTED = (("resolved", "requests resolved: edits kept (share)"),
           ("edited", "sessions with an edit (share)"), ("kept", "edits kept (share)"),
           ("reverted", "edits reverted (share)"),
           ("dissatisfied", "dissatisfied follow-ups (share)"), ("latency", "latency (s)"))


def arm_table(store: Any, signal: str, experiment: str, versions: dict[str, int]
              ) -> dict[str, dict[str, Any]]:
    """arm -> {version, served, scored, metric -> (mean, lo, hi) or None}."""
    values, served, _ = arm_values(store, signal=signal, experiment=experiment,
                                   policy_versions=versions)
    out: dict[str, dict[str, Any]] = {}
    for arm, version in versions.items():
        vs = values.get(arm, [])
        row: dict[str, Any] = {"version": version, "served": served.get(arm, 0),
                               "scored": sum("reward" in v for v in vs)}
        for m, _ in PLOTTED:
            xs = [v[m] for v in vs if m in v]
            row[m] = mean_interval(xs) if xs else None
        out[arm] = row
    return out


def _ab_runs(res: Any, cfg: Any) -> list[tuple[str, str, dict[str, int], dict[str, Any]]]:
    """(label, experiment, arm versions, A/B report dict) of every A/B the run held."""
    out = []
    for r in res.cycles:
        if r.ab:
            out.append((f"cycle {r.cycle}", f"{cfg.name}-c{r.cycle}",
                        {"A": r.policy_version, "B": r.candidate_version}, r.ab))
    if res.final_ab.get("final"):
        out.append(("final", f"{cfg.name}-final",
                    {"A": res.final_ab["a"], "B": res.final_ab["b"]}, res.final_ab))
    return out


def _fmt(v: tuple[float, float, float] | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v[0]:.{digits}f} [{v[1]:.{digits}f}, {v[2]:.{digits}f}]"


def plot_ab(tables: list[tuple[str, dict[str, dict[str, Any]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(4 * len(PLOTTED), 3.4))
    labels = [lab for lab, _ in tables]
    for ax, (m, title) in zip(axes, PLOTTED, strict=True):
        for k, (arm, color) in enumerate((("A", "#4c72b0"), ("B", "#dd8452"))):
            xs, ys, err = [], [], [[], []]
            for i, (_, tab) in enumerate(tables):
                v = tab.get(arm, {}).get(m)
                if v is not None:
                    xs.append(i + (k - 0.5) * 0.25)
                    ys.append(v[0])
                    err[0].append(v[0] - v[1])
                    err[1].append(v[2] - v[0])
            ax.errorbar(xs, ys, yerr=err, fmt="o", color=color, capsize=3,
                        label=f"arm {arm} ({'current / control' if arm == 'A' else 'candidate'})")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        if m != "latency":
            ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle("A/B per cycle: arm means with 95% bootstrap intervals", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_gate(rows: list[Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gated = [r for r in rows if r.gate.get("pass1_current") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    if gated:
        x = [r.cycle for r in gated]
        ax.plot(x, [r.gate["pass1_current"] for r in gated], "o-", label="current")
        ax.plot(x, [r.gate["pass1_candidate"] for r in gated], "s--", label="candidate")
        for r in gated:
            ax.annotate(r.status + (" (noise)" if r.injected else ""),
                        (r.cycle, r.gate["pass1_candidate"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
        ax.set_xticks(x)
    ax.set_xlabel("cycle")
    ax.set_ylabel("held-out pass@1 (gate)")
    ax.set_title("bench gate per cycle")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_loop_report(res: Any, store: Any, cfg: Any) -> Path:
    """``RUN/report.md`` with ``ab.png`` and ``gate.png`` beside it."""
    run: Path = res.run
    tables = [(label, arm_table(store, cfg.signal, exp, versions), rep)
              for label, exp, versions, rep in _ab_runs(res, cfg)]
    lines = [f"# Real-time RL loop `{run.name}`", "",
             f"Start policy `{cfg.model}`; {len(res.cycles)} cycles; windows of {cfg.window} "
             f"scored sessions, {cfg.steps} GRPO steps each (lr {cfg.grpo.lr:g}); A/B "
             f"{cfg.ab.sessions} scored sessions per arm, split {cfg.ab.split_b}.", "",
             *([f"**Stopped early** ({res.stopped}): the cycles below are the finished ones.",
                ""] if res.stopped else []),
             "## Cycles", "",
             "| cycle | current | candidate | window (sessions, mean reward) | gate pass@1 "
             "current → candidate [95% CI of diff] | A/B reward B − A [95% CI] | status | "
             "minutes |", "|---|---|---|---|---|---|---|---|"]
    for r in res.cycles:
        g = r.gate
        gate = (f"{g['pass1_current']:.3f} → {g['pass1_candidate']:.3f} "
                f"[{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]" if g.get("pass1_current") is not None
                else (g.get("reason", "—") if g else "—"))
        d = r.ab.get("diffs", {}).get("reward", {}) if r.ab else {}
        ab = (f"{d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]" if d.get("diff") is not None
              else "—")
        win = (f"{r.window['sessions']}, {r.window['mean_reward']:+.3f}" if r.window else "—")
        mins = ", ".join(f"{k} {v:.1f}" for k, v in r.minutes.items())
        lines.append(f"| {r.cycle}{' (noise)' if r.injected else ''} | v{r.policy_version} | "
                     f"{'—' if r.candidate_version is None else f'v{r.candidate_version}'} "
                     f"| {win} | {gate} | {ab} | **{r.status}**: {r.reason} | {mins} |")
    for label, tab, rep in tables:
        lines += ["", f"## A/B: {label}", "",
                  "| arm | version | served | scored | resolved | edited | kept | reverted | "
                  "dissatisfied | latency (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for arm, row in tab.items():
            lines.append(f"| {arm} | v{row['version']} | {row['served']} | {row['scored']} | "
                         + " | ".join(_fmt(row[m], 1 if m == "latency" else 3)
                                      for m, _ in PLOTTED) + " |")
        diffs = rep.get("diffs", {})
        lines.append("| B − A | | | | " + " | ".join(
            "—" if diffs.get(m, {}).get("diff") is None else
            f"{diffs[m]['diff']:+.3f} [{diffs[m]['lo']:+.3f}, {diffs[m]['hi']:+.3f}]"
            for m, _ in PLOTTED) + " |")
        w = diffs.get("kept_within_requests", {})
        if w.get("diff") is not None:
            lines += ["", f"Kept within requests (the {w['strata']} requests both arms edited, "
                          f"weighted by their edited sessions): B − A {w['diff']:+.3f} "
                          f"[{w['lo']:+.3f}, {w['hi']:+.3f}]."]
    acc = res.accounting
    lines += ["", "## Sessions", "",
              f"sent by users {acc['sent']}, stored {acc['stored']} (lost {acc['lost']}, stored "
              f"but never sent {acc['unknown']}): trained {acc['trained']}, waiting (scored, of "
              f"the policy served now) {acc['waiting']}, superseded (scored after their policy's "
              f"window, policy since replaced) {acc['superseded']}, A/B-only (served by a "
              f"rolled-back candidate) "
              f"{acc['ab_only']}, no feedback {acc['unscored']}, infrastructure failures "
              f"{acc['infra']}; trained twice: {acc['trained_twice']}.", "",
              "![A/B per cycle](ab.png)", "", "![gate](gate.png)", "", "```", res.line(), "```",
              ""]
    if tables:
        plot_ab([(label, tab) for label, tab, _ in tables], RunDir(run).ab_plot)
    plot_gate(res.cycles, RunDir(run).gate_plot)
    out = RunDir(run).report
    out.write_text("\n".join(lines))
    return out
