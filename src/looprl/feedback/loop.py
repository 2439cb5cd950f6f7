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
   on (``cycle.window``: sessions whose users have acted; infrastructure failures never count).
2. **Rewards -> train**: the window's sessions become groups (``window_groups``): sessions of the
   same request (repo and prompt) form a GRPO group, as the G rollouts of one task do; a request
   seen once gets ``A = r - b`` with ``b`` that request's mean reward in earlier traffic, or the
   window's mean without it when it is new. Any baseline that does not depend on the session's
   own outcome leaves the policy gradient unbiased; production has one sample of most prompts and
   their difficulty varies far more than a few cycles move the policy, so the request's own past
   is the lower-variance estimate. ``steps`` GRPO steps (``grpo``, Composer's objective) over the
   window, each session once, continuing the Adam state of the policy they start from (the
   start model's run, ``optimizer``, its second moments alone with ``optimizer_momentum``
   false; then each candidate's own): the cycles are one continuing run. The candidate is saved
   as ``policies/vNNNN`` with that state.
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
   reward), and reverts did not rise (``feedback.ab.decide``'s rollback rules); roll back
   otherwise. A promotion moves ``current.json``; the serve picks it up.
5. ``inject_bad_cycle``: that cycle's candidate gets Gaussian noise on its weights (a deliberately
   bad candidate); the run reports whether the gate or the A/B caught it (``rollback_ok``).

After the cycles, ``ab.final_sessions > 0`` runs the final A/B: the start policy (arm A) against
the last promoted one (arm B), the real-time RL arm against a control. Every session is accounted
for: sent by users = stored = trained + waiting (scored sessions of the policy served now, for
the next window) + superseded (scored after their policy's window was taken, by a policy since
replaced) + A/B-only (served by a candidate that was rolled back) + unscored (no feedback) +
infrastructure failures.

Ctrl-C or SIGTERM stops the run where it is: users and server stop (in-flight sessions finish),
the last promoted policy is left serving, and the report, the accounting and the last line cover
the finished cycles; ``LoopResult.stopped`` says why and where it stopped.

What this is NOT: a multi-host deployment. The server and the loop share a filesystem here; on a
fleet the policies dir would be an object store and the feedback store a database server.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprl.config import FieldError, check_choice, save_config
from looprl.errors import ConfigError
from looprl.feedback.signals import SIGNALS
from looprl.feedback.simulate import SimConfig
from looprl.trainer.step import GRPOConfig
from looprl.types import Group, Trajectory


@dataclass(frozen=True)
class UsersSection(SimConfig):
    """Who sends sessions: simulated users over HTTP (how they behave: ``SimConfig``'s fields),
    or real ones."""

    sessions: int = 1_000_000
    """Sessions the simulated users plan: the loop stops them when it ends."""
    simulate: bool = True
    """Start ``looprl feedback simulate`` against the server (else wait for real users)."""
    tasks: str = ""
    """Task JSONL whose prompts the simulated users send and whose hidden tests they grade by."""
    limit: int = 0
    """Only the first N of those tasks (0 = all): fewer requests recur more often."""


@dataclass(frozen=True)
class ServeSection:
    """The ``looprl serve`` the loop starts (what users talk to)."""

    port: int = 0
    """0: a free port."""
    max_concurrent: int = 4
    max_turns: int = 5
    max_new_tokens: int = 256
    context_window: int = 8192
    watch_s: float = 1.0
    """How often the server re-reads the policies dir (promotions, candidates)."""
    allowed_roots: list[str] = field(default_factory=list)
    """Directories users' repos may lie under (the users' task repos are added)."""


@dataclass(frozen=True)
class GateSection:
    tasks: str = ""
    """Held-out task JSONL the bench gate runs (never sent by users); empty: no gate."""
    skip: int = 0
    """Leave out the first N tasks: the users' own file can serve as the gate's when they send
    only its first ``users.limit`` (``skip`` >= that)."""
    limit: int = 0
    """Then only the first N tasks (0 = all)."""
    k: int = 1
    temperature: float = 1.0
    """0: greedy, so the paired difference shows what the update changed, not sampling noise."""
    max_drop: float = 0.10
    """Reject when the pass@1 difference's 95% interval reaches below -max_drop."""
    max_turns: int = 8
    max_new_tokens: int = 256
    max_total_new_tokens: int = 2048
    context_window: int = 8192
    concurrency: int = 16


@dataclass(frozen=True)
class ABSection:
    sessions: int = 60
    """Scored sessions per arm before the A/B decides."""
    split_b: float = 0.5
    margin: float = 0.1
    """Promote when the ``resolved`` difference's 95% interval lies above -margin and the
    reward's above -2 * margin (and both points are >= 0): the A/B must not show the candidate
    resolving fewer requests by more than this share (``ab_decision``)."""
    max_revert_rise: float = 0.05
    timeout_min: float = 20.0
    """An A/B that has not reached ``sessions`` per arm by then decides on what it has."""
    final_sessions: int = 0
    """After the cycles: an A/B of the start policy against the last promoted one, with this many
    scored sessions per arm (0: none)."""


@dataclass(frozen=True)
class RealtimeConfig:
    """The real-time RL loop (module docstring)."""

    name: str = "realtime"
    """Run directory name under the runs root."""
    model: str = ""
    """The policy served first: an HF model directory (e.g. a quickstart's ``model_sft``)."""
    cycles: int = 4
    max_minutes: float = 60.0
    """The whole run's budget: a cycle starts only when it and the final A/B fit in what is
    left, each estimated from the run so far (``Loop.fits``)."""
    window: int = 64
    """Scored untrained sessions of the current policy a cycle trains on."""
    steps: int = 4
    """GRPO steps per cycle over the window (each session in one step)."""
    optimizer: str = ""
    """The Adam state the first window continues from: a training run's checkpoint directory
    (its newest checkpoint's, e.g. ``runs/quickstart/ckpt`` for the quickstart's ``model_rl``)
    or an ``optimizer.pt``; empty: a fresh optimizer. Each candidate keeps the state its window
    left (``optimizer.pt`` beside its weights) and the next window continues from the serving
    policy's, so the cycles train as one continuing run."""
    optimizer_momentum: bool = True
    """Whether the first window takes ``optimizer``'s first moments (momentum) too. Set false
    when ``model`` is not the policy that run ended with (e.g. the quickstart's ``model_start``
    with its RL run's state): the second moments still scale each weight's steps, but that run's
    momentum would move the start policy along the run's last direction, which the users' traffic
    never asked for."""
    signal: str = "edit_outcome"
    seed: int = 0
    threads: int = 1
    """Torch threads of the loop's own training and gate (the server decodes beside it)."""
    inject_bad_cycle: int = 0
    """The cycle (1-based) whose candidate gets noise on its weights (0: none)."""
    inject_noise: float = 1.0
    """Noise std as a multiple of each weight tensor's own std."""
    window_timeout_min: float = 30.0
    """Stop the run when a window has not filled by then (the users stopped, or fail)."""
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(
        lr=1e-4, skip_groups_without_pass=False, norm_tokens=1024, micro_batch_tokens=8192))
    users: UsersSection = field(default_factory=UsersSection)
    serve: ServeSection = field(default_factory=ServeSection)
    gate: GateSection = field(default_factory=GateSection)
    ab: ABSection = field(default_factory=ABSection)

    def __post_init__(self) -> None:
        check_choice("signal", self.signal, SIGNALS)
        if not self.model:
            raise FieldError("model", "name the policy to serve first: an HF model directory "
                                      "(e.g. runs/quickstart/model_sft)")
        for key in ("cycles", "window", "steps"):
            if getattr(self, key) < 1:
                raise FieldError(key, f"must be >= 1, got {getattr(self, key)}")
        if self.users.simulate and not self.users.tasks:
            raise FieldError("users.tasks", "simulated users need tasks to ask for: a task JSONL "
                                            "(e.g. runs/quickstart/tasks/heldout.jsonl)")
        for key in ("skip", "limit", "temperature"):
            if getattr(self.gate, key) < 0:
                raise FieldError(f"gate.{key}", f"must be >= 0, got {getattr(self.gate, key)}")
        if not 0 < self.ab.split_b < 1:
            raise FieldError("ab.split_b", f"must be in (0, 1), got {self.ab.split_b}")
        if self.grpo.skip_groups_without_pass:
            raise FieldError("grpo.skip_groups_without_pass", "users' rewards carry no test "
                                                              "result: set it false")


