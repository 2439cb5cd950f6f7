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

``--arm follow-up-hints``: do users' follow-ups, used as hints (``feedback.follow_ups``), make
the window's update better for users? One window of the start policy's sessions is trained twice
from the same start, the same Adam state and the same seed: arm A on the window's rewards alone,
arm B on the same groups carrying the follow-ups' hinted continuations (distilled with
``grpo.experimental.feedback.coef``). Then A serves and B is offered beside it to half the users
(split by user, live, interleaved) until each arm has ``ab.final_sessions`` scored sessions. An
arm whose steps applied no update serves the start policy. The last line:

    arm=follow_up_hints window=… hints=… hinted=… updates_a=… updates_b=… hint_kl=… scored_a=…
    scored_b=… kept_a=… kept_b=… edited_a=… edited_b=… reward_delta=… reward_ci_low=…
    reward_ci_high=… dissatisfied_delta=… dissatisfied_ci_low=… dissatisfied_ci_high=…
    kept_delta=… kept_ci_low=… kept_ci_high=…

``kept_delta`` is B's kept rate minus A's with its 95% bootstrap interval (``feedback.ab``); kept
is over the sessions with an edit (``edited_*``), so it is nan when an arm edited nothing, and the
reward and the share of dissatisfied follow-ups (defined either way) come beside it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from looprl.config import load_config, save_config
from looprl.feedback.loop import init_run, run_loop
from looprl.feedback.loop_cycle import CycleRow, Loop
from looprl.feedback.policies import PolicyRef, next_version, promote
from looprl.feedback.production import start_production
from looprl.feedback.realtime_config import RealtimeConfig
from looprl.feedback.update import make_candidate, window_optimizer
from looprl.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]


def _fmt(x: float | None) -> str:
    return "nan" if x is None else f"{x:.4f}"


def follow_up_hint_arms(cfg: RealtimeConfig, runs: str) -> str:
    """The ``--arm follow-up-hints`` run (module docstring); returns its last line."""
    fb = cfg.grpo.experimental.feedback
    if not (fb.follow_ups and fb.coef > 0):
        raise SystemExit("--arm follow-up-hints: set -o grpo.experimental.feedback.follow_ups="
                         "true -o grpo.experimental.feedback.coef=0.5 (arm B's distillation)")
    if not cfg.ab.final_sessions:
        raise SystemExit("--arm follow-up-hints: set -o ab.final_sessions=N (scored per arm)")
    run = Path(runs) / cfg.name
    if RunDir(run).policies.exists():
        raise SystemExit(f"{run} holds a run already; pick another name (-o name=...)")
    run.mkdir(parents=True)
    save_config(cfg, RunDir(run).config)
    start = init_run(cfg, run)
    loop = Loop(cfg, run, print)
    loop.prod = start_production(cfg, run, loop.policies, RunDir(run).feedback_db)
    try:
        row = CycleRow(1, start.version)
        collected = loop.collect(row, start)
        if collected is None:
            raise SystemExit("the window did not fill")
        trajs, groups = collected
        arms: dict[str, tuple[PolicyRef, dict[str, float]]] = {}
        state, momentum = window_optimizer(cfg, Path(start.path))
        for arm, gs in (("A", groups), ("B", loop.follow_ups(row, start, trajs, groups))):
            cand, metrics = make_candidate(
                start, gs, cfg.grpo, loop.policies, next_version(loop.policies, start.version),
                {"parent_version": start.version, "arm": arm, "sessions": len(trajs)},
                steps=cfg.steps, seed=cfg.seed + 1, optimizer=state, momentum=momentum)
            arms[arm] = (cand or start, metrics)
            print(f"arm {arm}: v{arms[arm][0].version}, {metrics['updates']:.0f} updates, "
                  f"{metrics['hints']:.0f} hints, hint_kl {metrics['hint_kl']:.4f}")
        (a, ma), (b, mb) = arms["A"], arms["B"]
        promote(loop.policies, a.version)
        loop.prod.wait_serving("A", a.version)
        rep = loop.ab(a, b, f"{cfg.name}-hints", cfg.ab.final_sessions)
    finally:
        loop.prod.stop()
    (run / "arms.json").write_text(json.dumps({"window": row.window, "A": ma, "B": mb,
                                               "ab": rep.to_dict()}, indent=1))
    kept, reward, dis = (rep.diffs[k] for k in ("kept", "reward", "dissatisfied"))
    return (f"arm=follow_up_hints window={row.window['sessions']} "
            f"hints={row.window['follow_up_hints']} hinted={row.window['hinted']} "
            f"updates_a={ma['updates']:.0f} updates_b={mb['updates']:.0f} "
            f"hint_kl={mb['hint_kl']:.4f} scored_a={rep.arms['A'].scored} "
            f"scored_b={rep.arms['B'].scored} kept_a={_fmt(rep.arms['A'].kept)} "
            f"kept_b={_fmt(rep.arms['B'].kept)} edited_a={_fmt(rep.arms['A'].edited)} "
            f"edited_b={_fmt(rep.arms['B'].edited)} reward_delta={_fmt(reward.diff)} "
            f"reward_ci_low={_fmt(reward.lo)} reward_ci_high={_fmt(reward.hi)} "
            f"dissatisfied_delta={_fmt(dis.diff)} dissatisfied_ci_low={_fmt(dis.lo)} "
            f"dissatisfied_ci_high={_fmt(dis.hi)} kept_delta={_fmt(kept.diff)} "
            f"kept_ci_low={_fmt(kept.lo)} kept_ci_high={_fmt(kept.hi)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-c", "--config", default=str(ROOT / "configs" / "realtime.toml"))
    ap.add_argument("-o", "--override", action="append", default=[],
                    help="key=value over the config (repeatable), e.g. -o name=rt2")
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--arm", choices=("loop", "follow-up-hints"), default="loop",
                    help="loop: the real-time loop against its start; follow-up-hints: one "
                         "window trained with and without users' follow-ups as hints")
    args = ap.parse_args()
    cfg = load_config(RealtimeConfig, args.config, args.override)
    t0 = time.monotonic()
    if args.arm == "follow-up-hints":
        line = follow_up_hint_arms(cfg, args.runs)
        print(f"{(time.monotonic() - t0) / 60:.1f} min")
        print(line)
        return
    res = run_loop(cfg, args.runs)
    print(f"report: {RunDir(res.run).report}; {(time.monotonic() - t0) / 60:.1f} min; "
          f"sessions: {res.accounting}")
    print(res.line())
    if res.stopped:
        raise SystemExit(f"stopped early: {res.stopped}")


if __name__ == "__main__":
    main()
