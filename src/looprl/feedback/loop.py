"""The real-time RL loop, end to end: serve -> window -> rewards -> train -> gate -> A/B -> promote.

    res = run_loop(load_config(RealtimeConfig, "configs/realtime.toml"), runs="runs")
    res.line()   # cycles=… sessions=… kept_delta=… kept_ci_low=… … rollback_ok=…
    # looprl feedback loop -c configs/realtime.toml -o model=runs/quickstart/model_sft

One process drives the cycle; production runs beside it as separate processes that share only
the policies directory and the feedback store, as they would on separate machines:

- ``looprl serve`` on ``RUN/policies`` (``current.json``, ``candidate.json``), watching them:
  a promotion, an offered candidate and its withdrawal go live without a restart;
- the users: simulated ones (``looprl feedback simulate``, HTTP only) when ``users.simulate``,
  else whoever calls the server (its URL and token are printed).

Each cycle:

1. **Window**: wait for ``window`` scored sessions of the current version that no cycle trained
   on (``feedback.window``: sessions whose users have acted; infrastructure failures never count).
2. **Rewards -> train**: the window's sessions become groups (``feedback.window.window_groups``):
   sessions of the same request (repo and prompt) form a GRPO group, as the G rollouts of one
   task do; a request seen once is measured against its mean reward in earlier traffic, or the
   window's mean without it when it is new (why these baselines: ``feedback.window``). ``steps``
   GRPO steps (``grpo``, Composer's objective) over the window, each session once, continuing
   the Adam state of the policy they start from (the start model's run, ``optimizer``, its
   second moments alone with ``optimizer_momentum`` false; then each candidate's own;
   ``feedback.update``): the cycles are one continuing run. The candidate is saved as
   ``policies/vNNNN`` with that state. With ``grpo.experimental.feedback.follow_ups`` the
   window's dissatisfied follow-ups are hints first: each such session is continued by the
   serving policy with the follow-up after the turn it answers, and the steps distil those
   continuations into the policy without it (``feedback.follow_ups``, ``trainer.distill``).
3. **Gate**: ``looprl.bench`` runs current and candidate on ``gate.tasks`` (held-out tasks the
   users never send; ``gate.skip`` leaves out the head of a file whose first ``users.limit``
   tasks the users do send) and ``bench.gate.compare`` takes a paired bootstrap interval of the
   pass@1 difference. At ``gate.temperature = 0`` both decode greedily, so the difference is
   what the update changed rather than sampling noise. A bench that graded nothing, or an
   interval whose low end is under ``-gate.max_drop``, rejects the candidate: it never reaches a
   user.
4. **A/B**: the candidate is offered to ``ab.split_b`` of users (a fresh experiment per cycle, so
   arms reshuffle) until each arm has ``ab.sessions`` scored sessions (or ``ab.timeout_min``).
   Promote when, for ``resolved`` (B - A, 95% bootstrap: edits kept per request, a request the
   agent changed nothing for counting 0 whether or not its user said so) and for the reward,
   the point estimate is >= 0 and the interval lies above ``-ab.margin`` (twice that for the
   reward), and reverts did not rise (``feedback.gate.ab_decision``); roll back
   otherwise. A promotion moves ``current.json``; the serve picks it up.
5. ``inject_bad_cycle``: that cycle's candidate gets Gaussian noise on its weights (a deliberately
   bad candidate); the run reports whether the gate or the A/B caught it (``rollback_ok``).

After the cycles, ``ab.final_sessions > 0`` runs the final A/B: the start policy (arm A) against
the last promoted one (arm B), the real-time RL arm against a control. Every session is accounted
for: sent by users = stored = trained + waiting + superseded + A/B-only + unscored +
infrastructure failures (``feedback.accounting``).

Ctrl-C or SIGTERM stops the run where it is: users and server stop (in-flight sessions finish),
the last promoted policy is left serving, and the report, the accounting and the last line cover
the finished cycles; ``LoopResult.stopped`` says why and where it stopped.

The parts: ``realtime_config`` (the config), ``production`` (server and users), ``loop_cycle``
(one cycle, made of ``window``, ``update``, ``gate`` and ``policies``, the parts ``looprl feedback
cycle`` is made of too), ``accounting`` (where the sessions went), ``report`` (``RUN/report.md``).

What this is NOT: a multi-host deployment. The server and the loop share a filesystem here; on a
fleet the policies dir would be an object store and the feedback store a database server.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.config import save_config
from looprl.errors import ConfigError
from looprl.feedback.accounting import account
from looprl.feedback.loop_cycle import CycleRow, Loop
from looprl.feedback.policies import PolicyRef, promote, read_policy
from looprl.feedback.production import start_production
from looprl.feedback.realtime_config import RealtimeConfig
from looprl.rundir import RunDir


@dataclass
class LoopResult:
    run: Path
    cycles: list[CycleRow]
    final_ab: dict[str, Any]
    """The last A/B: the final one (start vs last promoted) when run, else the last cycle's."""
    accounting: dict[str, int]
    rollback_ok: int | None
    """1: the injected bad candidate was rejected or rolled back and the previous policy kept
    serving; 0: it was promoted; None: none was injected."""
    stopped: str = ""
    """Why the run ended before its cycles and final A/B (a signal), or empty."""

    def line(self) -> str:
        d = self.final_ab.get("diffs", {})

        def f(metric: str, key: str) -> str:
            v = d.get(metric, {}).get(key)
            return "nan" if v is None else f"{v:.4f}"

        acc = self.accounting
        return (f"cycles={len(self.cycles)} sessions={acc['stored']} "
                f"kept_delta={f('kept', 'diff')} kept_ci_low={f('kept', 'lo')} "
                f"kept_ci_high={f('kept', 'hi')} dissatisfied_delta={f('dissatisfied', 'diff')} "
                f"latency_delta={f('latency', 'diff')} "
                f"rollback_ok={'nan' if self.rollback_ok is None else self.rollback_ok} "
                f"lost={acc['lost']} trained_twice={acc['trained_twice']} "
                f"edited_delta={f('edited', 'diff')} "
                f"resolved_delta={f('resolved', 'diff')} "
                f"resolved_ci_low={f('resolved', 'lo')} resolved_ci_high={f('resolved', 'hi')} "
                f"kept_within_delta={f('kept_within_requests', 'diff')} "
                f"kept_within_ci_low={f('kept_within_requests', 'lo')} "
                f"kept_within_ci_high={f('kept_within_requests', 'hi')}")


