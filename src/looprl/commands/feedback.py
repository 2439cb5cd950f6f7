"""``looprl feedback``: the real-time RL cycle, the A/B report, promotions, the stored sessions.

    looprl feedback loop -c configs/realtime.toml -o model=runs/quickstart/model_sft
    looprl feedback cycle --store fb.db --model M --out policies [--tasks heldout.jsonl]
    looprl feedback ab --store fb.db --min-sessions 100
    looprl feedback promote --out policies --version 3
    looprl feedback sessions --store fb.db
    looprl feedback simulate --url http://127.0.0.1:8400 --tasks heldout.jsonl --sessions 50
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from looprl.errors import TaskError
from looprl.rundir import RunDir

app = typer.Typer(help="Production feedback -> rewards -> GRPO cycle; A/B tests; promotions.",
                  no_args_is_help=True)

# Must exist: a reader given a typo'd path must not create an empty store and report nothing.
Store = Annotated[Path, typer.Option("--store", help="SQLite feedback store (looprl serve --store)",
                                     exists=True, dir_okay=False)]


@app.command("cycle")
def cycle_cmd(
    store: Store,
    model: Annotated[Path, typer.Option(help="the policy served before any promotion (model dir)",
                                        exists=True, file_okay=False)],
    out: Annotated[Path, typer.Option(help="policies dir: candidates vNNNN/ and current.json",
                                      file_okay=False)],
    tasks: Annotated[Path | None, typer.Option(help="held-out JSONL tasks gating promotion",
                                               exists=True, dir_okay=False)] = None,
    signal: Annotated[str, typer.Option(help="reward signal: edit_outcome | edit_outcome_latency")] = "edit_outcome",
    min_sessions: Annotated[int, typer.Option(help="scored sessions needed for a step")] = 32,
    lr: Annotated[float, typer.Option(help="learning rate of the step")] = 1e-6,
    promote_ungated: Annotated[bool, typer.Option(help="promote without --tasks")] = False,
    limit: Annotated[int, typer.Option(help="only the first N tasks (0 = all)", min=0)] = 0,
    follow_ups: Annotated[bool, typer.Option(
        help="dissatisfied follow-ups as hints, distilled in the step")] = False,
    feedback_coef: Annotated[float, typer.Option(
        help="weight of the follow-ups' distillation term", min=0.0, max=100.0)] = 0.5,
    max_hinted: Annotated[int, typer.Option(
        help="follow-ups' continuations per cycle, at most", min=1)] = 8,
    max_turns: Annotated[int, typer.Option(
        help="agent turns per session, as served (the continuations')")] = 30,
    max_new_tokens: Annotated[int, typer.Option(help="tokens per turn, as served")] = 1024,
    context_window: Annotated[int, typer.Option(help="tokens per segment, as served")] = 8192,
) -> None:
    """One cycle: window of scored sessions -> one GRPO step -> gate -> promote or reject."""
    from looprl.feedback.cycle import CycleConfig, run_cycle
    from looprl.feedback.store import FeedbackStore
    from looprl.harness.run_state import AgentConfig
    from looprl.tasks.taskset import load_tasks
    from looprl.trainer.config import FeedbackDistill

    ts = load_tasks(tasks) if tasks else None
    if ts is not None and not ts:
        raise TaskError(f"{tasks} holds no tasks; build some with `looprl tasks build`")
    if ts and limit:
        ts = ts[:limit]
    cfg = CycleConfig(signal=signal, min_sessions=min_sessions, lr=lr,
                      promote_ungated=promote_ungated,
                      feedback=FeedbackDistill(coef=feedback_coef if follow_ups else 0.0,
                                               max_per_group=max_hinted, follow_ups=follow_ups),
                      agent=AgentConfig(max_turns=max_turns, max_new_tokens=max_new_tokens,
                                        context_window=context_window))
    res = run_cycle(FeedbackStore(store), model, out, cfg, ts)
    typer.echo(json.dumps(res.to_dict(), indent=1))


@app.command("loop")
def loop_cmd(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML config "
                                                "(configs/realtime.toml)", exists=True,
                                                dir_okay=False)] = None,
    override: Annotated[list[str], typer.Option(
        "--override", "-o", help="key=value over the config, e.g. -o cycles=2 (repeatable)")
    ] = [],  # noqa: B006
    runs: Annotated[Path, typer.Option(help="runs root: the run is RUNS/NAME")] = Path("runs"),
) -> None:
    """Serve, collect a window, train, gate, A/B, promote or roll back — cycle after cycle
    (``feedback.loop``); ends with the report's line."""
    from looprl.config import load_config
    from looprl.feedback.loop import run_loop
    from looprl.feedback.realtime_config import RealtimeConfig

    res = run_loop(load_config(RealtimeConfig, config, override), runs)
    typer.echo(f"report: {RunDir(res.run).report}")
    typer.echo(res.line())
    if res.stopped:
        typer.echo(f"stopped early: {res.stopped}", err=True)
        raise typer.Exit(1)


@app.command("ab")
def ab_cmd(
    store: Store,
    signal: Annotated[str, typer.Option(help="reward signal")] = "edit_outcome",
    experiment: Annotated[str | None, typer.Option(help="only this experiment's sessions")] = None,
    min_sessions: Annotated[int, typer.Option(help="scored sessions per arm before deciding",
                                              min=1)] = 100,
    version_a: Annotated[int | None, typer.Option(help="only arm A sessions of this version")] = None,
    version_b: Annotated[int | None, typer.Option(help="only arm B sessions of this version")] = None,
) -> None:
    """Per-arm metrics, B - A with 95% bootstrap CIs, and promote / keep / rollback."""
    from looprl.feedback.ab import ab_report
    from looprl.feedback.store import FeedbackStore

    versions = None
    if version_a is not None or version_b is not None:
        versions = {a: v for a, v in (("A", version_a), ("B", version_b)) if v is not None}
    rep = ab_report(FeedbackStore(store), signal=signal, experiment=experiment,
                    policy_versions=versions,
                    min_sessions=min_sessions)
    typer.echo(json.dumps(rep.to_dict(), indent=1))