# -- rewards -> groups ----------------------------------------------------------------------


def request_history(sessions: Sequence[tuple[str, float]]) -> dict[str, list[float]]:
    """request -> rewards of earlier scored sessions (the per-request value estimate's data)."""
    out: dict[str, list[float]] = {}
    for request, reward in sessions:
        out.setdefault(request, []).append(reward)
    return out


def window_groups(trajs: Sequence[Trajectory], history: dict[str, list[float]], tag: str
                  ) -> list[Group]:
    """The window as GRPO groups (module docstring, 2): one per request; a request seen once
    carries its baseline in ``metadata["baseline"]`` (``trainer.batch``). E.g. sessions of
    requests x, x, y, z with rewards 1, -1, 1, -1 and a past of y of [0, -1]: one group (x, x;
    its own mean), y against -0.5 (its past), z against 1/3 (the window's mean without z)."""
    by_req: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_req.setdefault(str(t.metadata.get("request", t.id)), []).append(t)
    rewards = {t.id: t.reward.total for t in trajs if t.reward is not None}
    total = math.fsum(rewards.values())
    out = []
    for i, (req, ts) in enumerate(by_req.items()):
        meta: dict[str, Any] = {"request": req, "sessions": len(ts)}
        if len(ts) == 1:
            past = history.get(req)
            if past:
                meta["baseline"], meta["baseline_from"] = math.fsum(past) / len(past), "request"
            elif len(rewards) > 1:  # the window's mean without this session's own reward
                own = rewards.get(ts[0].id, 0.0)
                meta["baseline"] = (total - own) / (len(rewards) - 1)
                meta["baseline_from"] = "window"
            else:
                continue
        out.append(Group(task_id=f"request-{i}", group_id=f"{tag}-{i}", trajectories=tuple(ts),
                         metadata=meta))
    return out