def _stop_on_signal(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def init_run(cfg: RealtimeConfig, run: Path) -> PolicyRef:
    """``RUN/policies`` with the start model as its first version (a link, not a copy) and
    ``current.json`` naming it; returns that policy."""
    start = read_policy(Path(cfg.model).expanduser())
    policies = RunDir(run).policies
    policies.mkdir(parents=True, exist_ok=True)
    link = policies / f"v{start.version:04d}"
    if not link.exists():
        link.symlink_to(start.path, target_is_directory=True)
    return promote(policies, start.version)


def _serve(loop: Loop) -> None:
    """Start production (``feedback.production``) and write where users find it."""
    run = loop.run
    loop.prod = prod = start_production(loop.cfg, run, loop.policies, RunDir(run).feedback_db)
    server = RunDir(run).server_info  # where real users (or a client) find it: owner-only
    server.touch(mode=0o600)
    server.write_text(json.dumps({"url": prod.url, "token": prod.token}))
    loop.say(f"serving on {prod.url} (URL and token in {server})")


def _cycles(loop: Loop, rows: list[CycleRow]) -> None:
    """The cycles, while the budget allows; each finished one appended to ``rows`` and to
    ``RUN/cycles.jsonl``; a window that did not fill ends them."""
    took: list[float] = []
    for n in range(1, loop.cfg.cycles + 1):
        fits, why = loop.fits(took)
        if not fits:
            loop.say(f"stopping after {n - 1} cycles: {why}")
            break
        loop.phase, t = f"cycle {n}", loop.minutes()
        row = loop.cycle(n)
        took.append(loop.minutes() - t)
        rows.append(row)
        with RunDir(loop.run).cycles.open("a") as fh:
            fh.write(json.dumps(dataclasses.asdict(row)) + "\n")
        if row.status == "skipped":
            break


def _final_ab(loop: Loop, start: PolicyRef) -> dict[str, Any] | None:
    """The start policy (arm A) against the last promoted one (B), when ``ab.final_sessions``
    and a cycle promoted; the last promoted policy is left serving, stopped or not."""
    cfg, prod = loop.cfg, loop.prod
    assert prod is not None
    last = read_policy(loop.policies)
    if not cfg.ab.final_sessions or last.version == start.version:
        return None
    loop.say(f"final A/B: start v{start.version} (A) vs v{last.version} (B), "
             f"{cfg.ab.final_sessions} scored sessions per arm")
    loop.phase = "the final A/B"
    promote(loop.policies, start.version)
    try:
        prod.wait_serving("A", start.version)
        rep = loop.ab(start, last, f"{cfg.name}-final", cfg.ab.final_sessions)
    finally:  # stopped or not, the last promoted policy is the one left serving
        promote(loop.policies, last.version)
    prod.wait_serving("A", last.version)
    final = {**rep.to_dict(), "final": True, "a": start.version, "b": last.version}
    RunDir(loop.run).final_ab.write_text(json.dumps(final, indent=1))
    return final


def _result(loop: Loop, rows: list[CycleRow], final: dict[str, Any], stopped: str) -> LoopResult:
    """The accounting, the report (``RUN/report.md``) and the last line (``RUN/result.txt``)."""
    from looprl.feedback.report import write_loop_report

    run = loop.run
    users = RunDir(run).users_summary
    sent = json.loads(users.read_text()) if users.is_file() else None
    rolled = {r.candidate_version for r in rows
              if r.status in ("rolled_back", "rejected") and r.candidate_version is not None}
    bad = [r for r in rows if r.injected]
    rollback_ok = None if not bad else int(bad[0].status in ("rolled_back", "rejected"))
    acc = account(loop.store, sent, rolled, read_policy(loop.policies).version, loop.cfg.signal)
    res = LoopResult(run, rows, final, acc, rollback_ok, stopped)
    write_loop_report(res, loop.store, loop.cfg)
    RunDir(run).result.write_text(res.line() + "\n")
    return res


def run_loop(cfg: RealtimeConfig, runs: str | Path = "runs",
             say: Callable[[str], None] = print) -> LoopResult:
    """The whole run (module docstring): cycles, the final A/B, the report."""
    import torch

    torch.set_num_threads(cfg.threads)
    if threading.current_thread() is threading.main_thread():  # SIGTERM ends it like Ctrl-C:
        signal.signal(signal.SIGTERM, _stop_on_signal)  # users and server stop, nothing is cut
    run = Path(runs) / cfg.name
    if RunDir(run).cycles.exists():
        raise ConfigError(f"{run} holds a finished or running loop; pick another name (-o name=...)")
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, RunDir(run).config)
    start = init_run(cfg, run)
    loop = Loop(cfg, run, say)
    say(f"real-time RL loop {run}: start policy v{start.version} ({start.path})")
    _serve(loop)
    assert loop.prod is not None
    rows: list[CycleRow] = []
    final: dict[str, Any] | None = None
    stopped = ""
    try:
        _cycles(loop, rows)
        final = _final_ab(loop, start)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: what finished is reported, not lost
        stopped = f"{e or 'interrupted'} during {loop.phase}"
        say(f"{stopped}: the report covers the {len(rows)} finished cycle(s)")
    finally:
        say("stopping users and server (in-flight sessions finish)")
        loop.prod.stop()
    if final is None:  # no final A/B: the last cycle's
        final = next((r.ab for r in reversed(rows) if r.ab), {})
    return _result(loop, rows, final, stopped)
