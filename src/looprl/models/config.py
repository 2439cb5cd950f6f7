"""The model sections' pieces (``model.lora``, the default model's sizes, the MTP heads' bound),
without torch: a config is checked before torch loads; the modules that use them import them
from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from looprl.config import Length, Range, Share

MAX_HEADS = 8
"""The most MTP heads a model may carry (``model.mtp_heads``; ``looprl.models.mtp``)."""


@dataclass(frozen=True)
class ModelSize:
    """Shape of a default model (Llama architecture, tied embeddings, GQA; with ``experts``, a
    Qwen3-MoE whose every MLP is ``experts`` experts of width ``intermediate``, ``top_k`` each)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    experts: int = 0
    top_k: int = 0


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=352),  # ~0.6M, tests
    "small": ModelSize(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=704),  # ~3M, default
    "medium": ModelSize(hidden=384, layers=6, heads=6, kv_heads=2, intermediate=1024),  # ~9M
    # ~5.2M params, ~2.3M active: "small"'s attention with 8 experts of width 160, top-2
    "moe": ModelSize(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=160, experts=8, top_k=2),
}


@dataclass(frozen=True)
class LoraExperimental:
    """The adapter's shape beyond its rank (``experimental`` in ``looprl.config``)."""

    alpha: Annotated[int, Range(1, 1_000_000)] = 16
    """LoRA's alpha: the update is scaled by alpha / rank (16 with rank 8 doubles it)."""
    dropout: Share = 0.0
    """Dropout on the adapter's input while training. Above 0 the trainer's logprobs are
    noisier than the engine's, which samples without it."""
    target_modules: Annotated[list[str], Length(1, 256)] = field(
        default_factory=lambda: ["all-linear"])
    """Module names (or suffixes) to adapt, as PEFT's ``target_modules``; ``all-linear`` =
    every linear layer but the output head."""


@dataclass(frozen=True)
class LoraSettings:
    """LoRA RL (``model.lora``): the trainer trains a low-rank adapter on the frozen model.
    LoRA usually wants a learning rate about 10x full fine-tuning's (``grpo.lr``)."""

    rank: Annotated[int, Range(0, 65_536)] = 0
    """The adapter's rank; 0 = no adapter (every weight trains)."""
    experimental: LoraExperimental = field(default_factory=LoraExperimental)

    @property
    def enabled(self) -> bool:
        return self.rank > 0