def add_noise(model: Any, scale: float, seed: int) -> None:
    """Every weight tensor += N(0, (scale * its std)^2): a deliberately broken candidate."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * p.std() * scale)


# -- processes ------------------------------------------------------------------------------


def _looprl(*args: str) -> list[str]:
    return [sys.executable, "-m", "looprl", *args]


def _end_with_parent() -> None:
    """In a child (``Popen(preexec_fn=...)``): SIGTERM when the loop dies, even killed outright,
    so no server or users outlive it (Linux: ``prctl(PR_SET_PDEATHSIG)``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


@dataclass
class Production:
    """The server (and simulated users) the loop runs beside."""

    url: str
    token: str
    serve: subprocess.Popen[bytes]
    users: subprocess.Popen[bytes] | None = None

    def health(self) -> dict[str, Any]:
        import httpx

        return httpx.get(self.url + "/healthz", timeout=10).json()

    def wait_serving(self, arm: str, version: int, timeout_s: float = 120.0) -> None:
        """Until the server's ``arm`` serves ``version`` (it re-reads the policies dir itself)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.serve.poll() is not None:
                raise ConfigError(f"the server exited ({self.serve.returncode}); see serve.log")
            arms = self.health().get("arms", {})
            if arms.get(arm) == version:
                return
            time.sleep(0.5)
        raise ConfigError(f"the server did not pick up v{version} on arm {arm} in {timeout_s:.0f} s")

    def stop(self, timeout_s: float = 900.0) -> None:
        """Users first (they stop arriving; in-flight sessions finish), then the server."""
        for p in (self.users, self.serve):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def start_production(cfg: RealtimeConfig, run: Path, policies: Path, db: Path) -> Production:
    import httpx

    from looprl.sandbox.server import free_port

    token = os.urandom(12).hex()
    port = cfg.serve.port or free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "LOOPRL_SERVE_TOKEN": token}
    serve = subprocess.Popen(
        _looprl("serve", "--model", str(policies), "--store", str(db), "--port", str(port),
                "--watch", str(cfg.serve.watch_s), "--max-concurrent", str(cfg.serve.max_concurrent),
                "--max-turns", str(cfg.serve.max_turns),
                "--max-new-tokens", str(cfg.serve.max_new_tokens),
                "--context-window", str(cfg.serve.context_window), "--min-sessions", "1",
                *_allowed_roots(cfg)),
        stdout=(run / "serve.log").open("ab"), stderr=subprocess.STDOUT, env=env,
        preexec_fn=_end_with_parent)
    prod = Production(url, token, serve)
    deadline = time.monotonic() + 300
    while True:
        if serve.poll() is not None:
            raise ConfigError(f"`looprl serve` exited with {serve.returncode}: see {run}/serve.log")
        try:
            prod.health()
            break
        except (httpx.HTTPError, ValueError):  # not listening yet, or not answering JSON yet
            pass
        if time.monotonic() > deadline:
            prod.stop(5)
            raise ConfigError(f"`looprl serve` did not answer in 300 s: see {run}/serve.log")
        time.sleep(1)
    if cfg.users.simulate:
        prod.users = subprocess.Popen(
            _looprl("feedback", "simulate", "--url", url,
                    "--tasks", str(_users_tasks(cfg, run)), *cfg.users.cli_args(),
                    "--out", str(run / "users.json")),
            stdout=(run / "users.log").open("ab"), stderr=subprocess.STDOUT, env=env,
            preexec_fn=_end_with_parent)
    return prod


def users_tasks(cfg: RealtimeConfig) -> list[Any]:
    """The tasks the simulated users send: ``users.tasks``, its first ``users.limit`` when set."""
    from looprl.tasks.taskset import load_tasks

    src = Path(cfg.users.tasks).expanduser()
    tasks = load_tasks(src)
    if not tasks:
        raise ConfigError(f"users.tasks {src} holds no tasks; build some with `looprl tasks build`")
    return tasks[:cfg.users.limit] if cfg.users.limit else tasks


def _users_tasks(cfg: RealtimeConfig, run: Path) -> Path:
    """The users' task file (``RUN/users_tasks.jsonl`` when limited)."""
    from looprl.tasks.taskset import write_tasks

    if not cfg.users.limit:
        return Path(cfg.users.tasks).expanduser()
    out = run / "users_tasks.jsonl"
    write_tasks(users_tasks(cfg), out)
    return out


def _allowed_roots(cfg: RealtimeConfig) -> list[str]:
    """``--allowed-root`` for ``serve.allowed_roots`` and every directory holding a user task's
    repo or venv (users send both)."""
    from looprl.tasks.taskset import load_tasks

    roots = set(cfg.serve.allowed_roots)
    if cfg.users.tasks:
        for t in load_tasks(Path(cfg.users.tasks).expanduser()):
            roots |= {str(Path(d).parent) for d in (t.repo, t.venv) if d}
    return [a for r in sorted(roots) for a in ("--allowed-root", r)]


# -- one cycle ------------------------------------------------------------------------------


@dataclass
class CycleRow:
    """What one cycle did (a line of ``RUN/cycles.jsonl``)."""

    cycle: int
    policy_version: int
    candidate_version: int | None = None
    status: str = ""
    """promoted | rolled_back (the A/B) | rejected (the gate) | no_update (the window's rewards
    were all equal: it is used up, nothing is offered) | skipped (the window did not fill)."""
    reason: str = ""
    injected: bool = False
    window: dict[str, Any] = field(default_factory=dict)
    train: dict[str, float] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)
    ab: dict[str, Any] = field(default_factory=dict)
    minutes: dict[str, float] = field(default_factory=dict)


