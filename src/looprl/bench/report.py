"""Bench metrics from graded samples: pass@1, pass@k (unbiased), effort, and the report files.

    rep = summarize(samples, k=4)          # -> dict of metrics + per-task records
    write_report(rep, "bench.json")        # also bench.md (table) and bench.png (chart)

Infra-failed samples (``score is None``) are counted in ``infra_errors`` (their share in
``metrics["infra_share"]``, beside pass@k, and by class in ``infra_by_kind``) and excluded from
every other metric: they say nothing about the policy. A report with many is not evidence either
way, and ``bench.gate`` refuses to gate on it.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict
from math import comb
from pathlib import Path
from typing import Any

from looprl.bench.run import Sample

PER_TASK_METRICS = ("pass@1", "output_tokens", "tool_calls", "turns", "wall_s",
                    "broken_tool_calls")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021).

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), pass_at_k(4, 0, 2), round(pass_at_k(5, 2, 2), 3)
    (0.25, 1.0, 0.0, 0.7)
    """
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def per_task(samples: list[Sample], k: int) -> dict[str, dict[str, Any]]:
    """task id -> its metrics over its graded samples (tasks with none graded are left out)."""
    by_task: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.score is not None:
            by_task[s.task_id].append(s)
    out = {}
    for tid, ss in sorted(by_task.items()):
        n, c = len(ss), sum(1 for s in ss if s.score == 1.0)
        out[tid] = {"n": n, "correct": c, "pass@1": c / n, f"pass@{k}": pass_at_k(n, c, min(k, n)),
                    **{m: statistics.fmean(getattr(s, m) for s in ss)
                       for m in PER_TASK_METRICS if m != "pass@1"},
                    "source_kind": ss[0].metadata.get("source_kind") or "?"}
    return out


def summarize(samples: list[Sample], k: int, policy: str = "", tasks_file: str = "") -> dict[str, Any]:
    tasks = per_task(samples, k)
    graded = [s for s in samples if s.score is not None]

    def mean(key: str) -> float:
        return statistics.fmean(t[key] for t in tasks.values()) if tasks else 0.0

    calls = sum(s.tool_calls for s in graded)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for t in tasks.values():
        by_kind[str(t["source_kind"])].append(float(t["pass@1"]))
    metrics = {
        "pass@1": mean("pass@1"), f"pass@{k}": mean(f"pass@{k}"),
        "mean_output_tokens": mean("output_tokens"), "mean_tool_calls": mean("tool_calls"),
        "mean_turns": mean("turns"), "mean_wall_s": mean("wall_s"),
        "broken_tool_calls_per_sample": mean("broken_tool_calls"),
        "broken_tool_call_rate": (sum(s.broken_tool_calls for s in graded) / calls) if calls else 0.0,
        "edited_tests_rate": (sum(s.edited_tests for s in graded) / len(graded)) if graded else 0.0,
        "infra_share": infra_share({"n_samples": len(samples),
                                    "infra_errors": len(samples) - len(graded)}),
    }
    lost = Counter(s.infra_kind or "internal" for s in samples if s.score is None)
    return {"policy": policy, "tasks_file": tasks_file, "k": k, "n_tasks": len(tasks),
            "n_samples": len(samples), "infra_errors": len(samples) - len(graded),
            "infra_by_kind": dict(sorted(lost.items())), "metrics": metrics,
            "pass@1_by_kind": {kd: statistics.fmean(v) for kd, v in sorted(by_kind.items())},
            "per_task": tasks, "samples": [asdict(s) for s in samples]}


def infra_share(rep: dict[str, Any]) -> float:
    """The share of a report's samples that infrastructure took (0 for a report without any).

    >>> infra_share({"n_samples": 40, "infra_errors": 3}), infra_share({"per_task": {}})
    (0.075, 0.0)
    """
    n = int(rep.get("n_samples", 0))
    return int(rep.get("infra_errors", 0)) / n if n else 0.0


def markdown(rep: dict[str, Any]) -> str:
    m = rep["metrics"]
    by_kind = ", ".join(f"{kd} {n}" for kd, n in rep.get("infra_by_kind", {}).items())
    lines = [f"### bench: {rep['policy']} on {rep['tasks_file']} ({rep['n_tasks']} tasks, "
             f"k={rep['k']}, {rep['infra_errors']} infra errors excluded)", "",
             "| metric | value |", "|---|---|"]
    lines += [f"| {name} | {v:.4g} |" for name, v in m.items()]
    lines += [f"| infra failures | {rep['infra_errors']} of {rep['n_samples']} samples"
              f"{': ' + by_kind if by_kind else ''} |"]
    if rep["pass@1_by_kind"]:
        lines += ["", "| source kind | pass@1 |", "|---|---|"]
        lines += [f"| {kd} | {v:.3f} |" for kd, v in rep["pass@1_by_kind"].items()]
    return "\n".join(lines) + "\n"


def plot(rep: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(rep["pass@1_by_kind"]) + ["all"]
    vals = list(rep["pass@1_by_kind"].values()) + [rep["metrics"]["pass@1"]]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(kinds, vals, color=["#4c72b0"] * (len(kinds) - 1) + ["#dd8452"])
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1")
    ax.set_title(f"{rep['policy']}: pass@1 by source kind (n={rep['n_tasks']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(rep: dict[str, Any], out: str | Path) -> tuple[Path, Path, Path]:
    """Write ``out`` (JSON), and beside it ``.md`` and ``.png``."""
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rep, indent=1))
    md, png = p.with_suffix(".md"), p.with_suffix(".png")
    md.write_text(markdown(rep))
    plot(rep, png)
    return p, md, png
