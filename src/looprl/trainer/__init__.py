"""looprl.trainer: GRPO pieces (advantages, losses, batch packing, the step), SFT, checkpoints.

    from looprl.trainer import GRPOConfig, GRPOStep
    step = GRPOStep(model, GRPOConfig(lr=1e-5), ref_model=None)
    metrics = step.on_groups(groups, current_version=v)   # one optimizer step per batch of groups

The async loop (``trainer/grpo.py``) sits on top: it collects groups from rollouts, calls the
step, publishes weights (``looprl.weights``) and checkpoints (``save_checkpoint``).
"""

from looprl.trainer.advantages import ADVANTAGES, group_advantages, is_zero_variance
from looprl.trainer.batch import MicroBatch, TrainBatch, build_batch, pack_segments
from looprl.trainer.checkpoint import Resumed, latest_checkpoint, load_checkpoint, save_checkpoint
from looprl.trainer.losses import LOSSES, LossInputs, LossOutput, LossParams, get_loss
from looprl.trainer.sft import SFTConfig, SFTResult, sft
from looprl.trainer.step import (
    GRPOConfig,
    GRPOStep,
    StepMetrics,
    make_optimizer,
    token_logprobs,
    train_step,
)

__all__ = [
    "ADVANTAGES", "LOSSES", "GRPOConfig", "GRPOStep", "LossInputs", "LossOutput", "LossParams",
    "MicroBatch", "Resumed", "SFTConfig", "SFTResult", "StepMetrics", "TrainBatch", "build_batch",
    "get_loss", "group_advantages", "is_zero_variance", "latest_checkpoint", "load_checkpoint",
    "make_optimizer", "pack_segments", "save_checkpoint", "sft", "token_logprobs", "train_step",
]