def ab_decision(rep: Any, margin: float, max_revert_rise: float) -> tuple[str, str]:
    """promote | rollback from an ``ab.ABReport`` (module docstring, 4): on ``resolved`` (what
    users got: the reward over scored sessions alone favours a candidate that edits less and
    leaves its failures to silence, ``ab.py``) and on ``reward`` (what they said: where neither
    arm edits, ``resolved`` is 0 on both and only the follow-ups tell them apart). Both must be
    not lower and not worse by more than the margin: ``margin`` for ``resolved``, twice it for
    the reward, whose edit term (2 * kept share - 1) spans twice the range."""
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


class Loop:
    """The state of one run (``run_loop``)."""

    def __init__(self, cfg: RealtimeConfig, run: Path, say: Callable[[str], None]) -> None:
        from looprl.feedback.store import FeedbackStore

        self.cfg, self.run, self.say = cfg, run, say
        self.policies = run / "policies"
        self.store = FeedbackStore(run / "feedback.db")
        self.t0 = time.monotonic()
        self.gate_tasks = _gate_tasks(cfg)
        self.prod: Production | None = None

    # -- waiting on users --------------------------------------------------------------------
    def wait(self, ready: Callable[[], tuple[bool, str]], timeout_s: float, what: str) -> bool:
        """Poll ``ready`` until it holds; a status line every 30 s; False on timeout."""
        assert self.prod is not None
        deadline, last = time.monotonic() + timeout_s, 0.0
        while True:
            ok, status = ready()
            if ok:
                return True
            if time.monotonic() > deadline:
                self.say(f"  {what}: gave up after {timeout_s / 60:.0f} min ({status})")
                return False
            for name, p in (("server", self.prod.serve), ("users", self.prod.users)):
                if p is not None and p.poll() is not None:
                    raise ConfigError(f"the {name} process exited ({p.returncode}) while waiting "
                                      f"for {what}: see {self.run}/{'serve' if name == 'server' else 'users'}.log")
            if time.monotonic() - last > 30:
                self.say(f"  {what}: {status} [{self.minutes():.1f} min]")
                last = time.monotonic()
            time.sleep(2)

    def minutes(self) -> float:
        return (time.monotonic() - self.t0) / 60

    def fits(self, cycle_minutes: list[float]) -> tuple[bool, str]:
        """Whether another cycle and then the final A/B fit in ``max_minutes``: the cycle
        estimated by the longest so far, the final A/B by its sessions at the rate users have
        answered so far (an arm gets its ``split`` share of them)."""
        cfg = self.cfg
        left = cfg.max_minutes - self.minutes()
        cycle = max(cycle_minutes, default=0.0)
        final = 0.0
        if cfg.ab.final_sessions and cycle_minutes:
            rate = len(self._scored()) / max(self.minutes(), 1e-6)
            split = min(cfg.ab.split_b, 1.0 - cfg.ab.split_b)
            final = cfg.ab.final_sessions / max(rate * split, 1e-6)
        why = (f"{left:.0f} of {cfg.max_minutes:.0f} min left; a cycle takes ~{cycle:.0f}, the "
               f"final A/B ~{final:.0f}")
        return cycle + final <= left, why

    # -- gate ----------------------------------------------------------------------------------
    def gate(self, current: Any, cand: Any) -> dict[str, Any]:
        """Bench both versions on the gate tasks (``RUN/gate/vNNNN.json``) and compare."""
        from looprl.bench.run import BenchSettings
        from looprl.feedback.cycle import bench_policy, gate_reports

        g = self.cfg.gate
        st = BenchSettings(max_turns=g.max_turns, max_new_tokens=g.max_new_tokens,
                           max_total_new_tokens=g.max_total_new_tokens,
                           context_window=g.context_window, concurrency=g.concurrency,
                           temperature=g.temperature)
        a, b = (bench_policy(ref.path, self.gate_tasks, g.k, st,
                             self.run / "gate" / f"v{ref.version:04d}.json")
                for ref in (current, cand))
        res = gate_reports(a, b, g.max_drop)
        res["passed"] = bool(res["passed"])  # a bench that graded nothing never promotes
        return res

    # -- A/B -----------------------------------------------------------------------------------
    def ab(self, a: Any, b: Any, experiment: str, sessions: int) -> Any:
        """Offer ``b`` beside ``a`` (the current policy) until each arm has ``sessions`` scored
        sessions or the timeout; returns the ``ab.ABReport``."""
        from looprl.feedback.ab import ab_report
        from looprl.feedback.cycle import offer_candidate, withdraw_candidate

        assert self.prod is not None
        offer_candidate(self.policies, b.version, experiment, self.cfg.ab.split_b)
        versions = {"A": a.version, "B": b.version}

        def report() -> Any:
            return ab_report(self.store, signal=self.cfg.signal, experiment=experiment,
                             policy_versions=versions, min_sessions=sessions)

        def ready() -> tuple[bool, str]:
            arms = report().arms
            n = {x: arms[x].scored if x in arms else 0 for x in ("A", "B")}
            return min(n.values()) >= sessions, f"scored A {n['A']}, B {n['B']} of {sessions}"

        try:
            self.wait(ready, self.cfg.ab.timeout_min * 60, f"A/B v{a.version} vs v{b.version}")
        finally:
            withdraw_candidate(self.policies)
        return report()

    # -- the cycle -----------------------------------------------------------------------------
    def cycle(self, n: int) -> CycleRow:
        """One cycle (module docstring); recorded in the store with its outcome and the
        sessions it trained on (each once)."""
        row, trained = self._cycle(n)
        if trained:
            metrics = {"sessions": len(trained), **row.train,
                       **{f"gate_{k}": v for k, v in row.gate.items()
                          if isinstance(v, (int, float, str, bool))}}
            self.store.add_cycle(policy_version=row.policy_version,
                                 candidate_version=row.candidate_version, status=row.status,
                                 reason=row.reason, metrics=metrics, trained=trained)
        return row

    def _cycle(self, n: int) -> tuple[CycleRow, dict[str, float]]:
        from looprl.feedback.cycle import (
            next_version,
            promote,
            read_policy,
            save_candidate,
            window,
        )

        cfg = self.cfg
        cur = read_policy(self.policies)
        row = CycleRow(n, cur.version, injected=n == cfg.inject_bad_cycle)
        t = time.monotonic()

        def ready() -> tuple[bool, str]:  # counted without loading trajectories: polled often
            k = sum(1 for s, _ in self._scored(version=cur.version, untrained=True))
            return k >= cfg.window, f"{k}/{cfg.window} scored sessions of v{cur.version}"

        self.say(f"cycle {n}: collecting a window of v{cur.version}")
        if not self.wait(ready, cfg.window_timeout_min * 60, "window"):
            row.status, row.reason = "skipped", "the window did not fill"
            return row, {}
        trajs = window(self.store, cur.version, cfg.signal)[:cfg.window]
        used = {x.id for x in trajs}
        history = request_history([(f"{s.repo}\0{s.prompt}", r) for s, r in self._scored()
                                   if s.id not in used])
        groups = window_groups(trajs, history, f"c{n}")
        rewards = [x.reward.total for x in trajs if x.reward is not None]
        row.window = {"sessions": len(trajs), "mean_reward": math.fsum(rewards) / len(rewards),
                      "groups": sum(len(g.trajectories) > 1 for g in groups),
                      "singletons": sum(len(g.trajectories) == 1 for g in groups)}
        row.minutes["window"] = (time.monotonic() - t) / 60
        t = time.monotonic()
        self.say(f"  training on {len(trajs)} sessions ({row.window['groups']} repeated requests, "
                 f"{row.window['singletons']} single), mean reward {row.window['mean_reward']:+.3f}")
        state, momentum = window_optimizer(cfg, Path(cur.path))
        model, tok, row.train, opt_state = train_groups(
            cur, groups, cfg.grpo, cfg.steps, cfg.seed + n, state, momentum=momentum)
        trained = {x.id: x.reward.total for x in trajs if x.reward is not None}
        if row.train["updates"] < 1:  # every group's rewards were equal: the window is used up
            row.status = "no_update"
            row.reason = "no group carried an advantage signal (equal rewards): nothing to offer"
            self.say(f"  {row.reason}")
            return row, trained
        version = next_version(self.policies, cur.version)
        if row.injected:
            add_noise(model, cfg.inject_noise, cfg.seed + n)
        cand_path = save_candidate(model, tok, self.policies, version, {
            "parent_version": cur.version, "parent_path": str(cur.path), "sessions": len(trajs),
            "cycle": n, "injected_noise": cfg.inject_noise if row.injected else 0.0,
            "created_at": time.time()}, optimizer_state=opt_state)
        del model, opt_state
        cand = dataclasses.replace(cur, path=cand_path, version=version)
        row.candidate_version = version
        row.minutes["train"] = (time.monotonic() - t) / 60
        t = time.monotonic()
        if self.gate_tasks:
            self.say(f"  gate: bench v{cur.version} and v{version} on {len(self.gate_tasks)} tasks")
            row.gate = self.gate(cur, cand)
            row.minutes["gate"] = (time.monotonic() - t) / 60
            self.say(f"  gate {'passed' if row.gate['passed'] else 'FAILED'}: {row.gate['reason']}")
            if not row.gate["passed"]:
                row.status, row.reason = "rejected", f"gate: {row.gate['reason']}"
                return row, trained
        t = time.monotonic()
        self.say(f"  A/B: v{cur.version} (A) vs v{version} (B), {cfg.ab.sessions} scored "
                 "sessions per arm")
        rep = self.ab(cur, cand, f"{cfg.name}-c{n}", cfg.ab.sessions)
        row.ab = rep.to_dict()
        row.minutes["ab"] = (time.monotonic() - t) / 60
        action, why = ab_decision(rep, cfg.ab.margin, cfg.ab.max_revert_rise)
        if action == "promote":
            promote(self.policies, version)
            row.status, row.reason = "promoted", f"A/B: {why}"
        else:
            row.status, row.reason = "rolled_back", f"A/B: {why}"
        assert self.prod is not None  # the server now serves the policy kept, on every arm
        self.prod.wait_serving("A", version if action == "promote" else cur.version)
        self.say(f"  {row.status}: {why}")
        return row, trained

    def _scored(self, version: int | None = None, untrained: bool = False
                ) -> list[tuple[Any, float]]:
        """Scored sessions (of ``version``; only those no cycle trained on) with their reward,
        read without their trajectories."""
        from looprl.feedback.signals import get_signal

        fn, events = get_signal(self.cfg.signal), self.store.events_by_session()
        out = []
        for s in self.store.sessions(policy_version=version, untrained=untrained):
            if s.is_infra_error:
                continue
            rb = fn(s, events.get(s.id, []))
            if rb is not None:
                out.append((s, rb.total))
        return out


