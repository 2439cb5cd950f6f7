"""Tokenizer identity: a fingerprint of what turns text into ids, carried by every trajectory and
every saved model, so that training refuses token ids another tokenizer made.

    fp = tokenizer_fingerprint(tok)                 # "sha256:3f2a9c0d41be77e1"
    check_trajectories(trajs, model_fingerprint(model), vocab_size=50_000, source="sft.jsonl")

The fingerprint is a sha256 over the tokenizer's whole definition (the fast tokenizer's JSON:
vocabulary, merges, added and special tokens, normalizer, pre-tokenizer, decoder; its runtime
padding and truncation settings left out), which tokens are its bos/eos/pad/unk, and its chat
template. It is computed once per tokenizer object. Where it is recorded:

- every trajectory: ``metadata["tokenizer"]``, stamped by the harness (``run_agent``), so every
  trajectory file (rollouts, the oracle's SFT data, bench runs, served sessions) carries it;
- every model ``load_model`` loads: ``model.config.looprl_tokenizer``, which ``save_pretrained``
  writes into ``config.json`` (so every saved model and published policy carries it), and the
  training checkpoints' ``meta.json`` (``trainer.checkpoint``).

``check_trajectories`` is the one check (``looprl trainer sft``, the GRPO step): token ids from
another tokenizer, or beyond the model's vocabulary, are a one-line ``ConfigError``. A trajectory
that records no tokenizer (written before fingerprints) cannot be checked beyond its ids' range;
the check counts them for the caller to warn.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Sequence
from typing import Any

from looprl.errors import ConfigError
from looprl.types import Trajectory

METADATA_KEY = "tokenizer"
"""``Trajectory.metadata`` key holding the fingerprint of the tokenizer that made its ids."""
CONFIG_ATTR = "looprl_tokenizer"
"""Attribute of a model's HF config holding its tokenizer's fingerprint (saved in config.json)."""
_memo: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """``sha256:<16 hex>`` of the tokenizer's definition and chat template (module docstring)."""
    if tokenizer in _memo:
        return _memo[tokenizer]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        for runtime in ("truncation", "padding"):  # set per call site, not part of the mapping
            spec.pop(runtime, None)
    else:  # a slow (pure Python) tokenizer: its vocabulary is what it has
        spec = {"vocab": tokenizer.get_vocab()}
    spec["roles"] = {name: str(getattr(tokenizer, name, None))
                     for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    spec["chat_template"] = getattr(tokenizer, "chat_template", None)
    blob = json.dumps(spec, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    fp = "sha256:" + hashlib.sha256(blob).hexdigest()[:16]
    _memo[tokenizer] = fp
    return fp


def model_fingerprint(model: Any) -> str | None:
    """The fingerprint ``load_model`` recorded on ``model`` (wrapped in DDP or not); None for a
    model built in code."""
    inner = getattr(model, "module", model)
    return getattr(getattr(inner, "config", None), CONFIG_ATTR, None)


def check_trajectories(trajectories: Sequence[Trajectory], expected: str | None, *,
                       vocab_size: int | None, source: str) -> int:
    """Refuse (``ConfigError``, one line) trajectories whose ids another tokenizer made than the
    one fingerprinted ``expected`` (None: the model's is unknown), or holding an id outside
    ``vocab_size``. Returns how many trajectories record no tokenizer."""
    unstamped = 0
    for i, t in enumerate(trajectories):
        name = t.id or f"#{i}"
        fp = t.metadata.get(METADATA_KEY)
        if fp is None:
            unstamped += 1
        elif expected is not None and fp != expected:
            raise ConfigError(
                f"{source}: trajectory {name} was tokenized by tokenizer {fp}, but the model's "
                f"tokenizer is {expected}: its token ids would be other text to this model; "
                "make the trajectories with this model (or train the model that made them)")
        top = max((max(s.token_ids_T, default=-1) for s in t.segments), default=-1)
        if vocab_size is not None and top >= vocab_size:
            raise ConfigError(
                f"{source}: trajectory {name} holds token id {top}, beyond the model's vocabulary "
                f"of {vocab_size}: another tokenizer made it; make the trajectories with this "
                "model")
    return unstamped
