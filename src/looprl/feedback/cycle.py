"""One real-time RL cycle on demand: production sessions with feedback -> one GRPO step -> gate.

    res = run_cycle(FeedbackStore("fb.db"), model="~/.cache/looprl/models/default", out="policies",
                    cfg=CycleConfig(min_sessions=64), tasks=load_tasks("heldout.jsonl"))
    res.status        # promoted | rejected | candidate | skipped
    # looprl feedback cycle --store fb.db --model M --out policies [--tasks heldout.jsonl]

``looprl feedback loop`` (``feedback.loop``) runs cycles one after another beside a server it
starts, with an A/B test after the gate; this is one cycle on a store and a policies directory
someone else serves from. Both are made of the same parts:

1. The current policy is ``OUT/current.json`` (written by promotions) or, before the first one,
   ``--model``; its version is in the model dir's ``looprl_policy.json`` (0 when absent)
   (``feedback.policies``).
2. The window: sessions served by the current version, not trained on by an earlier cycle, with a
   reward from ``signals.py`` (``feedback.window``: sessions still waiting for feedback stay for a
   later cycle; infrastructure failures are never scored).
3. Advantages: the window's sessions form ONE group and each gets ``A = r - mean(r over the
   window)``, the batch baseline (``feedback.window.window_group``; bigger windows help).
4. One ``GRPOStep`` on the current weights (``feedback.update``); the candidate is saved as
   ``OUT/vNNNN/`` (HF format, loadable by ``looprl serve``), with ``looprl_policy.json``. With
   ``feedback.follow_ups`` (``--follow-ups``), users' dissatisfied follow-ups are hints first,
   through the real-time loop's path (``follow_ups.hint_window``): each such session is
   continued by the current policy after the turn the follow-up answers, and the step distils
   the continuations into the policy without them (``trainer.distill``); they are appended to
   ``OUT/hinted.jsonl`` with the candidate's version.
5. Gate: with held-out ``tasks``, the bench gate (``feedback.gate``) decides: promoted
   (``current.json`` now names the candidate) or rejected (a bench that graded nothing is an
   infrastructure failure: the candidate is kept, ungated). Without tasks the candidate waits for
   an A/B test (``looprl serve --model OUT --model-b OUT/vNNNN``, then ``looprl feedback
   promote``) unless ``promote_ungated``.
6. The cycle is recorded in the store with the sessions it trained on (each is trained on once).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from looprl.config import FieldError, Range, Share, Tokens, check_choice, check_ranges
from looprl.feedback.follow_ups import hint_window, save_hinted
from looprl.feedback.gate import gate
from looprl.feedback.policies import POINTER, PolicyRef, current_policy, next_version, promote
from looprl.feedback.signals import SIGNALS
from looprl.feedback.store import FeedbackStore
from looprl.feedback.update import make_candidate
from looprl.feedback.window import window, window_group
from looprl.harness.run_state import AgentConfig
from looprl.trainer.advantages import is_zero_variance
from looprl.trainer.batch import Credit
from looprl.trainer.config import FeedbackDistill, GRPOConfig, GRPOExperimental
from looprl.trainer.losses import LossParams
from looprl.types import Group, Task, Trajectory


@dataclass(frozen=True)
class CycleConfig:
    """Knobs of one cycle."""

    signal: str = "edit_outcome"
    """Reward signal (``feedback.signals.SIGNALS``)."""
    min_sessions: Annotated[int, Range(1, 10**7)] = 32
    """Scored sessions the window needs before a step (a batch baseline needs a batch)."""
    lr: Annotated[float, Range(0.0, 1.0, lo_open=True)] = 1e-6
    """One step on live data: small, as RL on a pretrained policy is."""
    loss: str = "dr_grpo"
    norm_tokens: Tokens = 1024
    micro_batch_tokens: Tokens = 4096
    max_grad_norm: Annotated[float, Range(0.0, math.inf, lo_open=True)] = 1.0
    promote_ungated: bool = False
    """Without held-out tasks, promote anyway (else the candidate waits for an A/B test)."""
    bench_k: Annotated[int, Range(1, 10_000)] = 1
    bench_max_turns: Annotated[int, Range(1, 100_000)] = 8
    bench_max_new_tokens: Tokens = 256
    bench_context_window: Tokens = 4096
    max_drop: Share = 0.02
    """Gate: largest pass@1 drop tolerated at the CI's lower bound (``bench.gate.compare``)."""
    min_gain: Share = 0.0
    feedback: FeedbackDistill = field(default_factory=FeedbackDistill)
    """Users' dissatisfied follow-ups as hints (``follow_ups`` with ``coef`` > 0, the
    distillation term's weight); the window is one group, so ``max_per_group`` bounds the
    cycle's continuations."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The budgets the sessions were served with (``looprl serve``'s): the continuations'."""

    def __post_init__(self) -> None:
        check_choice("signal", self.signal, SIGNALS)
        check_ranges(self)  # the CLI builds it from its flags, not through from_dict
        if self.feedback.follow_ups and not self.feedback.coef > 0:
            raise FieldError("feedback.coef", "follow-ups as hints are distilled with this "
                             "weight: set it > 0 (e.g. 0.5)")

    def grpo(self) -> GRPOConfig:
        """The step's GRPO settings: the batch baseline, no std division."""
        return GRPOConfig(lr=self.lr, loss=self.loss, std_norm="never",
                          experimental=GRPOExperimental(
                              micro_batch_tokens=self.micro_batch_tokens,
                              max_grad_norm=self.max_grad_norm,
                              objective=LossParams(norm_tokens=self.norm_tokens),
                              credit=Credit(skip_zero_variance=True), feedback=self.feedback))