def optimizer_state(policy_dir: Path, fallback: str = "") -> Path | None:
    """The Adam state a window on ``policy_dir`` continues from: the one its own window left
    (``optimizer.pt`` beside its weights), else ``fallback`` (``RealtimeConfig.optimizer``: a
    checkpoint directory, whose newest checkpoint's, or a file), else None (a fresh optimizer)."""
    from looprl.feedback.cycle import OPTIMIZER_FILE

    own = Path(policy_dir) / OPTIMIZER_FILE
    if own.is_file():
        return own
    if not fallback:
        return None
    path = Path(fallback).expanduser()
    if path.is_dir():
        from looprl.trainer.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise ConfigError(f"optimizer = {fallback!r}: no complete checkpoint under it "
                              "(name a training run's ckpt directory or an optimizer.pt)")
        path = ckpt / OPTIMIZER_FILE
    if not path.is_file():
        raise ConfigError(f"optimizer = {fallback!r}: {path} does not exist (name a training "
                          "run's ckpt directory or an optimizer.pt)")
    return path


def window_optimizer(cfg: RealtimeConfig, policy_dir: Path) -> tuple[Path | None, bool]:
    """The Adam state a window on ``policy_dir`` continues (``optimizer_state``: the start model
    falls back on ``cfg.optimizer``) and whether it keeps that state's first moments: a policy's
    own state keeps them; the start model's run's state as ``cfg.optimizer_momentum`` says."""
    from looprl.feedback.cycle import OPTIMIZER_FILE

    is_start = policy_dir.resolve() == Path(cfg.model).expanduser().resolve()
    state = optimizer_state(policy_dir, cfg.optimizer if is_start else "")
    return state, cfg.optimizer_momentum or state == policy_dir / OPTIMIZER_FILE


