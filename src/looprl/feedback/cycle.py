"""One real-time RL cycle: production sessions with feedback -> one GRPO step -> gate -> promote.

    res = run_cycle(FeedbackStore("fb.db"), model="~/.cache/looprl/models/default", out="policies",
                    cfg=CycleConfig(min_sessions=64), tasks=load_tasks("heldout.jsonl"))
    res.status        # promoted | rejected | candidate | skipped
    # looprl feedback cycle --store fb.db --model M --out policies [--tasks heldout.jsonl]

1. The current policy is ``OUT/current.json`` (written by promotions) or, before the first one,
   ``--model``; its version is in the model dir's ``looprl_policy.json`` (0 when absent).
2. The window: sessions served by the current version, not trained on by an earlier cycle, with a
   reward from ``signals.py`` (sessions still waiting for feedback stay for a later cycle;
   infrastructure failures are never scored). Their trajectories are token-exact: the tokens and
   logprobs the serving engine sampled.
3. Advantages: production has ONE sample per prompt, so there is no group of G runs of a task to
   compare against. The baseline is the batch: the window's sessions of one policy version form a
   single ``Group`` and each gets ``A = r - mean(r over the window)`` (Dr. GRPO's
   ``mean_centered`` in ``looprl.trainer.advantages``, no std division). This is a REINFORCE-style
   batch baseline; prompts differ in difficulty, so it is noisier than a per-task group — bigger
   windows help.
4. One ``GRPOStep`` on the current weights; the candidate is saved as ``OUT/vNNNN/`` (HF format,
   loadable by ``looprl serve``), with ``looprl_policy.json`` (version, parent, cycle, sessions).
5. Gate: with held-out ``tasks``, ``looprl.bench`` runs current and candidate and
   ``bench.gate.compare`` decides: promoted (``current.json`` now names the candidate) or rejected
   (a bench that graded nothing is an infrastructure failure: the candidate is kept, ungated).
   Without tasks the candidate waits for an A/B test (``looprl serve --model OUT --model-b
   OUT/vNNNN``, then ``looprl feedback promote``) unless ``promote_ungated``.
6. The cycle is recorded in the store with the sessions it trained on (each is trained on once).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.config import FieldError, check_choice
from looprl.errors import ConfigError
from looprl.feedback.signals import SIGNALS, get_signal
from looprl.feedback.store import FeedbackStore
from looprl.trainer.advantages import is_zero_variance
from looprl.types import Group, Task, Trajectory

POINTER = "current.json"
POLICY_META = "looprl_policy.json"
OPTIMIZER_FILE = "optimizer.pt"
"""Beside a candidate's weights: the Adam state its training left (``feedback.loop``)."""


@dataclass(frozen=True)
class PolicyRef:
    """A servable policy: an HF model directory and its version number."""

    path: Path
    version: int


@dataclass(frozen=True)
class CycleConfig:
    """Knobs of one cycle."""

    signal: str = "edit_outcome"
    """Reward signal (``feedback.signals.SIGNALS``)."""
    min_sessions: int = 32
    """Scored sessions the window needs before a step (a batch baseline needs a batch)."""
    lr: float = 1e-6
    """One step on live data: small, as RL on a pretrained policy is."""
    loss: str = "dr_grpo"
    norm_tokens: int = 1024
    micro_batch_tokens: int = 4096
    max_grad_norm: float = 1.0
    promote_ungated: bool = False
    """Without held-out tasks, promote anyway (else the candidate waits for an A/B test)."""
    bench_k: int = 1
    bench_max_turns: int = 8
    bench_max_new_tokens: int = 256
    bench_context_window: int = 4096
    max_drop: float = 0.02
    """Gate: largest pass@1 drop tolerated at the CI's lower bound (``bench.gate.compare``)."""
    min_gain: float = 0.0

    def __post_init__(self) -> None:
        check_choice("signal", self.signal, SIGNALS)
        if self.min_sessions < 1:
            raise FieldError("min_sessions", f"must be >= 1, got {self.min_sessions}")
        if not 0.0 < self.lr < math.inf:
            raise FieldError("lr", f"must be a finite number > 0, got {self.lr!r}")


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


def read_policy(path: str | Path) -> PolicyRef:
    """The policy at ``path``: a policies dir with ``current.json``, or a model dir."""
    p = Path(path).expanduser()
    if (p / POINTER).is_file():
        ptr = json.loads((p / POINTER).read_text())
        return PolicyRef((p / ptr["path"]).resolve(), int(ptr["version"]))
    if (p / "config.json").is_file():
        meta = p / POLICY_META
        version = int(json.loads(meta.read_text())["version"]) if meta.is_file() else 0
        return PolicyRef(p.resolve(), version)
    raise ConfigError(f"{p} is neither a model directory (config.json) nor a policies directory "
                      f"({POINTER}); pass --model DIR of an HF checkpoint (looprl model init)")


