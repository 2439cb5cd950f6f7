"""Load any Hugging Face causal LM (and its tokenizer) from a local directory or a hub id.

The same code serves the tiny embedded default and a real checkpoint (e.g. a Qwen coder model):

    lm = load_model("~/.cache/looprl/models/default", dtype="float32")
    lm.model, lm.tokenizer, lm.num_params
    save_model(lm.model, lm.tokenizer, "runs/x/model_sft")   # weights, tokenizer, MTP heads

``path`` may be a hub id (``org/name[@revision]``), resolved through the local hub cache by
``looprl.models.hub``; weights are read from safetensors. MTP heads
saved beside the weights (``mtp_heads.safetensors`` + ``mtp_config.json``, ``looprl.models.mtp``)
are attached to the model as ``model.mtp_heads``. The tokenizer's fingerprint is recorded on the
model's config (``looprl.models.fingerprint``), so a saved model carries it in ``config.json``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from looprl.errors import ConfigError
from looprl.models.fingerprint import CONFIG_ATTR, tokenizer_fingerprint
from looprl.models.hub import resolve_model_path
from looprl.models.mtp import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    attach_heads,
    heads_of,
    load_heads,
    policy_parameters,
    save_heads,
)


def hf_progress_bars() -> bool:
    """Show transformers' tqdm bars ("Loading weights", "Writing model shards") only when asked:
    ``LOOPRL_HF_PROGRESS=1``, or ``looprl --debug`` (``LOOPRL_DEBUG=1``). They print on every
    load and save, so every command showed them. Returns whether they are on."""
    on = any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
             for v in ("LOOPRL_HF_PROGRESS", "LOOPRL_DEBUG"))
    logging = transformers.utils.logging
    logging.enable_progress_bar() if on else logging.disable_progress_bar()
    return on


hf_progress_bars()  # at import: looprl loads and saves models after importing this module

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
        """Parameters of the language model (its MTP heads, if any, not counted)."""
        return sum(p.numel() for p in policy_parameters(self.model))


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'float32' / 'bf16' / torch.bfloat16 -> torch dtype, with a clear error for anything else."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


RUN_MODELS = ("model_init", "model_start", "model_sft", "model_rl")
"""A run directory's checkpoints (``RunDir.saved_models``): never advised to be re-made."""


def no_model_message(p: Path) -> str:
    """Why ``p`` holds no model, and what to pass instead. A relative path says where it was
    resolved from (a Ray node's worker resolves it against its own working directory), and a
    run's checkpoint is never advised to be replaced by a fresh, untrained model.

    >>> no_model_message(Path("runs/r/model_start"))[:60]
    'no HF model at runs/r/model_start (config.json missing; a re'
    """
    where = "" if p.is_absolute() else f"; a relative path, resolved against {Path.cwd()}"
    fix = ("point to a directory saved by save_pretrained, or a hub id (org/name)"
           + ("" if p.name in RUN_MODELS else
              f"; for a new, untrained default model: `looprl model init {p}`"))
    return f"no HF model at {p} (config.json missing{where}); {fix}"


def load_model(path: str | Path, dtype: str | torch.dtype = "float32") -> LoadedModel:
    """Load the model and tokenizer saved in HF format at ``path`` (config.json + safetensors),
    a local directory or a hub id (``looprl.models.hub``)."""
    p = resolve_model_path(path)
    torch_dtype = resolve_dtype(dtype)
    if not (p / "config.json").exists():
        raise ConfigError(no_model_message(p))
    model = AutoModelForCausalLM.from_pretrained(p, dtype=torch_dtype, use_safetensors=True)
    model.eval()
    heads = load_heads(p, dtype=torch_dtype)
    if heads is not None:
        attach_heads(model, heads)
    tokenizer = AutoTokenizer.from_pretrained(p)
    # the tokenizer's identity travels with the model: save_pretrained writes it to config.json
    setattr(model.config, CONFIG_ATTR, tokenizer_fingerprint(tokenizer))
    return LoadedModel(model=model, tokenizer=tokenizer, path=p)


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Save ``model`` (safetensors), ``tokenizer`` and the model's MTP heads if it has any, so
    that ``load_model`` gives the same model back. A model without heads removes heads files
    left in ``out_dir`` by an earlier save (they would not fit the new weights)."""
    out = Path(out_dir).expanduser()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    heads = heads_of(model)
    if heads is not None:
        save_heads(heads, out)
    else:
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            (out / name).unlink(missing_ok=True)
    return out
