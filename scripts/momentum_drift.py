"""How far a training run's Adam momentum alone moves a model it did not end on: the most a
real-time window continuing that state can inherit from it (``RealtimeConfig.optimizer``).

    .venv/bin/python scripts/momentum_drift.py runs/quickstart/model_start runs/quickstart/ckpt \\
        runs/drift --lr 3e-4 --steps 4

Loads the run's newest checkpoint's AdamW state onto the model (the loop's own lr and betas),
takes ``--steps`` steps with zero gradients, so only the run's first moments move the weights,
prints the relative weight change and saves the result for ``looprl bench run``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from looprl.feedback.update import continue_adam, optimizer_state
from looprl.models.loading import load_model
from looprl.train import stages
from looprl.trainer.config import GRPOConfig
from looprl.trainer.step import make_optimizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="an HF model directory (e.g. a run's model_start)")
    ap.add_argument("optimizer", help="a training run's ckpt directory, or an optimizer.pt")
    ap.add_argument("out", type=Path, help="where to save the moved model")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    lm = load_model(args.model, dtype="float32")
    opt = make_optimizer(lm.model, GRPOConfig(lr=args.lr))
    continue_adam(opt, optimizer_state(args.model, args.optimizer), args.model)
    before = [p.detach().clone() for p in lm.model.parameters()]
    for _ in range(args.steps):
        for p in lm.model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
    moved = sum(((p.detach() - b) ** 2).sum() for p, b in zip(lm.model.parameters(), before, strict=True))
    total = sum((b ** 2).sum() for b in before)
    print(f"relative weight change {(moved / total).sqrt().item():.4f} after {args.steps} steps")
    stages.save_model(lm.model, lm.tokenizer, args.out)


if __name__ == "__main__":
    main()
