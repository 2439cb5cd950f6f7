"""looprl.trainer: GRPO pieces (advantages, losses, batch packing, the step), SFT, checkpoints.

    from looprl.trainer import GRPOConfig, GRPOStep
    step = GRPOStep(model, GRPOConfig(lr=1e-5), ref_model=None)
    metrics = step.on_groups(groups, current_version=v)   # one optimizer step per batch of groups

The async loop (``trainer/grpo.py``) sits on top: it collects groups from rollouts, calls the
step, publishes weights (``looprl.weights``) and checkpoints (``save_checkpoint``).
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "advantages": ["ADVANTAGES", "group_advantages", "is_zero_variance"],
    "batch": ["Credit", "MicroBatch", "TrainBatch", "build_batch", "pack_segments"],
    "checkpoint": ["Resumed", "latest_checkpoint", "load_checkpoint", "save_checkpoint"],
    "losses": ["LOSSES", "LossInputs", "LossOutput", "LossParams", "get_loss", "mtp_distillation"],
    "sampler": ["TaskSampler"],
    "config": ["GRPOConfig", "GRPOExperimental", "SFTConfig", "SFTExperimental"],
    "sft": ["SFTResult", "sft"],
    "step": ["GRPOStep", "StepMetrics", "make_optimizer",
             "token_logprobs", "train_step"],
})