@dataclass(frozen=True)
class CycleResult:
    cycle_id: int
    status: str
    """promoted | rejected | candidate (saved, awaiting A/B) | skipped (nothing trained)."""
    reason: str
    policy_version: int
    candidate_version: int | None = None
    candidate_path: str | None = None
    sessions: int = 0
    mean_reward: float | None = None
    step: dict[str, float] | None = None
    gate: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def bench_gate(current: PolicyRef, candidate: PolicyRef, tasks: list[Task], cfg: CycleConfig
               ) -> dict[str, Any]:
    """The gate (``feedback.gate.gate``) with the cycle's bench settings; both reports are kept
    in the candidate's directory."""
    from looprl.bench.run import BenchSettings

    st = BenchSettings(max_turns=cfg.bench_max_turns, max_new_tokens=cfg.bench_max_new_tokens,
                       context_window=cfg.bench_context_window, concurrency=2)
    return gate(current, candidate, tasks, cfg.bench_k, st,
                (candidate.path / "bench_current.json", candidate.path / "bench_candidate.json"),
                cfg.max_drop, cfg.min_gain)


def _skip(store: FeedbackStore, policy: PolicyRef, reason: str, n: int) -> CycleResult:
    cid = store.add_cycle(policy_version=policy.version, candidate_version=None, status="skipped",
                          reason=reason, metrics={"sessions": n})
    return CycleResult(cid, "skipped", reason, policy.version, sessions=n)


def _decide(out: Path, policy: PolicyRef, cand: PolicyRef, gate_res: dict[str, Any] | None,
            cfg: CycleConfig) -> tuple[str, str]:
    """(status, reason) of a saved candidate, from the gate's verdict (module docstring, 5)."""
    if gate_res is not None and gate_res["passed"] is None:
        return "candidate", f"saved {cand.path}; not gated: {gate_res['reason']}"
    if gate_res is not None:
        verdict = "passed" if gate_res["passed"] else "failed"
        return ("promoted" if gate_res["passed"] else "rejected",
                f"bench gate {verdict}: {gate_res['reason']}")
    if cfg.promote_ungated:
        return "promoted", "promoted without a bench gate (promote_ungated)"
    serving = out if (out / POINTER).is_file() else policy.path
    return "candidate", (f"saved {cand.path}; no held-out tasks: A/B it (looprl serve --model "
                         f"{serving} --model-b {cand.path}) then "
                         f"`looprl feedback promote --out {out} --version {cand.version}`")


def _hinted(groups: list[Group], store: FeedbackStore, trajs: list[Trajectory],
            policy: PolicyRef, out: Path, version: int, cfg: CycleConfig) -> list[Group]:
    """``groups`` carrying the window's follow-ups' continuations when ``cfg.feedback`` asks for
    them (module docstring, 4), saved to ``OUT/hinted.jsonl``."""
    fb = cfg.feedback
    if not (fb.follow_ups and fb.coef > 0):
        return groups
    hinted = hint_window(store, trajs, groups, policy.path, cfg.agent,
                         per_group=fb.max_per_group)
    save_hinted(out / "hinted.jsonl", hinted.hinted, candidate_version=version)
    return hinted.groups


def run_cycle(store: FeedbackStore, model: str | Path, out: str | Path,
              cfg: CycleConfig | None = None, tasks: list[Task] | None = None) -> CycleResult:
    """One cycle (module docstring); always recorded in the store, never raises for "no data"."""
    cfg = cfg or CycleConfig()
    o = Path(out).expanduser()
    o.mkdir(parents=True, exist_ok=True)
    policy = current_policy(model, o)
    trajs = window(store, policy.version, cfg.signal)
    rewards = [t.reward.total for t in trajs if t.reward is not None]
    if len(trajs) < cfg.min_sessions:
        return _skip(store, policy, f"{len(trajs)} scored untrained sessions of policy "
                                    f"v{policy.version}; need >= {cfg.min_sessions}", len(trajs))
    if is_zero_variance(rewards):
        return _skip(store, policy, f"all {len(trajs)} rewards equal ({rewards[0]:+.2f}): "
                                    "no advantage signal; wait for more feedback", len(trajs))
    version = next_version(o, policy.version)
    mean_r = sum(rewards) / len(rewards)
    groups = _hinted([window_group(trajs, f"cycle-v{version}")], store, trajs, policy, o,
                     version, cfg)
    cand, step = make_candidate(policy, groups, cfg.grpo(), o, version, {
        "parent_version": policy.version, "parent_path": str(policy.path),
        "sessions": len(trajs), "mean_reward": mean_r, "signal": cfg.signal})
    if cand is None:
        return _skip(store, policy, "the step applied no update (non-finite gradient)", len(trajs))
    gate_res = bench_gate(policy, cand, tasks, cfg) if tasks else None
    status, reason = _decide(o, policy, cand, gate_res, cfg)
    if status == "promoted":
        promote(o, version)
    metrics = {"sessions": len(trajs), "mean_reward": mean_r,
               **{f"step_{k}": v for k, v in step.items()},
               **({f"gate_{k}": v for k, v in gate_res.items()} if gate_res else {})}
    cid = store.add_cycle(policy_version=policy.version, candidate_version=version, status=status,
                          reason=reason, metrics=metrics,
                          trained={t.id: t.reward.total for t in trajs if t.reward is not None})
    return CycleResult(cid, status, reason, policy.version, version, str(cand.path), len(trajs),
                       mean_r, step, gate_res)
