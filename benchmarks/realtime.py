"""Does real-time RL make users better off? The loop (``looprl feedback loop``) at quickstart
scale: serve the quickstart's policy to simulated users, cycle (window -> train -> gate -> A/B ->
promote or roll back, one cycle's candidate deliberately broken), then an A/B of the start policy
(control, arm A) against the last promoted one (the real-time RL arm, B).

    .venv/bin/python benchmarks/realtime.py [-o key=value ...]    # after `make quickstart`

The baseline is the control arm, measured in the same run on live traffic split by user. The last
line is machine-readable (``LoopResult.line``):

    cycles=… sessions=… kept_delta=… kept_ci_low=… kept_ci_high=… dissatisfied_delta=…
    latency_delta=… rollback_ok=… lost=… trained_twice=… edited_delta=… resolved_delta=…
    resolved_ci_low=… resolved_ci_high=… kept_within_delta=… kept_within_ci_low=…
    kept_within_ci_high=…

``kept_delta`` is the real-time RL arm's kept rate minus the control's, with its 95% bootstrap
interval; ``rollback_ok=1`` when the broken candidate was rejected by the gate or rolled back by
the A/B; ``lost`` counts sessions users sent that the store lacks; ``trained_twice`` sessions two
cycles trained on; ``edited_delta`` the change in the share of sessions with an edit (kept is
measured over those, so read the two together); ``resolved_*`` the change in edits kept per request
(a session with no edit counts 0, answered or not: what users got, and what the A/B decisions
weigh beside the reward); ``kept_within_*`` kept B − A within the requests both
arms edited (does B fix the same requests better, or only edit easier ones). The run's report
(tables with every arm's intervals, plots) is ``runs/NAME/report.md``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from looprl.config import load_config
from looprl.feedback.loop import run_loop
from looprl.feedback.realtime_config import RealtimeConfig
from looprl.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-c", "--config", default=str(ROOT / "configs" / "realtime.toml"))
    ap.add_argument("-o", "--override", action="append", default=[],
                    help="key=value over the config (repeatable), e.g. -o name=rt2")
    ap.add_argument("--runs", default="runs")
    args = ap.parse_args()
    cfg = load_config(RealtimeConfig, args.config, args.override)
    t0 = time.monotonic()
    res = run_loop(cfg, args.runs)
    print(f"report: {RunDir(res.run).report}; {(time.monotonic() - t0) / 60:.1f} min; "
          f"sessions: {res.accounting}")
    print(res.line())
    if res.stopped:
        raise SystemExit(f"stopped early: {res.stopped}")


if __name__ == "__main__":
    main()