def promote(out: str | Path, version: int) -> PolicyRef:
    """Point ``OUT/current.json`` at ``OUT/vNNNN`` (atomic rename)."""
    o = Path(out).expanduser()
    name = f"v{version:04d}"
    if not (o / name / "config.json").is_file():
        have = sorted(d.name for d in o.glob("v[0-9]*") if d.is_dir()) if o.is_dir() else []
        raise ConfigError(f"no candidate {o / name}; versions in {o}: {have or 'none'}")
    tmp = o / (POINTER + ".tmp")
    tmp.write_text(json.dumps({"version": version, "path": name, "promoted_at": time.time()}))
    os.replace(tmp, o / POINTER)
    return PolicyRef((o / name).resolve(), version)


CANDIDATE = "candidate.json"
"""``OUT/candidate.json``: the candidate a serve with this policies dir A/B tests as arm B."""


def offer_candidate(out: str | Path, version: int, experiment: str, split_b: float) -> PolicyRef:
    """Point ``OUT/candidate.json`` at ``OUT/vNNNN`` for an A/B test on ``split_b`` of users."""
    o = Path(out).expanduser()
    name = f"v{version:04d}"
    if not (o / name / "config.json").is_file():
        have = sorted(d.name for d in o.glob("v[0-9]*") if d.is_dir()) if o.is_dir() else []
        raise ConfigError(f"no candidate {o / name}; versions in {o}: {have or 'none'}")
    if not 0.0 <= split_b <= 1.0:
        raise ConfigError(f"split_b must be in [0, 1] (the share of users on arm B), got {split_b}")
    tmp = o / (CANDIDATE + ".tmp")
    tmp.write_text(json.dumps({"version": version, "path": name, "experiment": experiment,
                               "split_b": split_b, "offered_at": time.time()}))
    os.replace(tmp, o / CANDIDATE)
    return PolicyRef((o / name).resolve(), version)


def withdraw_candidate(out: str | Path) -> None:
    """Remove ``OUT/candidate.json`` (nothing to do when there is none)."""
    (Path(out).expanduser() / CANDIDATE).unlink(missing_ok=True)