@app.command("promote")
def promote_cmd(
    out: Annotated[Path, typer.Option(help="policies dir (feedback cycle --out)", exists=True,
                                      file_okay=False)],
    version: Annotated[int, typer.Option(help="candidate version to make current", min=0)],
) -> None:
    """Make OUT/vNNNN the current policy (after an A/B test says promote)."""
    from looprl.feedback.policies import promote

    ref = promote(out, version)
    typer.echo(f"current policy: v{ref.version} ({ref.path})")


@app.command("sessions")
def sessions_cmd(store: Store, limit: Annotated[int, typer.Option(help="last N sessions", min=1)] = 20
                 ) -> None:
    """The last sessions with their arm, version, events and reward."""
    from looprl.feedback.signals import session_reward
    from looprl.feedback.store import FeedbackStore

    st = FeedbackStore(store)
    events = st.events_by_session()
    for s in st.sessions()[-limit:]:
        ev = events.get(s.id, [])
        rb = session_reward(s, ev)
        typer.echo(f"{s.id[:12]} {s.arm} v{s.policy_version} {s.stop_reason:12} files={len(s.files)} "
                   f"events={','.join(e.kind for e in ev) or '-'} "
                   f"reward={'-' if rb is None else f'{rb.total:+.2f}'} user={s.user}")


def _probability(name: str) -> Any:
    return typer.Option(f"--{name}", min=0.0, max=1.0, help={
        "keep-wrong": "P(a user keeps an edit whose hidden tests fail)",
        "revert-right": "P(a user reverts an edit whose hidden tests pass)",
        "silent": "P(a user never answers)",
        "complain": "P(a complaint after a revert)",
        "thank": "P(thanks after a keep; else silence)"}[name])


@app.command("simulate")
def simulate_cmd(
    tasks: Annotated[Path, typer.Option(help="task JSONL whose prompts users send and whose hidden "
                                              "tests grade the edits (held-out tasks)",
                                         exists=True, dir_okay=False)],
    url: Annotated[str, typer.Option(help="the `looprl serve` base URL")] = "http://127.0.0.1:8400",
    token: Annotated[str | None, typer.Option(envvar="LOOPRL_SERVE_TOKEN", show_envvar=True,
                                              help="the server's bearer token")] = None,
    sessions: Annotated[int, typer.Option(help="sessions to send", min=0)] = 20,
    rate: Annotated[float, typer.Option(help="mean arrivals per minute (Poisson)", min=1e-6)] = 6.0,
    population: Annotated[int, typer.Option(help="distinct users", min=1)] = 10,
    seed: Annotated[int, typer.Option(help="seeds users, prompts, noise and wording")] = 0,
    keep_wrong: Annotated[float, _probability("keep-wrong")] = 0.0,
    revert_right: Annotated[float, _probability("revert-right")] = 0.0,
    silent: Annotated[float, _probability("silent")] = 0.0,
    complain: Annotated[float, _probability("complain")] = 0.8,
    thank: Annotated[float, _probability("thank")] = 0.3,
    split: Annotated[str | None, typer.Option(help="only tasks whose metadata split is this")] = None,
    user_prefix: Annotated[str, typer.Option(help="users are PREFIX-K")] = "sim-user",
    request_timeout: Annotated[float, typer.Option(help="seconds a user waits for a session",
                                                   min=1.0)] = 900.0,
    grade_concurrency: Annotated[int, typer.Option(help="gradings at once (hidden tests in a "
                                                        "sandbox)", min=1)] = 2,
    out: Annotated[Path | None, typer.Option(help="write the full JSON summary here")] = None,
) -> None:
    """Simulated users over the server's HTTP API: keep edits that pass the hidden tests, revert
    the rest (with noise), follow up; prints the JSON summary (counts, session and event ids).
    SIGTERM/SIGINT stop new arrivals; sessions already sent finish and the summary is written
    (a second signal ends the process at once)."""
    import asyncio
    import signal

    from looprl.feedback.simulate import SimConfig, SimSummary, simulate_users
    from looprl.tasks.taskset import load_tasks

    if not token:
        raise typer.BadParameter("pass the server's --token (or set LOOPRL_SERVE_TOKEN)",
                                 param_hint="--token")
    ts = [t for t in load_tasks(tasks) if split is None or t.metadata.get("split") == split]
    if not ts:
        raise TaskError(f"{tasks} holds no tasks" + (f" of split {split!r}" if split else ""))
    cfg = SimConfig(sessions=sessions, rate_per_min=rate, population=population, seed=seed,
                    keep_wrong=keep_wrong, revert_right=revert_right, silent=silent,
                    complain=complain, thank=thank, user_prefix=user_prefix,
                    request_timeout_s=request_timeout, grade_concurrency=grade_concurrency)

    async def until_stopped() -> SimSummary:
        stop, loop = asyncio.Event(), asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)

        def on_signal() -> None:
            stop.set()
            for sig in signals:  # the next signal acts as usual: a way out of a stuck run
                loop.remove_signal_handler(sig)

        for sig in signals:
            loop.add_signal_handler(sig, on_signal)
        return await simulate_users(url, token, ts, cfg, stop=stop)

    summary = asyncio.run(until_stopped()).to_dict()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=1))
        summary = {k: v for k, v in summary.items() if k != "sessions"}
    typer.echo(json.dumps(summary, indent=1))
