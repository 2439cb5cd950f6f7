"""A cycle's update: GRPO steps of the serving policy on its window -> a saved candidate.

    path, metrics = make_candidate(policy, groups, grpo, out=policies, version=4, meta={...},
                                   steps=4, seed=4, optimizer=optimizer_state(policy.path))

``train_groups`` takes ``steps`` GRPO steps (``trainer.step.GRPOStep``) over the window's groups,
each group in one step, and can continue an Adam state saved earlier: the one the serving
policy's own window left (``optimizer.pt`` beside its weights), or for the start model the state
of the run that trained it (``RealtimeConfig.optimizer``). The cycles then train as one
continuing run.

Why continue: Adam's first steps from a fresh state move every weight by about ``lr`` in the
sign of its gradient, however small and noisy that gradient is, and a window takes only a few
steps; with the second moments of a run behind it, a weight moves in proportion to how large its
gradient is against what that run saw (docs/experiments.md, stop 35).
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from looprl.errors import ConfigError
from looprl.feedback.policies import OPTIMIZER_FILE, PolicyRef, save_candidate
from looprl.trainer.config import GRPOConfig
from looprl.types import Group

if TYPE_CHECKING:
    from looprl.feedback.realtime_config import RealtimeConfig

COUNTS = frozenset({"tokens", "sequences", "micro_batches", "updates", "skipped_updates",
                    "hints", "zero_variance_groups", "dropped_infra", "no_pass_groups", "silent_rows",
                    "wall_s"})
"""``StepMetrics`` fields a cycle's steps add up; the others are averaged over its steps."""


def optimizer_state(policy_dir: Path, fallback: str = "") -> Path | None:
    """The Adam state a window on ``policy_dir`` continues from: the one its own window left
    (``optimizer.pt`` beside its weights), else ``fallback`` (``RealtimeConfig.optimizer``: a
    checkpoint directory, whose newest checkpoint's, or a file), else None (a fresh optimizer)."""
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


def merge_steps(metrics: list[dict[str, float]]) -> dict[str, float]:
    """One dict for a cycle's steps: ``COUNTS`` summed, the rest averaged (one step: itself).
    The keys are the steps' own: a dense model's steps carry no MoE router metrics."""
    n = len(metrics)
    return {k: math.fsum(m[k] for m in metrics) / (1 if k in COUNTS else n) for k in metrics[0]}


def train_groups(cur: PolicyRef, groups: list[Group], grpo: GRPOConfig, steps: int, seed: int,
                 optimizer: Path | None = None, momentum: bool = True
                 ) -> tuple[Any, Any, dict[str, float], dict[str, Any]]:
    """``steps`` GRPO steps of policy ``cur``'s weights over ``groups`` (shuffled, each group in
    one step), continuing the Adam state in ``optimizer`` (None: a fresh one; ``momentum``
    false: its second moments alone, the first zeroed); returns (model, tokenizer, the steps'
    metrics, ``merge_steps``, the optimizer state it left). Sessions another tokenizer made are
    refused (``ConfigError``)."""
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
    return lm.model, lm.tokenizer, merge_steps(metrics), step.optimizer.state_dict()


def add_noise(model: Any, scale: float, seed: int) -> None:
    """Every weight tensor += N(0, (scale * its std)^2): a deliberately broken candidate."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * p.std() * scale)


def make_candidate(policy: PolicyRef, groups: list[Group], grpo: GRPOConfig, out: Path,
                   version: int, meta: dict[str, Any], *, steps: int = 1, seed: int = 0,
                   optimizer: Path | None = None, momentum: bool = True, noise: float = 0.0,
                   save_optimizer: bool = False) -> tuple[PolicyRef | None, dict[str, float]]:
    """Train ``policy`` on ``groups`` (``train_groups``) and save the result as ``OUT/vNNNN``
    with ``meta`` and its ``created_at`` (and the Adam state it left when ``save_optimizer``); ``noise`` > 0 breaks it
    on purpose (``add_noise``). Returns (the candidate, the steps' metrics); the candidate is
    None when no step applied an update (nothing is saved)."""
    model, tok, metrics, state = train_groups(policy, groups, grpo, steps, seed, optimizer,
                                              momentum)
    if metrics["updates"] < 1:
        return None, metrics
    if noise:
        add_noise(model, noise, seed)
    path = save_candidate(model, tok, out, version, {**meta, "created_at": time.time()},
                          optimizer_state=state if save_optimizer else None)
    return PolicyRef(path, version), metrics