def read_candidate(out: str | Path) -> tuple[PolicyRef, str, float] | None:
    """The offered candidate, its experiment and split_b; None when none is offered."""
    p = Path(out).expanduser() / CANDIDATE
    try:
        ptr = json.loads(p.read_text())
        return (PolicyRef((p.parent / ptr["path"]).resolve(), int(ptr["version"])),
                str(ptr["experiment"]), float(ptr["split_b"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{p} is not a candidate pointer ({type(e).__name__}: {e}); rewrite it "
                          "with offer_candidate or remove it") from None


def init_policies(out: str | Path, model: str | Path) -> PolicyRef:
    """Create ``OUT/current.json`` pointing at ``model`` (absolute path) unless it exists."""
    o = Path(out).expanduser()
    if (o / POINTER).is_file():
        return read_policy(o)
    ref = read_policy(model)  # a policies dir given as the model: its current model dir
    o.mkdir(parents=True, exist_ok=True)
    tmp = o / (POINTER + ".tmp")
    tmp.write_text(json.dumps({"version": ref.version, "path": str(ref.path),
                               "promoted_at": time.time()}))
    os.replace(tmp, o / POINTER)
    return ref


def current_policy(model: str | Path, out: str | Path) -> PolicyRef:
    o = Path(out).expanduser()
    return read_policy(o) if (o / POINTER).is_file() else read_policy(model)


def window(store: FeedbackStore, version: int, signal: str, untrained: bool = True
           ) -> list[Trajectory]:
    """Sessions of ``version`` with a reward (only those no cycle trained on, unless
    ``untrained`` is False), as trajectories carrying it."""
    fn, events = get_signal(signal), store.events_by_session()
    out = []
    for s in store.sessions(policy_version=version, untrained=untrained, with_trajectory=True):
        if s.trajectory is None or s.is_infra_error or not s.trajectory.segments:
            continue
        rb = fn(s, events.get(s.id, []))
        if rb is not None:  # the request (prompt and repo) names the task a session attempted
            out.append(dataclasses.replace(s.trajectory, reward=rb, id=s.id, metadata={
                **s.trajectory.metadata, "request": f"{s.repo}\0{s.prompt}"}))
    return out


def window_group(trajs: list[Trajectory], tag: str) -> Group:
    """All of a window's sessions as ONE group: the batch mean is the baseline (module doc, 3)."""
    return Group(task_id="feedback-window", group_id=tag, trajectories=tuple(trajs),
                 metadata={"sessions": len(trajs), "baseline_from": "batch_mean"})


def next_version(out: Path, current: int) -> int:
    used = [int(d.name[1:]) for d in out.glob("v[0-9]*") if d.name[1:].isdigit()]
    return max([current, *used]) + 1


def save_candidate(model: Any, tokenizer: Any, out: Path, version: int, meta: dict[str, Any],
                   optimizer_state: dict[str, Any] | None = None) -> Path:
    final = out / f"v{version:04d}"
    tmp = out / f".v{version:04d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if optimizer_state is not None:
        import torch

        torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
    (tmp / POLICY_META).write_text(json.dumps({"version": version, **meta}, indent=1))
    os.replace(tmp, final)
    return final


def train_window(policy: PolicyRef, trajs: list[Trajectory], cfg: CycleConfig, tag: str
                 ) -> tuple[Any, Any, dict[str, float]]:
    """One GRPO step of the current weights on the window; returns (model, tokenizer, metrics)."""
    from looprl.models.loading import load_model
    from looprl.trainer.step import GRPOConfig, GRPOStep

    lm = load_model(policy.path, dtype="float32")
    vocab = lm.model.get_input_embeddings().num_embeddings
    top = max(max(s.token_ids_T) for t in trajs for s in t.segments)
    if top >= vocab:
        raise ConfigError(f"sessions hold token id {top} but the model at {policy.path} has "
                          f"{vocab} embeddings: they were served by another tokenizer/model")
    gcfg = GRPOConfig(lr=cfg.lr, loss=cfg.loss, std_norm="never", norm_tokens=cfg.norm_tokens,
                      micro_batch_tokens=cfg.micro_batch_tokens, max_grad_norm=cfg.max_grad_norm,
                      skip_zero_variance=True)
    step = GRPOStep(lm.model, gcfg, pad_id=lm.tokenizer.pad_token_id or 0)
    metrics = step.on_groups([window_group(trajs, tag)], current_version=policy.version)
    return lm.model, lm.tokenizer, metrics.to_dict()


def bench_policy(path: Path, tasks: list[Task], k: int, settings: Any, out: Path
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
    c = compare(current, candidate, max_drop=max_drop, min_gain=min_gain)
    p1 = c.diffs[0]
    return {"passed": c.passed, "reason": c.reason, "n_tasks": c.n_tasks,
            "pass1_current": p1.a, "pass1_candidate": p1.b, "ci_low": p1.lo, "ci_high": p1.hi}


def gate(current: PolicyRef, candidate: Path, tasks: list[Task], cfg: CycleConfig
         ) -> dict[str, Any]:
    """Bench both policies on the held-out tasks and compare (``gate_reports``)."""
    from looprl.bench.run import BenchSettings

    st = BenchSettings(max_turns=cfg.bench_max_turns, max_new_tokens=cfg.bench_max_new_tokens,
                       context_window=cfg.bench_context_window, concurrency=2)
    return gate_reports(
        bench_policy(current.path, tasks, cfg.bench_k, st, candidate / "bench_current.json"),
        bench_policy(candidate, tasks, cfg.bench_k, st, candidate / "bench_candidate.json"),
        cfg.max_drop, cfg.min_gain)


def _skip(store: FeedbackStore, policy: PolicyRef, reason: str, n: int) -> CycleResult:
    cid = store.add_cycle(policy_version=policy.version, candidate_version=None, status="skipped",
                          reason=reason, metrics={"sessions": n})
    return CycleResult(cid, "skipped", reason, policy.version, sessions=n)


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
    model_, tok, step = train_window(policy, trajs, cfg, f"cycle-v{version}")
    if step["updates"] < 1:
        return _skip(store, policy, "the step applied no update (non-finite gradient)", len(trajs))
    mean_r = sum(rewards) / len(rewards)
    cand = save_candidate(model_, tok, o, version, {
        "parent_version": policy.version, "parent_path": str(policy.path),
        "sessions": len(trajs), "mean_reward": mean_r, "signal": cfg.signal,
        "created_at": time.time()})
    gate_res = gate(policy, cand, tasks, cfg) if tasks else None
    if gate_res is not None and gate_res["passed"] is None:
        status, reason = "candidate", f"saved {cand}; not gated: {gate_res['reason']}"
    elif gate_res is not None:
        status = "promoted" if gate_res["passed"] else "rejected"
        reason = f"bench gate {'passed' if gate_res['passed'] else 'failed'}: {gate_res['reason']}"
    elif cfg.promote_ungated:
        status, reason = "promoted", "promoted without a bench gate (promote_ungated)"
    else:
        status = "candidate"
        reason = (f"saved {cand}; no held-out tasks: A/B it (looprl serve --model "
                  f"{o if (o / POINTER).is_file() else policy.path} --model-b {cand}) then "
                  f"`looprl feedback promote --out {o} --version {version}`")
    if status == "promoted":
        promote(o, version)
    metrics = {"sessions": len(trajs), "mean_reward": mean_r,
               **{f"step_{k}": v for k, v in step.items()},
               **({f"gate_{k}": v for k, v in gate_res.items()} if gate_res else {})}
    cid = store.add_cycle(policy_version=policy.version, candidate_version=version, status=status,
                          reason=reason, metrics=metrics,
                          trained={t.id: t.reward.total for t in trajs if t.reward is not None})
    return CycleResult(cid, status, reason, policy.version, version, str(cand), len(trajs),
                       mean_r, step, gate_res)