def continue_adam(opt: Any, state: Path, model_path: Path | str, momentum: bool = True) -> None:
    """Load the Adam moments saved at ``state`` into ``opt`` (an optimizer over the model at
    ``model_path``), keeping ``opt``'s own settings (lr, betas, decay); ``momentum`` false zeroes
    the first moments, keeping the second alone."""
    import torch

    settings = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    try:
        opt.load_state_dict(torch.load(state, weights_only=True))
    except (ValueError, KeyError, RuntimeError) as e:
        raise ConfigError(f"{state} does not fit the model at {model_path} ({e}): name the "
                          "optimizer state of the run that trained it") from None
    for group, own in zip(opt.param_groups, settings, strict=True):
        group.update(own)
    if not momentum:
        for st in opt.state.values():
            st["exp_avg"].zero_()


def train_groups(cur: Any, groups: list[Group], grpo: GRPOConfig, steps: int, seed: int,
                 optimizer: Path | None = None, momentum: bool = True
                 ) -> tuple[Any, Any, dict[str, float], dict[str, Any]]:
    """``steps`` GRPO steps of policy ``cur``'s weights over ``groups`` (shuffled, each group in
    one step), continuing the Adam state in ``optimizer`` (None: a fresh one; ``momentum``
    false: its second moments alone, the first zeroed); returns (model, tokenizer, the steps'
    summed or averaged metrics, the optimizer state it left).

    Why continue: Adam's first steps from a fresh state move every weight by about ``lr`` in
    the sign of its gradient, however small and noisy that gradient is, and a window takes only
    a few steps; with the second moments of a run behind it, a weight moves in proportion to
    how large its gradient is against what that run saw (docs/experiments.md, stop 35)."""
    import torch

    from looprl.models.loading import load_model
    from looprl.trainer.step import GRPOStep

    torch.manual_seed(seed)
    lm = load_model(cur.path, dtype="float32")
    step = GRPOStep(lm.model, grpo, pad_id=lm.tokenizer.pad_token_id or 0)
    if optimizer is not None:
        continue_adam(step.optimizer, optimizer, cur.path, momentum=momentum)
    order = list(groups)
    random.Random(seed).shuffle(order)
    k = min(steps, len(order))
    metrics = [step.on_groups(order[i::k], current_version=cur.version).to_dict()
               for i in range(k)]
    summed = ("tokens", "sequences", "updates", "skipped_updates", "zero_variance_groups",
              "wall_s")
    out = {key: math.fsum(m[key] for m in metrics) for key in summed}
    for key in ("loss", "kl_mean", "is_ratio_max", "clip_fraction", "grad_norm",
                "mean_staleness"):
        out[key] = math.fsum(m[key] for m in metrics) / k
    return lm.model, lm.tokenizer, out, step.optimizer.state_dict()


