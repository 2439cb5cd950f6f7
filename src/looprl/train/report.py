"""``runs/<name>/report.md`` of a ``looprl train`` run: what was trained, how it evaluated, and
one machine-readable last line.

    heldout_pass1_sft=… heldout_pass1_rl=… delta_ci_low=… delta_ci_high=… rl_minutes=…

The held-out difference and its 95% interval are the bench gate's (``bench.gate.compare``:
a paired bootstrap over tasks), so the report and the gate never disagree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from looprl.bench.gate import Comparison, compare
from looprl.bench.turns import TurnAccuracy
from looprl.rundir import RunDir
from looprl.train.config import TrainConfig
from looprl.train.stages import RLSummary
from looprl.train.start import ModelStart
from looprl.train.tasks import TaskSets
from looprl.trainer.loggers import scalars
from looprl.trainer.step import ENGINE_MISMATCH_TOL

console = Console()

ROWS = (("pass@1", "pass@1"), ("mean output tokens", "mean_output_tokens"),
        ("mean tool calls", "mean_tool_calls"), ("mean turns", "mean_turns"),
        ("broken tool calls / call", "broken_tool_call_rate"))
"""(label, key in a bench summary's ``metrics``) of the evaluation tables."""


@dataclass(frozen=True)
class Evals:
    """Bench summaries (``bench.report.summarize``) of the starting and the trained checkpoint."""

    start: dict[str, Any]
    rl: dict[str, Any]
    start_packages: dict[str, Any] | None = None
    """On the held-out packages (None when the run has none)."""
    rl_packages: dict[str, Any] | None = None

    def gate(self, cfg: TrainConfig) -> Comparison:
        g = cfg.eval.experimental.gate
        return compare(self.start, self.rl, max_drop=g.max_drop, min_gain=g.min_gain,
                       seed=cfg.seed, max_infra_share=g.max_infra_share,
                       max_infra_increase=g.max_infra_increase)

    def packages_gate(self, cfg: TrainConfig) -> Comparison | None:
        if not (self.start_packages and self.rl_packages):
            return None
        g = cfg.eval.experimental.gate
        return compare(self.start_packages, self.rl_packages, seed=cfg.seed,
                       max_infra_share=g.max_infra_share, max_infra_increase=g.max_infra_increase)


def loss_ends(losses: list[float]) -> tuple[float, float]:
    """Mean loss of the first and of the last tenth of the steps (nan, nan: none)."""
    if not losses:
        return float("nan"), float("nan")
    n = max(1, len(losses) // 10)
    return sum(losses[:n]) / n, sum(losses[-n:]) / n


ENGINE_KEYS = (("train/engine_kl", "engine KL (engine − trainer logprob)", ".2e"),
               ("train/engine_mismatch_frac", f"tokens > {ENGINE_MISMATCH_TOL} nat apart", ".4f"),
               ("train/is_ratio_mean", "IS ratio trainer/engine", ".4f"),
               ("train/router_disagree", "MoE router decisions unlike the engine's", ".4f"),
               ("train/moe_aux_loss", "MoE load-balancing loss", ".3f"))
"""The per-step train–inference measures the report sums up (``GRPOStepStats``; a MoE's steps
log the router's two)."""


def engine_line(hist: list[dict[str, Any]]) -> str:
    """The train–inference gap over the steps that trained: each measure's first → last value
    and its mean (skipped steps log none: ``loggers.scalars``).

    >>> engine_line([{"step": 1, "train/tokens": 10, "train/engine_kl": 1e-8,
    ...               "train/engine_mismatch_frac": 0.0, "train/is_ratio_mean": 1.0},
    ...              {"step": 2, "train/tokens": 0, "train/engine_kl": 0.0},
    ...              {"step": 3, "train/tokens": 9, "train/engine_kl": 3e-3,
    ...               "train/engine_mismatch_frac": 0.02, "train/is_ratio_mean": 0.99}])
    'Train–inference, per trained step (2 of 3; `metrics.jsonl`): engine KL (engine − trainer logprob) 1.00e-08 → 3.00e-03 (mean 1.50e-03); tokens > 0.1 nat apart 0.0000 → 0.0200 (mean 0.0100); IS ratio trainer/engine 1.0000 → 0.9900 (mean 0.9950).'
    """
    rows = [scalars(h) for h in hist]
    parts = []
    trained = 0
    for key, name, fmt in ENGINE_KEYS:
        ys = [r[key] for r in rows if key in r]
        trained = max(trained, len(ys))
        if ys:
            parts.append(f"{name} {ys[0]:{fmt}} → {ys[-1]:{fmt}} (mean {sum(ys) / len(ys):{fmt}})")
    if not parts:
        return "No step trained: no train–inference measures."
    return (f"Train–inference, per trained step ({trained} of {len(hist)}; `metrics.jsonl`): "
            + "; ".join(parts) + ".")


def turns_markdown(turns: dict[str, TurnAccuracy]) -> list[str]:
    """Per-tool exact-turn rates on the validation demos, one column per checkpoint."""
    if not turns:
        return []
    labels = list(turns)
    tools = sorted({k for acc in turns.values() for k in acc.by_tool})
    n = {k: max(acc.by_tool[k].turns for acc in turns.values() if k in acc.by_tool) for k in tools}
    lines = ["## Turn accuracy on validation demos", "",
             "Share of the demos' assistant turns that greedy decoding reproduces exactly, given "
             "the demo's own context (teacher-forced; `looprl.bench.turns`).", "",
             "| turn | n | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for k in tools:
        lines.append(f"| {k} | {n[k]} | " + " | ".join(
            f"{turns[lab].exact_rate(k):.3f}" for lab in labels) + " |")
    lines.append("| all | " + str(turns[labels[0]].total.turns) + " | " + " | ".join(
        f"{turns[lab].total.exact_rate:.3f}" for lab in labels) + " |")
    return [*lines, ""]


def _eval_table(title: str, a: dict[str, Any], b: dict[str, Any], cmp: Comparison,
                start_label: str) -> list[str]:
    table = Table("metric", start_label, "RL", title=title)
    md = [f"| metric | {start_label} | RL |", "|---|---|---|"]
    for label, key in ROWS:
        x, y = a["metrics"].get(key, float("nan")), b["metrics"].get(key, float("nan"))
        md.append(f"| {label} | {x:.3f} | {y:.3f} |")
        table.add_row(label, f"{x:.3f}", f"{y:.3f}")
    console.print(table)
    p1 = cmp.diffs[0]
    return [f"## {title}", "",
            f"{cmp.n_tasks} tasks x {a.get('k', 1)} samples. pass@1 RL - {start_label}: "
            f"{p1.diff:+.3f} (95% CI [{p1.lo:+.3f}, {p1.hi:+.3f}]).", "", *md, "",
            *([cmp.precision.markdown(), ""] if cmp.precision else [])]


def write_report(run_dir: Path, cfg: TrainConfig, sets: TaskSets, evals: Evals, *,
                 n_demos: int, sft: dict[str, Any] | None, origin: ModelStart | None,
                 rl: RLSummary, total_minutes: float, turns: dict[str, TurnAccuracy]) -> Path:
    """Write ``report.md`` (and the evaluations as JSON) into ``run_dir``; returns its path.
    ``origin``: what the start was made from (None: not recorded)."""
    start_label = "SFT" if sft else "start"
    gate = evals.gate(cfg)
    pkg_gate = evals.packages_gate(cfg)
    hist = rl.history
    passes = int(hist[-1].get("loop/pass", 1)) if hist else 1  # the walk over the train tasks RL ended in
    seen = {task for h in hist for task in h.get("tasks", ())}
    sources = (cfg.tasks.train_file or ", ".join(cfg.tasks.train_packages)) + (
        f"; trained on whole: {', '.join(cfg.tasks.experimental.train_only_packages)}"
        if cfg.tasks.experimental.train_only_packages else "")
    lines = [
        f"# looprl train — {cfg.name}", "",
        f"Total {total_minutes:.1f} min; RL {rl.minutes:.1f} min, {rl.steps} steps, "
        f"{rl.groups_trained} groups trained, {rl.groups_stale} stale, "
        f"{rl.zero_variance_groups} zero-variance, trainer idle {rl.idle_fraction:.0%}"
        + (f"; {rl.groups_screened_out} screened out ({rl.screen_rollouts} rollouts)"
           if rl.groups_screened_out else "")
        + (f"; in pass {passes} of {cfg.loop.experimental.passes} over the train tasks" if passes > 1 else
           f"; {len(seen)} of the {len(sets.train)} train tasks rolled out")
        + (f"; schedule {hist[-1]['loop/schedule']}" if hist and "loop/schedule" in hist[-1] else "")
        + ".", "",
        *[line for h in hist if "loop/schedule_decision" in h
          for line in (f"{h['loop/schedule_decision']}.", "")],
        *([f"**{rl.no_pass_warning()}** (`train/no_pass_groups` in metrics.jsonl).", ""]
          if rl.learned_from_no_pass else []),
        f"Tasks: {len(sets.train)} train, {len(sets.heldout)} held-out functions"
        + (f", {len(sets.heldout_packages)} of held-out packages "
           f"({', '.join(cfg.tasks.heldout_packages)})" if sets.heldout_packages else "")
        + f" (from {sources}).",
        *([f"Start: {origin.describe()}."] if origin else []),
    ]
    if cfg.tasks.train_packages:
        lines.append(f"Task kinds: {', '.join(f'{k} {v:.0%}' for k, v in cfg.tasks.experimental.mix.items())}; "
                     f"mutations: {', '.join(cfg.tasks.experimental.kinds)}.")
    if cfg.tasks.experimental.selection:
        width = cfg.tasks.experimental.selection_width
        lines.append(f"Prompts carry the user's editor selection ({width} width: the buggy code "
                     "with its path and "
                     f"lines, never the fix) in {sum(bool(t.metadata.get('selection')) for t in sets.heldout)}"
                     f" of {len(sets.heldout)} held-out tasks.")
    if sft:
        first, last = loss_ends(sft["losses"])
        lines += [f"SFT: {n_demos} demos, {sft['steps']} steps, loss {first:.3f} → {last:.3f} "
                  "(means of the first and last tenth of the steps; one step's loss swings with "
                  "the demos it draws).", "", "![SFT loss](sft_loss.png)"]
    lines += ["", *_eval_table("Held-out functions", evals.start, evals.rl, gate, start_label)]
    if pkg_gate and evals.start_packages and evals.rl_packages:
        lines += _eval_table("Held-out packages (never trained on)", evals.start_packages,
                             evals.rl_packages, pkg_gate, start_label)
    lines += [f"Gate ({'passed' if gate.passed else 'FAILED'}): {gate.reason}.", "",
              *turns_markdown(turns),
              "## Training", "", "![reward curve](reward_curve.png)", "",
              f"First step reward {hist[0].get('reward/total_mean', 0):+.3f} → last "
              f"{hist[-1].get('reward/total_mean', 0):+.3f}." if hist else "No RL step ran.", "",
              *([engine_line(hist), ""] if hist else [])]
    p1 = gate.diffs[0]
    summary = (f"heldout_pass1_sft={p1.a:.4f} heldout_pass1_rl={p1.b:.4f} delta_ci_low={p1.lo:.4f} "
            f"delta_ci_high={p1.hi:.4f} rl_minutes={rl.minutes:.2f}")
    if pkg_gate:
        q = pkg_gate.diffs[0]
        summary += (f" packages_pass1_sft={q.a:.4f} packages_pass1_rl={q.b:.4f} "
                 f"packages_ci_low={q.lo:.4f} packages_ci_high={q.hi:.4f}")
    path = RunDir(run_dir).report
    path.write_text("\n".join([*lines, summary]) + "\n")
    if turns:
        RunDir(run_dir).turn_accuracy.write_text(json.dumps(
            {lab: acc.to_json() for lab, acc in turns.items()}, indent=1))
    return path


def write_stopped_report(run_dir: Path, cfg: TrainConfig, stage: str, rows: list[dict[str, Any]],
                         checkpoint: str | None) -> Path:
    """``report.md`` of a run stopped by Ctrl-C: where it stopped, what it kept, how RL went so
    far, and how to continue (``--resume`` replaces this with the full report)."""
    lines = [f"# looprl train — {cfg.name} (stopped)", "",
             f"Stopped by Ctrl-C in the {stage} stage; every finished stage is kept in "
             f"`{run_dir}`. Continue with the same `looprl train` command and `--resume`.", ""]
    if rows:
        first, last = rows[0], rows[-1]
        groups = sum(len(r.get("tasks", ())) for r in rows)
        lines += [f"RL: {len(rows)} steps logged, {groups} groups, "
                  f"{float(last.get('elapsed_s', 0)) / 60:.1f} min; reward "
                  f"{float(first.get('reward/total_mean', 0)):+.3f} → "
                  f"{float(last.get('reward/total_mean', 0)):+.3f}, pass rate "
                  f"{float(last.get('rollout/pass_rate', 0)):.2f} at the last step.",
                  (f"The newest checkpoint is `ckpt/{checkpoint}`: --resume continues from it."
                   if checkpoint else "No checkpoint was saved yet: --resume starts RL over."),
                  ""]
    lines.append("The trained model is not saved and not evaluated until RL ends.")
    path = RunDir(run_dir).report
    path.write_text("\n".join(lines) + "\n")
    return path
