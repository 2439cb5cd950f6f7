"""One cycle of the real-time loop: window -> train -> gate -> A/B -> promote or roll back.

    loop = Loop(cfg, run, say=print)
    loop.prod = start_production(cfg, run, loop.policies, RunDir(run).feedback_db)
    row = loop.cycle(1)   # a CycleRow, recorded in the store with the sessions it trained on

What each step does and why: ``feedback.loop``'s docstring. The parts are those of
``looprl feedback cycle``: ``feedback.window`` (sessions -> groups), ``feedback.update`` (GRPO
steps -> candidate), ``feedback.gate`` (bench gate, A/B decision), ``feedback.policies`` (the
pointers the server follows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprl.errors import ConfigError
from looprl.feedback.ab import ABReport
from looprl.feedback.gate import ab_decision, gate
from looprl.feedback.policies import (
    PolicyRef,
    next_version,
    offer_candidate,
    promote,
    read_policy,
    withdraw_candidate,
)
from looprl.feedback.production import Production
from looprl.feedback.realtime_config import RealtimeConfig, gate_tasks, users_tasks
from looprl.feedback.store import FeedbackStore, SessionRecord
from looprl.feedback.update import make_candidate, window_optimizer
from looprl.feedback.window import (
    request_history,
    scored_sessions,
    window,
    window_groups,
)
from looprl.rundir import RunDir
from looprl.types import Group, JSONScalar, Trajectory


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


class Loop:
    """The state of one run (``feedback.loop.run_loop``)."""

    def __init__(self, cfg: RealtimeConfig, run: Path, say: Callable[[str], None]) -> None:
        self.cfg, self.run, self.say = cfg, run, say
        self.policies = RunDir(run).policies
        self.store = FeedbackStore(RunDir(run).feedback_db)
        self.t0 = time.monotonic()
        self.gate_tasks = gate_tasks(cfg)
        self.users_tasks = users_tasks(cfg) if cfg.users.tasks else []
        """The tasks simulated users send (their gold patches redact follow-up hints)."""
        self.prod: Production | None = None
        self.phase = "the start"
        """What the run is doing (a stop says where it stopped)."""

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
    def gate(self, current: PolicyRef, cand: PolicyRef) -> dict[str, Any]:
        """Bench both versions on the gate tasks (``RUN/gate/vNNNN.json``) and compare."""
        from looprl.bench.run import BenchSettings

        g = self.cfg.gate
        st = BenchSettings(max_turns=g.max_turns, max_new_tokens=g.max_new_tokens,
                           max_total_new_tokens=g.max_total_new_tokens,
                           context_window=g.context_window, concurrency=g.concurrency,
                           temperature=g.temperature)
        reports = (RunDir(self.run).gate_report(current.version),
                   RunDir(self.run).gate_report(cand.version))
        res = gate(current, cand, self.gate_tasks, g.k, st, reports, g.max_drop)
        res["passed"] = bool(res["passed"])  # a bench that graded nothing never promotes
        return res

    # -- A/B -----------------------------------------------------------------------------------
    def ab(self, a: PolicyRef, b: PolicyRef, experiment: str, sessions: int) -> ABReport:
        """Offer ``b`` beside ``a`` (the current policy) until each arm has ``sessions`` scored
        sessions or the timeout; returns the ``ab.ABReport``."""
        from looprl.feedback.ab import ab_report

        assert self.prod is not None
        offer_candidate(self.policies, b.version, experiment, self.cfg.ab.split_b)
        versions = {"A": a.version, "B": b.version}

        def report() -> ABReport:
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
        """One cycle (``feedback.loop``'s docstring); recorded in the store with its outcome and
        the sessions it trained on (each once)."""
        row, trained = self._cycle(n)
        if trained:
            metrics: dict[str, JSONScalar] = {
                "sessions": len(trained), **row.train,
                **{f"gate_{k}": v for k, v in row.gate.items()
                   if isinstance(v, (int, float, str, bool))}}
            self.store.add_cycle(policy_version=row.policy_version,
                                 candidate_version=row.candidate_version, status=row.status,
                                 reason=row.reason, metrics=metrics, trained=trained)
        return row

    def _cycle(self, n: int) -> tuple[CycleRow, dict[str, float]]:
        """The cycle's steps; returns its row and the sessions it trained on (id -> reward)."""
        cur = read_policy(self.policies)
        row = CycleRow(n, cur.version, injected=n == self.cfg.inject_bad_cycle)
        collected = self.collect(row, cur)
        if collected is None:
            return row, {}
        trajs, groups = collected
        trained = {x.id: x.reward.total for x in trajs if x.reward is not None}
        fb = self.cfg.grpo.experimental.feedback
        if fb.follow_ups and fb.coef > 0:
            groups = self.follow_ups(row, cur, trajs, groups)
        cand = self._train(row, cur, groups, len(trajs))
        if cand is None or not self._gate(row, cur, cand):
            return row, trained
        self._ab(row, cur, cand)
        return row, trained

    def collect(self, row: CycleRow, cur: PolicyRef
                ) -> tuple[list[Trajectory], list[Group]] | None:
        """Wait for the window, then its trajectories and groups; None when it did not fill."""
        cfg, n, t = self.cfg, row.cycle, time.monotonic()

        def ready() -> tuple[bool, str]:  # counted without loading trajectories: polled often
            k = len(self._scored(version=cur.version, untrained=True))
            return k >= cfg.window, f"{k}/{cfg.window} scored sessions of v{cur.version}"

        self.say(f"cycle {n}: collecting a window of v{cur.version}")
        if not self.wait(ready, cfg.window_timeout_min * 60, "window"):
            row.status, row.reason = "skipped", "the window did not fill"
            return None
        trajs = window(self.store, cur.version, cfg.signal)[:cfg.window]
        used = {x.id for x in trajs}
        history = request_history([(s.request, r) for s, r in self._scored()
                                   if s.id not in used])
        groups = window_groups(trajs, history, f"c{n}")
        rewards = [x.reward.total for x in trajs if x.reward is not None]
        row.window = {"sessions": len(trajs), "mean_reward": math.fsum(rewards) / len(rewards),
                      "groups": sum(len(g.trajectories) > 1 for g in groups),
                      "singletons": sum(len(g.trajectories) == 1 for g in groups)}
        row.minutes["window"] = (time.monotonic() - t) / 60
        return trajs, groups

    def follow_ups(self, row: CycleRow, cur: PolicyRef, trajs: list[Trajectory],
                   groups: list[Group]) -> list[Group]:
        """The window's dissatisfied follow-ups as hints (``follow_ups.hint_window``): each
        hinted session continued by the serving policy, at most ``feedback.max_per_group`` a
        group, saved to ``RUN/trajectories/hinted.jsonl``; the groups carry them."""
        from looprl.feedback.follow_ups import hint_window, save_hinted
        from looprl.harness.run_state import AgentConfig

        t, s = time.monotonic(), self.cfg.serve
        agent = AgentConfig(max_turns=s.max_turns, max_new_tokens=s.max_new_tokens,
                            context_window=s.context_window)  # what the sessions were served with
        out = hint_window(self.store, trajs, groups, cur.path, agent, known=self.users_tasks,
                          per_group=self.cfg.grpo.experimental.feedback.max_per_group,
                          concurrency=s.max_concurrent)
        row.window |= {"follow_up_hints": out.hints, "hinted": len(out.hinted)}
        if not out.hints:
            return out.groups
        save_hinted(RunDir(self.run).trajectories / "hinted.jsonl", out.hinted, cycle=row.cycle)
        row.minutes["follow_ups"] = (time.monotonic() - t) / 60
        self.say(f"  {out.hints} dissatisfied follow-ups as hints: {len(out.hinted)} continued")
        return out.groups

    def _train(self, row: CycleRow, cur: PolicyRef, groups: list[Group], sessions: int
               ) -> PolicyRef | None:
        """The window's GRPO steps, continuing the serving policy's Adam state; the candidate
        (broken on purpose in the injected cycle), or None when no step applied an update."""
        cfg, n, t = self.cfg, row.cycle, time.monotonic()
        self.say(f"  training on {sessions} sessions ({row.window['groups']} repeated requests, "
                 f"{row.window['singletons']} single), mean reward {row.window['mean_reward']:+.3f}")
        state, momentum = window_optimizer(cfg, Path(cur.path))
        noise = cfg.inject_noise if row.injected else 0.0
        cand, row.train = make_candidate(
            cur, groups, cfg.grpo, self.policies, next_version(self.policies, cur.version), {
                "parent_version": cur.version, "parent_path": str(cur.path),
                "sessions": sessions, "cycle": n, "injected_noise": noise},
            steps=cfg.steps, seed=cfg.seed + n, optimizer=state, momentum=momentum, noise=noise,
            save_optimizer=True)
        if cand is None:  # every group's rewards were equal: the window is used up
            row.status = "no_update"
            row.reason = "no group carried an advantage signal (equal rewards): nothing to offer"
            self.say(f"  {row.reason}")
            return None
        row.candidate_version = cand.version
        row.minutes["train"] = (time.monotonic() - t) / 60
        return cand

    def _gate(self, row: CycleRow, cur: PolicyRef, cand: PolicyRef) -> bool:
        """The bench gate (when there are gate tasks); False when it rejected the candidate."""
        if not self.gate_tasks:
            return True
        t = time.monotonic()
        self.say(f"  gate: bench v{cur.version} and v{cand.version} on {len(self.gate_tasks)} "
                 "tasks")
        row.gate = self.gate(cur, cand)
        row.minutes["gate"] = (time.monotonic() - t) / 60
        self.say(f"  gate {'passed' if row.gate['passed'] else 'FAILED'}: {row.gate['reason']}")
        if not row.gate["passed"]:
            row.status, row.reason = "rejected", f"gate: {row.gate['reason']}"
        return bool(row.gate["passed"])

    def _ab(self, row: CycleRow, cur: PolicyRef, cand: PolicyRef) -> None:
        """The A/B of the candidate against the serving policy; promote or roll back."""
        cfg, t = self.cfg, time.monotonic()
        self.say(f"  A/B: v{cur.version} (A) vs v{cand.version} (B), {cfg.ab.sessions} scored "
                 "sessions per arm")
        rep = self.ab(cur, cand, f"{cfg.name}-c{row.cycle}", cfg.ab.sessions)
        row.ab = rep.to_dict()
        row.minutes["ab"] = (time.monotonic() - t) / 60
        action, why = ab_decision(rep, cfg.ab.margin, cfg.ab.max_revert_rise)
        if action == "promote":
            promote(self.policies, cand.version)
            row.status, row.reason = "promoted", f"A/B: {why}"
        else:
            row.status, row.reason = "rolled_back", f"A/B: {why}"
        assert self.prod is not None  # the server now serves the policy kept, on every arm
        self.prod.wait_serving("A", cand.version if action == "promote" else cur.version)
        self.say(f"  {row.status}: {why}")

    def _scored(self, version: int | None = None, untrained: bool = False
                ) -> list[tuple[SessionRecord, float]]:
        """Scored sessions (of ``version``; only those no cycle trained on) with their reward,
        read without their trajectories."""
        return [(s, rb.total) for s, rb in scored_sessions(
            self.store, self.cfg.signal, version=version, untrained=untrained)]