def _gate_tasks(cfg: RealtimeConfig) -> list[Any]:
    if not cfg.gate.tasks:
        return []
    from looprl.tasks.taskset import load_tasks

    tasks = load_tasks(Path(cfg.gate.tasks).expanduser())[cfg.gate.skip:]
    if cfg.gate.limit:
        tasks = tasks[:cfg.gate.limit]
    if not tasks:
        raise ConfigError(f"gate.tasks {cfg.gate.tasks} holds no tasks after skipping "
                          f"{cfg.gate.skip}")
    if cfg.users.tasks:
        both = sorted({t.id for t in users_tasks(cfg)} & {t.id for t in tasks})
        if both:
            raise ConfigError(f"gate.tasks and the tasks users send share {len(both)} (e.g. "
                              f"{both[0]}): the gate must run tasks users never send (raise "
                              "gate.skip, or name another file)")
    return tasks


# -- the run --------------------------------------------------------------------------------


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


def init_run(cfg: RealtimeConfig, run: Path) -> Any:
    """``RUN/policies`` with the start model as its first version (a link, not a copy) and
    ``current.json`` naming it; returns that policy."""
    from looprl.feedback.cycle import promote, read_policy

    start = read_policy(Path(cfg.model).expanduser())
    policies = run / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    link = policies / f"v{start.version:04d}"
    if not link.exists():
        link.symlink_to(start.path, target_is_directory=True)
    return promote(policies, start.version)


