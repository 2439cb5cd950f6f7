"""Tokenizers carrying each model family's chat template, for the tool-format tests: the
bytes-only BPE of ``looprl.models.tokenizer`` (no training, no weights) with the family's
special tokens and a template written from its documented format (``tests/chat/templates``).

    tok = family_tokenizer("llama3")        # <|eot_id|>, <|python_tag|>, ... and Llama 3.1's template
    fmt = ChatFormat(tok)                   # probes the template: fmt.tool_format == "llama3"
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from looprl.models.tokenizer import build_tokenizer

TEMPLATES = Path(__file__).parent / "chat" / "templates"
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3_coder": {"special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>",
                                "</tool_call>", "<think>", "</think>"],
                    "eos": "<|im_end|>", "bos": None},
    "llama3": {"special": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                           "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
               "eos": "<|eot_id|>", "bos": "<|begin_of_text|>"},
    "mistral": {"special": ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                            "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
                "eos": "</s>", "bos": "<s>"},
    "mistral_v11": {"special": ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]",
                                "[CALL_ID]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                                "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]",
                                "[/SYSTEM_PROMPT]"],
                    "eos": "</s>", "bos": "<s>"},
    "harmony": {"special": ["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>",
                            "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
                            "<|call|>"],
                "eos": "<|return|>", "bos": "<|startoftext|>"},
}
NAMES = ("hermes", *FAMILIES)


@functools.cache
def family_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """A bytes-only tokenizer with family ``name``'s special tokens and chat template
    (``hermes``: looprl's default tokenizer, whose template is Hermes/Qwen2.5's)."""
    if name == "hermes":
        return build_tokenizer(None)
    fam = FAMILIES[name]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=0, special_tokens=fam["special"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=fam["eos"], bos_token=fam["bos"],
                                   pad_token=fam["special"][0], unk_token=None)
    fast.add_special_tokens({"additional_special_tokens": fam["special"]})
    fast.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    return fast
