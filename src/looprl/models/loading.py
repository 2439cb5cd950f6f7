"""Load any Hugging Face causal LM (and its tokenizer) from a local directory.

The same code serves the tiny embedded default and a real checkpoint (e.g. a Qwen coder model):

    lm = load_model("~/.cache/looprl/models/default", dtype="float32")
    lm.model, lm.tokenizer, lm.num_params

Only local paths are accepted (no hub access here); weights are read from safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from looprl.errors import ConfigError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "fp32": torch.float32,
                                  "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                                  "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM in eval mode with its tokenizer."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    path: Path

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'float32' / 'bf16' / torch.bfloat16 -> torch dtype, with a clear error for anything else."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def load_model(path: str | Path, dtype: str | torch.dtype = "float32") -> LoadedModel:
    """Load the model and tokenizer saved in HF format at ``path`` (config.json + safetensors)."""
    p = Path(path).expanduser()
    torch_dtype = resolve_dtype(dtype)
    if not (p / "config.json").exists():
        raise ConfigError(f"no HF model at {p} (config.json missing); create the default one with "
                          f"`looprl model init {p}` or point to a directory saved by save_pretrained")
    model = AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype, use_safetensors=True)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(p)
    return LoadedModel(model=model, tokenizer=tokenizer, path=p)
