"""The embedded default model: a small Llama-architecture causal LM with looprl's BPE tokenizer.

    from looprl.models.tiny import init_default_model
    path = init_default_model("~/.cache/looprl/models/default", size="small")
    # -> config.json, model.safetensors, tokenizer.json, tokenizer_config.json (chat template)

The tokenizer is trained in seconds on a sample of the pinned source corpus (``models.corpus``) plus
synthetic conversations rendered through the harness's chat template (so `<tool_call>` blocks,
JSON arguments and role headers tokenize compactly). Weights are random until ``pretrain``,
except for a planted copy (induction) circuit (``plant_copy_circuit``; ``copy_circuit=False``
leaves it out). ``default_model_dir(size, seed)`` is the cached copy everything shares.

Sizes (``SIZES``) were compared with ``benchmarks/engine.py --engine-only --turns 2
--new-tokens 128 --threads 1 --size S`` (G=8, ~1,000-token prompt, machine under heavy shared load):
tiny 0.63M params 1,323 tok per CPU-second, small 3.5M 379, medium 10.2M 201. "small" is the
default: a group of 8 three-turn rollouts (~6k tokens) costs ~16 CPU-seconds, so an RL run takes
minutes, while "tiny" has too little capacity to learn the tool-call format well.
"moe" is a Qwen3-MoE of "small"'s attention with 8 experts, top-2 (~5.2M params, ~2.3M active),
trained by the same stages with a load-balancing loss (``MOE_AUX_LOSS_COEF``); the torch engine
records its routes and the GRPO step can replay them (``looprl.models.moe``).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from looprl.errors import ConfigError
from looprl.models.config import SIZES
from looprl.models.corpus import iter_corpus
from looprl.models.loading import hf_progress_bars  # noqa: F401 — HF's bars off unless asked
from looprl.models.tokenizer import CHAT_TEMPLATE, build_tokenizer

MOE_AUX_LOSS_COEF = 0.01
"""Weight of the load-balancing loss (HF's ``router_aux_loss_coef``) in every training stage
(pretraining through HF's forward, SFT and RL through ``models.moe.RouterTap``): Switch
Transformer's value (HF's default is 1e-3)."""
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


def python_sources(max_chars: int = 2_000_000, seed: int = 0, repos: Iterable[Path] | None = None,
                   exclude: Iterable[str] = (), max_per_package: int = 100_000) -> Iterator[str]:
    """A deterministic sample of .py files (up to ``max_chars``), at most ``max_per_package``
    characters from each repository of ``repos``, so the mix is varied and only what is read gets
    walked. ``repos`` defaults to the pinned source corpus (``models.corpus``) minus ``exclude``
    in an order seeded by ``seed``: the same text on any machine and any date."""
    repos = iter_corpus(seed, exclude) if repos is None else repos
    total, found = 0, False
    for repo in repos:
        taken = 0
        for f in _package_files(repo):
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
        raise ConfigError("no Python files in the source repositories given; pass repos= folders "
                          "with some Python source")


_TOOLS: list[dict[str, Any]] = [
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
        msgs: list[dict[str, Any]] = [
            {"role": "user", "content": f"The function `{w}` in {path} fails on empty input. Fix it."}]
        for name, args in rng.sample(calls, k=rng.randint(1, 4)):
            call: dict[str, Any] = {"id": f"c{rng.randint(0, 999)}", "type": "function",
                                    "function": {"name": name, "arguments": json.dumps(args)}}
            msgs.append({"role": "assistant", "content": rng.choice(["", f"<think>Look at {w}.</think>"]),
                         "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": call["id"], "name": name,
                         "content": f"{path}:{rng.randint(1, 300)}: def {w}(x):\n    return {w}\n"})
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": "f", "type": "function", "function": {"name": "finish", "arguments": "{}"}}]})
        # transformers types tools as an (invariant) list of dict | Callable: a list of dicts
        # is one, but not to mypy
        text = tok.apply_chat_template(msgs, tools=_TOOLS, tokenize=False)  # type: ignore[arg-type]
        assert isinstance(text, str), "tokenize=False renders the conversation as text"
        out.append(text)
    return out


ROPE_THETA = 1_000_000.0
"""RoPE base: at 1e6 (not Llama's 1e4) a third of each head's rotary pairs turn by under 1 rad
over 2,000 positions, room for the copy circuit's content matching (``plant_copy_circuit``)."""


def model_config(size: str, tokenizer_vocab: int, pad_id: int, eos_id: int
                 ) -> LlamaConfig | Qwen3MoeConfig:
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    s = SIZES[size]
    if s.experts:
        # output_router_logits: HF's forward with labels (pretraining) adds the balancing loss
        moe = Qwen3MoeConfig(
            vocab_size=tokenizer_vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
            num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
            moe_intermediate_size=s.intermediate,
            intermediate_size=s.intermediate, num_experts=s.experts, num_experts_per_tok=s.top_k,
            norm_topk_prob=True, router_aux_loss_coef=MOE_AUX_LOSS_COEF, output_router_logits=True,
            max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True, pad_token_id=pad_id,
            eos_token_id=eos_id, bos_token_id=None)
        moe.head_dim = s.hidden // s.heads  # Qwen3's default is 128 whatever the width
        moe.rope_parameters = {"rope_theta": ROPE_THETA, "rope_type": "default"}
        return moe
    cfg = LlamaConfig(vocab_size=tokenizer_vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                      num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                      intermediate_size=s.intermediate, max_position_embeddings=MAX_POSITIONS,
                      tie_word_embeddings=True, pad_token_id=pad_id, eos_token_id=eos_id,
                      bos_token_id=None)
    cfg.rope_parameters = {"rope_theta": ROPE_THETA, "rope_type": "default"}
    return cfg


def _rope_theta(cfg: LlamaConfig | Qwen3MoeConfig) -> float:
    rope = cfg.rope_parameters
    # transformers fills in rope_parameters, rope_theta included, in every LlamaConfig
    assert rope is not None and rope["rope_theta"] is not None, "a LlamaConfig without rope_theta"
    return rope["rope_theta"]


def _rotary_freqs(cfg: LlamaConfig | Qwen3MoeConfig) -> torch.Tensor:
    """Angle per position of each rotary pair (pair p = dims p and p + head_dim/2, HF layout)."""
    hd = cfg.hidden_size // cfg.num_attention_heads
    theta = float(_rope_theta(cfg))
    return 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)


def plant_copy_circuit(model: LlamaForCausalLM | Qwen3MoeForCausalLM, seed: int = 0, *, span: int = 2000,
                       alpha: float = 4.0, beta: float = 4.0, gamma: float = 0.4) -> None:
    """Initialise ``model`` (fresh, Llama layout, tied embeddings, 2+ layers) with an induction
    circuit: it predicts the token that followed the current token's earlier occurrence, so it
    copies spans from its context from step 0. The rest of the network starts as the identity
    (attention and MLP output projections at zero) and is learned as usual.

    Why: an agent copies all the time — a name from the task into a grep, a path from grep output
    into a read, a line from a read into an edit. Gradient descent forms this circuit only after
    ~10^7 tokens (induction heads appear at a token count that grows with batch x context), more
    than a CPU build affords: measured here, 1,500 steps of 16 x 128 random-token repeats left
    its loss at 7.24 of 7.6, and 300 pretraining steps on code left the SFT model unable to copy
    a name (teacher-forced turn accuracy 0). Planted, it copies random-token repeats at 83%
    (top-1) before any training (``tests/models/test_tiny.py``).

    The residual stream (width H) is laid out at init as: token content in dims [0, H/2)
    (embeddings of equal norm, so every token normalises alike), a constant 1 in dim H/2, and
    the previous token's content in the ``m`` dims after it.

    - Layer 0, head 0, a previous-token head: query and key read only the constant dim; their
      high-frequency rotary pairs are set so the score peaks at offset -1. Its value is a
      projection ``P`` of the content, written to the previous-token dims.
    - Layer 1, head 0, the induction head: its query is ``P`` of the current token's content,
      its key the previous-token dims, both in the low-frequency rotary pairs (little rotation
      over ``span`` positions): it attends where the token before was the current token. Its
      value (content of that position) is written back onto the content dims with gain
      ``alpha``, and the tied unembedding reads it out as that token's logit.
    ``beta`` scales the match score, ``gamma`` the previous-token write."""
    cfg = model.config
    H, hd = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads
    if cfg.num_hidden_layers < 2 or not cfg.tie_word_embeddings or H < 128:
        raise ConfigError("the copy circuit needs 2+ layers, tied embeddings and hidden >= 128")
    freqs = _rotary_freqs(cfg)
    half = hd // 2
    high = [p for p in range(half) if freqs[p] >= 0.1][:6]
    low = [p for p in range(half) if freqs[p] * span <= 1.0]
    D, C = H // 2, H // 2
    m = min(2 * len(low), H - D - 1)
    low = low[len(low) - m // 2:]
    if len(high) < 2 or m < 8:
        raise ConfigError(f"head_dim {hd} with rope_theta {_rope_theta(cfg)} "
                          "leaves too few rotary pairs for the copy circuit")
    S = slice(C + 1, C + 1 + m)
    gen = torch.Generator().manual_seed(seed)
    V = cfg.vocab_size
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.zero_()
        emb[:, :D] = torch.nn.functional.normalize(torch.randn(V, D, generator=gen), dim=-1)
        emb[:, C] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            mlp = layer.mlp  # a MoE layer zeroes every expert's output projection
            (mlp.experts.down_proj if hasattr(mlp, "experts") else mlp.down_proj.weight).zero_()
        P = torch.linalg.qr(torch.randn(D, m, generator=gen))[0].T  # m x D, orthonormal rows
        n_v = min(hd, D)
        P_v = torch.linalg.qr(torch.randn(D, n_v, generator=gen))[0].T
        # layer 0, head 0 (kv head 0): previous-token head
        a0 = model.model.layers[0].self_attn
        q, k = torch.zeros(hd), torch.zeros(hd)
        for p in high:
            q[p] = 1.0
            k[p], k[p + half] = math.cos(freqs[p]), math.sin(freqs[p])  # k = R(theta_p) q
        a0.q_proj.weight[:hd].zero_()
        a0.q_proj.weight[:hd, C] = q
        a0.k_proj.weight[:hd].zero_()
        a0.k_proj.weight[:hd, C] = k
        a0.v_proj.weight[:hd].zero_()
        a0.v_proj.weight[:m, :D] = P
        a0.o_proj.weight[S, :m] = gamma * torch.eye(m)
        # layer 1, head 0 (kv head 0): induction head
        a1 = model.model.layers[1].self_attn
        dims = low + [p + half for p in low]
        a1.q_proj.weight[:hd].zero_()
        a1.k_proj.weight[:hd].zero_()
        for n, d in enumerate(dims):
            a1.q_proj.weight[d, :D] = beta * P[n]
            a1.k_proj.weight[d, C + 1 + n] = 1.0
        a1.v_proj.weight[:hd].zero_()
        a1.v_proj.weight[:n_v, :D] = P_v
        a1.o_proj.weight[:D, :n_v] = alpha * P_v.T


INIT_RECIPE = "copy2-corpus1-calltools"
"""Part of the cache name of default models: bump it when ``init_default_model`` changes."""


def default_model_dir(size: str = DEFAULT_SIZE, seed: int = 0) -> Path:
    """The cached default model of ``size`` under ``LOOPRL_HOME/models``, initialised (tokenizer,
    weights) on first use; shared by the quickstart, the recipes and the benchmarks."""
    from looprl import paths

    path = paths.sub("models") / f"default-{size}-seed{seed}-{INIT_RECIPE}"
    if not (path / "config.json").exists():
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        init_default_model(tmp, size=size, seed=seed)
        try:
            tmp.replace(path)
        except OSError:  # another process finished it first: keep theirs
            if not (path / "config.json").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def init_default_model(out_dir: str | Path, size: str = DEFAULT_SIZE, seed: int = 0,
                       corpus_chars: int = 2_000_000, vocab_size: int = VOCAB_SIZE,
                       copy_circuit: bool = True) -> Path:
    """Train the tokenizer, build the model (random init; with ``copy_circuit``, see
    ``plant_copy_circuit``), save both in HF format."""
    out = Path(out_dir).expanduser()
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    texts = list(python_sources(max_chars=corpus_chars, seed=seed)) + chat_examples(seed=seed)
    tok = build_tokenizer(texts, vocab_size=vocab_size)
    assert tok.chat_template == CHAT_TEMPLATE
    torch.manual_seed(seed)
    eos_id = tok.convert_tokens_to_ids(tok.eos_token)
    assert isinstance(eos_id, int), "one token's id is an int"
    cfg = model_config(size, len(tok), tok.pad_token_id, eos_id)
    model = Qwen3MoeForCausalLM(cfg) if isinstance(cfg, Qwen3MoeConfig) else LlamaForCausalLM(cfg)
    if copy_circuit:
        plant_copy_circuit(model, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out