def account(store: Any, sent: dict[str, Any] | None, rolled_back: set[int], current: int,
            signal: str) -> dict[str, int]:
    """Where every session went (module docstring): sent = stored = the categories' sum."""
    from looprl.feedback.signals import get_signal

    fn, events = get_signal(signal), store.events_by_session()
    trained: dict[str, int] = {}
    for c in store.cycles():
        for sid in c.session_ids:
            trained[sid] = trained.get(sid, 0) + 1
    acc = dict.fromkeys(("stored", "trained", "waiting", "superseded", "ab_only", "unscored",
                         "infra"), 0)
    ids = set()
    for s in store.sessions():
        ids.add(s.id)
        acc["stored"] += 1
        if s.id in trained:
            acc["trained"] += 1
        elif s.is_infra_error:
            acc["infra"] += 1
        elif s.policy_version in rolled_back:
            acc["ab_only"] += 1
        elif fn(s, events.get(s.id, [])) is None:
            acc["unscored"] += 1
        elif s.policy_version == current:
            acc["waiting"] += 1
        else:  # scored after its policy's window was taken; a newer policy is served now
            acc["superseded"] += 1
    acc["trained_twice"] = sum(n > 1 for n in trained.values())
    if sent is not None:
        got = {o["session_id"] for o in sent["sessions"] if o.get("session_id")}
        acc["sent"] = len(got)
        acc["lost"] = len(got - ids)
        acc["unknown"] = len(ids - got)
    else:
        acc["sent"], acc["lost"], acc["unknown"] = acc["stored"], 0, 0
    return acc


def run_loop(cfg: RealtimeConfig, runs: str | Path = "runs",
             say: Callable[[str], None] = print) -> LoopResult:
    """The whole run (module docstring): cycles, the final A/B, the report."""
    import torch

    from looprl.feedback.cycle import promote, read_policy

    torch.set_num_threads(cfg.threads)
    if threading.current_thread() is threading.main_thread():  # SIGTERM ends it like Ctrl-C:
        signal.signal(signal.SIGTERM, _stop_on_signal)  # users and server stop, nothing is cut
    run = Path(runs) / cfg.name
    if (run / "cycles.jsonl").exists():
        raise ConfigError(f"{run} holds a finished or running loop; pick another name (-o name=...)")
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run / "config.json")
    start = init_run(cfg, run)
    loop = Loop(cfg, run, say)
    say(f"real-time RL loop {run}: start policy v{start.version} ({start.path})")
    loop.prod = prod = start_production(cfg, run, loop.policies, run / "feedback.db")
    server = run / "server.json"  # where real users (or a client) find it: owner-only
    server.touch(mode=0o600)
    server.write_text(json.dumps({"url": prod.url, "token": prod.token}))
    say(f"serving on {prod.url} (URL and token in {server})")
    rows: list[CycleRow] = []
    final: dict[str, Any] = {}
    stopped, phase = "", "the start"
    took: list[float] = []
    try:
        for n in range(1, cfg.cycles + 1):
            fits, why = loop.fits(took)
            if not fits:
                say(f"stopping after {n - 1} cycles: {why}")
                break
            phase, t = f"cycle {n}", loop.minutes()
            row = loop.cycle(n)
            took.append(loop.minutes() - t)
            rows.append(row)
            with (run / "cycles.jsonl").open("a") as fh:
                fh.write(json.dumps(dataclasses.asdict(row)) + "\n")
            if row.status == "skipped":
                break
            final = row.ab or final
        last = read_policy(loop.policies)
        if cfg.ab.final_sessions and last.version != start.version:
            say(f"final A/B: start v{start.version} (A) vs v{last.version} (B), "
                f"{cfg.ab.final_sessions} scored sessions per arm")
            phase = "the final A/B"
            promote(loop.policies, start.version)
            try:
                prod.wait_serving("A", start.version)
                rep = loop.ab(start, last, f"{cfg.name}-final", cfg.ab.final_sessions)
            finally:  # stopped or not, the last promoted policy is the one left serving
                promote(loop.policies, last.version)
            prod.wait_serving("A", last.version)
            final = {**rep.to_dict(), "final": True, "a": start.version, "b": last.version}
            (run / "final_ab.json").write_text(json.dumps(final, indent=1))
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: what finished is reported, not lost
        stopped = f"{e or 'interrupted'} during {phase}"
        say(f"{stopped}: the report covers the {len(rows)} finished cycle(s)")
    finally:
        say("stopping users and server (in-flight sessions finish)")
        prod.stop()
    sent = json.loads((run / "users.json").read_text()) if (run / "users.json").is_file() else None
    rolled = {r.candidate_version for r in rows
              if r.status in ("rolled_back", "rejected") and r.candidate_version is not None}
    bad = [r for r in rows if r.injected]
    rollback_ok = None if not bad else int(bad[0].status in ("rolled_back", "rejected"))
    acc = account(loop.store, sent, rolled, read_policy(loop.policies).version, cfg.signal)
    res = LoopResult(run, rows, final, acc, rollback_ok, stopped)
    from looprl.feedback.report import write_loop_report

    write_loop_report(res, loop.store, cfg)
    (run / "result.txt").write_text(res.line() + "\n")
    return res
