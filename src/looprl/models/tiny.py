"""The embedded default model: a small Llama-architecture causal LM with looprl's BPE tokenizer.

    from looprl.models.tiny import init_default_model
    path = init_default_model("~/.cache/looprl/models/default", size="small")
    # -> config.json, model.safetensors, tokenizer.json, tokenizer_config.json (chat template)

The tokenizer is trained in seconds on a sample of the Python source installed in this venv plus
synthetic conversations rendered through the harness's chat template (so `<tool_call>` blocks,
JSON arguments and role headers tokenize compactly). Weights are random until ``pretrain``.

Sizes (``SIZES``) were compared with ``benchmarks/engine.py --engine-only --turns 2
--new-tokens 128 --threads 1 --size S`` (G=8, ~1,000-token prompt, machine under heavy shared load):
tiny 0.63M params 1,323 tok per CPU-second, small 3.5M 379, medium 10.2M 201. "small" is the
default: a group of 8 three-turn rollouts (~6k tokens) costs ~16 CPU-seconds, so an RL run takes
minutes, while "tiny" has too little capacity to learn the tool-call format well.
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.errors import ConfigError
from looprl.models.tokenizer import CHAT_TEMPLATE, build_tokenizer


@dataclass(frozen=True)
class ModelSize:
    """Shape of a default model (Llama architecture, tied embeddings, GQA)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=352),  # ~0.6M, tests
    "small": ModelSize(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=704),  # ~3M, default
    "medium": ModelSize(hidden=384, layers=6, heads=6, kv_heads=2, intermediate=1024),  # ~9M
}
DEFAULT_SIZE = "small"
VOCAB_SIZE = 2048  # ~2.6 chars/token on code; a bigger vocab buys little at this model size
MAX_POSITIONS = 8192


def _package_files(top: Path) -> Iterator[Path]:
    if top.is_file():
        if top.suffix == ".py":
            yield top
        return
    for d, dirs, files in os.walk(top):
        dirs.sort()
        yield from (Path(d) / f for f in sorted(files) if f.endswith(".py"))


def python_sources(max_chars: int = 2_000_000, seed: int = 0,
                   roots: list[Path] | None = None, max_per_package: int = 100_000) -> Iterator[str]:
    """A deterministic sample of .py files from the venv's site-packages (up to ``max_chars``):
    top-level packages in a seeded order, at most ``max_per_package`` characters from each, so the
    mix is varied and only what is read gets walked."""
    roots = roots or [Path(sysconfig.get_paths()["purelib"])]
    rng = random.Random(seed)
    total, found = 0, False
    for root in roots:
        tops = sorted(p for p in root.iterdir() if not p.name.startswith((".", "_")))
        rng.shuffle(tops)
        for top in tops:
            taken = 0
            for f in _package_files(top):
                try:
                    text = f.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                if not text.strip() or len(text) > 100_000:
                    continue
                found = True
                yield text
                taken += len(text)
                total += len(text)
                if total >= max_chars:
                    return
                if taken >= max_per_package:
                    break
    if not found:
        raise ConfigError(f"no Python files under {roots}; pass roots= with some Python source")


_TOOLS = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": {
        "type": "object", "properties": {k: {"type": "string"} for k in args}, "required": args}}}
    for n, d, args in [
        ("read_file", "Read a file of the repository.", ["path"]),
        ("grep", "Search the repository with a regular expression.", ["pattern", "path"]),
        ("edit_file", "Replace an exact snippet of a file.", ["path", "old", "new"]),
        ("run", "Run a shell command in the repository.", ["command"]),
        ("finish", "Declare the task done.", []),
    ]
]


def chat_examples(n: int = 200, seed: int = 0) -> list[str]:
    """Synthetic agent conversations rendered through the chat template (tokenizer training text)."""
    rng = random.Random(seed)
    tok = build_tokenizer(None)
    words = ["parse", "config", "value", "items", "result", "cache", "path", "index", "token", "user"]
    out = []
    for _ in range(n):
        w = rng.choice(words)
        path = f"src/{rng.choice(words)}/{w}.py"
        calls = [("read_file", {"path": path}), ("grep", {"pattern": f"def {w}", "path": "src"}),
                 ("run", {"command": f"python -m pytest tests/test_{w}.py -q"}),
                 ("edit_file", {"path": path, "old": f"return {w}", "new": f"return {w} or None"})]
        msgs = [{"role": "user", "content": f"The function `{w}` in {path} fails on empty input. Fix it."}]
        for name, args in rng.sample(calls, k=rng.randint(1, 4)):
            call = {"id": f"c{rng.randint(0, 999)}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)}}
            msgs.append({"role": "assistant", "content": rng.choice(["", f"<think>Look at {w}.</think>"]),
                         "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": call["id"], "name": name,
                         "content": f"{path}:{rng.randint(1, 300)}: def {w}(x):\n    return {w}\n"})
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": "f", "type": "function", "function": {"name": "finish", "arguments": "{}"}}]})
        out.append(tok.apply_chat_template(msgs, tools=_TOOLS, tokenize=False))
    return out


def model_config(size: str, tokenizer_vocab: int, pad_id: int, eos_id: int) -> LlamaConfig:
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    s = SIZES[size]
    return LlamaConfig(vocab_size=tokenizer_vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                       num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                       intermediate_size=s.intermediate, max_position_embeddings=MAX_POSITIONS,
                       tie_word_embeddings=True, pad_token_id=pad_id, eos_token_id=eos_id,
                       bos_token_id=None)


def init_default_model(out_dir: str | Path, size: str = DEFAULT_SIZE, seed: int = 0,
                       corpus_chars: int = 2_000_000, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train the tokenizer, build a randomly initialised model, save both in HF format."""
    out = Path(out_dir).expanduser()
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    texts = list(python_sources(max_chars=corpus_chars, seed=seed)) + chat_examples(seed=seed)
    tok = build_tokenizer(texts, vocab_size=vocab_size)
    assert tok.chat_template == CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = model_config(size, len(tok), tok.pad_token_id, tok.convert_tokens_to_ids(tok.eos_token))
    model = LlamaForCausalLM(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out
