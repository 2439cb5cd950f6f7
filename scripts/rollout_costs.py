"""Where a run's RL rollout time went: passing against failing trajectories (turns, model tokens,
wall seconds, the longest turn of a pass), and how many groups had no pass (the rollouts that
trained nothing when ``grpo.skip_groups_without_pass``), from ``trajectories/train.jsonl``.

    .venv/bin/python scripts/rollout_costs.py runs/quickstart [runs/OTHER ...]

What it is for: choosing the RL rollout budget (``rollout.agent.max_turns``,
``max_new_tokens``) and the difficulty screen (``rollout.screen``) from what passes actually
need and what failures cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from looprl.rundir import RunDir


def _passed(rec: dict) -> bool:
    comps = (rec.get("reward") or {}).get("components", {})
    return comps.get("tests", 0.0) >= 1.0 and "grader_attack" not in comps


def _longest_turn(rec: dict) -> int:
    """Model tokens of the longest run of loss-masked tokens (one assistant turn)."""
    best = run = 0
    for seg in rec["segments"]:
        for m in seg["loss_mask_T"]:
            run = run + 1 if m else 0
            best = max(best, run)
    return best


def _pct(xs: list[int], q: float) -> int:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)] if xs else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args()
    turns: dict[bool, Counter[int]] = {True: Counter(), False: Counter()}
    tokens: dict[bool, list[int]] = {True: [], False: []}
    wall: dict[bool, list[float]] = {True: [], False: []}
    longest: list[int] = []
    groups: dict[str, list[bool]] = defaultdict(list)
    for run in args.runs:
        with open(RunDir(run).train_trajectories, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                ok = _passed(rec)
                turns[ok][rec["counters"]["turns"]] += 1
                tokens[ok].append(rec["counters"]["output_tokens"])
                wall[ok].append(rec["wall_s"])
                groups[f"{run}:{rec['group_id']}"].append(ok)
                if ok:
                    longest.append(_longest_turn(rec))
    total_wall = sum(wall[True]) + sum(wall[False])
    for ok, name in ((True, "passing"), (False, "failing")):
        n = len(tokens[ok])
        if not n:
            print(f"{name}: none")
            continue
        print(f"{name}: {n} trajectories, turns {dict(sorted(turns[ok].items()))}, "
              f"model tokens mean {statistics.mean(tokens[ok]):.0f} (p95 {_pct(tokens[ok], .95)}), "
              f"wall mean {statistics.mean(wall[ok]):.1f} s, "
              f"{sum(wall[ok]) / max(total_wall, 1e-9):.0%} of all rollout wall time")
    if longest:
        print(f"longest turn of a passing trajectory (model tokens): p50 {_pct(longest, .5)}, "
              f"p95 {_pct(longest, .95)}, p99 {_pct(longest, .99)}, max {max(longest)}")
    no_pass = sum(not any(v) for v in groups.values())
    print(f"groups: {len(groups)}, with no pass {no_pass} ({no_pass / max(len(groups), 1):.0%})")
    print(f"pass_wall_share={sum(wall[True]) / max(total_wall, 1e-9):.3f} "
          f"no_pass_groups={no_pass / max(len(groups), 1):.3f}")


if __name__ == "__main__":
    main()
