"""LoRA adapters through PEFT: the trainer trains the adapter, every engine serves merged weights.

    model = with_lora(model, LoraSettings(rank=8))      # a peft.PeftModel; only the adapter trains
    weights = merged_state_dict(model)                   # keyed as the base model's state_dict
    save_merged(model, tokenizer, "runs/x/model_rl")     # merged safetensors + lora_adapter/

What reaches a rollout engine is ``merged_state_dict``: each adapted layer's base weight plus
``B @ A * alpha / rank`` (PEFT's own ``get_delta_weight``), under the base model's names, so the
torch engine, vLLM or any server loads it as it loads a full fine-tune — there is no adapter for
an engine to miss. Untargeted tensors (embeddings, norms) are the base model's own tensors, never
changed, so the weight store's deltas of them are all zeros (``looprl.weights``). The saved model
is the merged checkpoint (``looprl model serve`` it as any other) with the adapter in PEFT's
format in ``lora_adapter/`` beside it (``PeftModel.from_pretrained(base, dir)`` reads it).

Not supported: DoRA and other PEFT tuners, adapting the MTP heads (``looprl.models.mtp``), an
adapter on an embedding tied to the output head (one tensor serves both ends: it cannot be
merged), and FSDP (each rank keeps the small adapter's optimizer state whole under DDP anyway).
"""

from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from looprl.errors import ConfigError
from looprl.models.config import LoraSettings

ADAPTER_DIR = "lora_adapter"
"""The adapter's directory inside a saved model (PEFT's ``save_pretrained`` layout)."""
ADAPTER = "default"
"""PEFT's name of the one adapter looprl trains."""


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` is a PEFT model carrying looprl's adapter (``with_lora``)."""
    if "peft" not in sys.modules:  # no PEFT model without PEFT: spare every caller its import
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def base_of(model: nn.Module) -> nn.Module:
    """The transformers model under a PEFT wrapper (``model`` itself without one)."""
    return model.get_base_model() if is_lora(model) else model  # type: ignore[operator]


def with_lora(model: nn.Module, settings: LoraSettings) -> nn.Module:
    """``model`` wrapped with a fresh adapter (B = 0: the same outputs until it trains); every
    base weight is frozen. Unchanged when ``settings.rank`` is 0."""
    if not settings.enabled:
        return model
    if getattr(model, "mtp_heads", None) is not None:
        raise ConfigError("model.lora does not adapt MTP heads; set model.experimental.mtp_heads=0 "
                          "or model.lora.rank=0")
    from peft import LoraConfig, get_peft_model

    x = settings.experimental
    targets: str | list[str] = "all-linear" if x.target_modules == ["all-linear"] \
        else list(x.target_modules)
    cfg = LoraConfig(r=settings.rank, lora_alpha=x.alpha, lora_dropout=x.dropout,
                     target_modules=targets, bias="none", task_type="CAUSAL_LM")
    tied = _tied_embeddings(model)
    linears = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                      if isinstance(m, nn.Linear)})
    try:
        with warnings.catch_warnings():
            # PEFT 0.21 reads transformers' deprecated is_gradient_checkpointing: not the user's
            warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
            peft_model = get_peft_model(model, cfg)
    except ValueError as e:  # PEFT: a target matches no module
        raise ConfigError(f"model.lora.experimental.target_modules={x.target_modules} cannot be "
                          f"adapted ({str(e).splitlines()[0][:120]}); this model's linear layers: "
                          f"{', '.join(linears)}, or all-linear") from None
    if any(any(layer.base_layer is t for t in tied) for layer in _lora_layers(peft_model).values()):
        # one tensor serves both ends in every engine: an adapter on one end cannot be merged
        raise ConfigError(f"model.lora.experimental.target_modules={x.target_modules} adapts an "
                          "embedding this model ties to its output head; adapt other layers "
                          f"({', '.join(linears)}, or all-linear)")
    return peft_model


def _tied_embeddings(model: nn.Module) -> tuple[nn.Module, ...]:
    """The input embedding and output head when they share one weight (else none)."""
    get_in, get_out = (getattr(model, f, None) for f in ("get_input_embeddings",
                                                         "get_output_embeddings"))
    if not (callable(get_in) and callable(get_out)):
        return ()
    inp, out = get_in(), get_out()
    same = inp is not None and out is not None and inp.weight is out.weight
    return (inp, out) if same else ()


def _lora_layers(model: nn.Module) -> dict[str, Any]:
    """Name (under the base model) -> PEFT LoRA layer."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in base_of(model).named_modules() if isinstance(m, LoraLayer)}


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights the adapted model computes with, keyed as the base model's ``state_dict``:
    each adapted layer's ``weight`` = base + its adapter's delta (new tensors); every other tensor
    is the base model's own (tied weights stay tied). A model without an adapter: its
    ``state_dict``."""
    if not is_lora(model):
        return model.state_dict()
    layers = _lora_layers(model)
    out: dict[str, torch.Tensor] = {}
    for key, t in base_of(model).state_dict().items():
        owner = next((n for n in layers if key.startswith(n + ".")), None)
        if owner is None:
            out[key] = t
            continue
        rest = key[len(owner) + 1:]
        if rest.startswith("base_layer."):
            out[f"{owner}.{rest.removeprefix('base_layer.')}"] = t
    with torch.no_grad():
        for name, layer in layers.items():
            if ADAPTER in layer.r:  # a linear or an embedding layer carrying the adapter
                w = out[f"{name}.weight"]
                out[f"{name}.weight"] = w + layer.get_delta_weight(ADAPTER).to(w.dtype)
    return out


def save_merged(model: nn.Module, tokenizer: Any, out_dir: str | Path) -> Path:
    """Save an adapted ``model`` as a plain HF checkpoint of merged weights (what ``load_model``
    and every engine read) with the adapter in ``out_dir/lora_adapter`` (PEFT format)."""
    out = Path(out_dir)
    base = base_of(model)
    # save_pretrained of the base module with the merged tensors: no second copy of the model
    base.save_pretrained(out, state_dict=merged_state_dict(model),  # type: ignore[operator]
                         safe_serialization=True)
    tokenizer.save_pretrained(out)
    shutil.rmtree(out / ADAPTER_DIR, ignore_errors=True)
    model.save_pretrained(out / ADAPTER_DIR)  # type: ignore[operator]
    return out
