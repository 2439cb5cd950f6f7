"""What a candidate must pass before users keep it: the bench gate, then (in the loop) the A/B.

    verdict = gate(current, candidate, tasks, k=1, settings=BenchSettings(...),
                   reports=(RUN / "gate" / "v0003.json", RUN / "gate" / "v0004.json"),
                   max_drop=0.1)                      # {"passed": True | False | None, ...}
    action, why = ab_decision(ab_report(...), margin=0.1, max_revert_rise=0.05)

The gate: ``looprl.bench`` runs the current policy and the candidate on held-out tasks and
``bench.gate.compare`` takes a paired bootstrap interval of the pass@1 difference; the candidate
passes when the interval's low end stays above ``-max_drop``. A bench that graded nothing is an
infrastructure failure, never the model's fault: the verdict is None, and each caller decides
what an ungated candidate does.

The A/B decision (``ab_decision``) weighs what live users did with each arm's edits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from looprl.feedback.policies import PolicyRef
from looprl.types import Task

if TYPE_CHECKING:
    from looprl.bench.run import BenchSettings
    from looprl.feedback.ab import ABReport


def bench_policy(path: Path, tasks: list[Task], k: int, settings: BenchSettings, out: Path
                 ) -> dict[str, Any]:
    """``looprl.bench`` of one policy on ``tasks``, written to ``out``; an ``out`` that exists is
    read back instead (a version's weights never change, so the current policy is benched once
    however many candidates it meets)."""
    from looprl.bench.report import summarize, write_report
    from looprl.bench.run import run_bench

    if out.is_file():
        return json.loads(out.read_text())
    policy = f"model:{path}"
    rep = summarize(run_bench(tasks, policy, k, settings), k, policy)
    write_report(rep, out)
    return rep


def gate_reports(current: dict[str, Any], candidate: dict[str, Any], max_drop: float,
                 min_gain: float = 0.0) -> dict[str, Any]:
    """The gate's verdict on two bench reports of the same tasks (``bench.gate.compare``, a paired
    bootstrap of pass@1): ``passed`` True/False, or None when a bench graded nothing (an
    infrastructure failure, never the model's fault)."""
    from looprl.bench.gate import compare

    if not current["n_tasks"] or not candidate["n_tasks"]:
        errors = {s["error"] for r in (current, candidate) for s in r["samples"] if s["error"]}
        return {"passed": None, "n_tasks": 0, "reason": "the bench graded no task (infrastructure "
                f"errors, never the model's fault): {sorted(errors)[:2]}"}
    # a screen before the users' A/B, which decides: a candidate no worse on tasks neither
    # policy solves goes on to it (the A/B's resolved share and follow-ups tell them apart)
    c = compare(current, candidate, max_drop=max_drop, min_gain=min_gain, zero_is_evidence=True)
    p1 = c.diffs[0]
    return {"passed": c.passed, "reason": c.reason, "n_tasks": c.n_tasks,
            "pass1_current": p1.a, "pass1_candidate": p1.b, "ci_low": p1.lo, "ci_high": p1.hi}


def gate(current: PolicyRef, candidate: PolicyRef, tasks: list[Task], k: int,
         settings: BenchSettings, reports: tuple[Path, Path], max_drop: float,
         min_gain: float = 0.0) -> dict[str, Any]:
    """Bench both policies on the held-out ``tasks`` (their reports at ``reports``: current's,
    candidate's) and compare them (``gate_reports``)."""
    return gate_reports(bench_policy(current.path, tasks, k, settings, reports[0]),
                        bench_policy(candidate.path, tasks, k, settings, reports[1]),
                        max_drop, min_gain)


def ab_decision(rep: ABReport, margin: float, max_revert_rise: float) -> tuple[str, str]:
    """promote | rollback from an ``ab.ABReport``: on ``resolved`` (what users got: the reward
    over scored sessions alone favours a candidate that edits less and leaves its failures to
    silence, ``ab.py``) and on ``reward`` (what they said: where neither arm edits, ``resolved``
    is 0 on both and only the follow-ups tell them apart). Both must be not lower and not worse
    by more than the margin: ``margin`` for ``resolved``, twice it for the reward, whose edit
    term (2 * kept share - 1) spans twice the range. Reverts must not rise by more than
    ``max_revert_rise`` (the interval's low end)."""
    rev = rep.diffs["reverted"]
    if rev.lo is not None and rev.lo > max_revert_rise:
        return "rollback", (f"reverts rose: B - A {rev.diff:+.3f}, 95% CI low end {rev.lo:+.3f} "
                            f"> {max_revert_rise}")
    shown = []
    for metric, m in (("resolved", margin), ("reward", 2 * margin)):
        d = rep.diffs[metric]
        if d.lo is None or d.hi is None or d.diff is None:
            return "rollback", f"an arm has no {metric}: nothing shows the candidate is as good"
        ci = d.ci()
        if d.diff < 0:
            return "rollback", f"{ci}: lower"
        if d.lo < -m:
            return "rollback", f"{ci}: may be worse by more than {m:g}"
        shown.append(ci)
    return "promote", f"{'; '.join(shown)}: neither lower nor worse by more than the margin"
