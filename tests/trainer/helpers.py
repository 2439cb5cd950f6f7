"""Shared builders for trainer tests: a tiny random Llama and hand-made groups."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.types import Counters, Group, RewardBreakdown, Segment, StopReason, Trajectory

VOCAB = 64


def tiny_llama(seed: int = 0, vocab: int = VOCAB) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).float()


def segment(prompt: list[int], completion: list[int], logprob: float = -1.0,
            version: int = 0) -> Segment:
    n_p, n_c = len(prompt), len(completion)
    return Segment(tuple(prompt + completion), (0.0,) * n_p + (logprob,) * n_c,
                   (0,) * n_p + (1,) * n_c, (-1,) * n_p + (version,) * n_c)


def trajectory(segments: list[Segment], reward: float | None, group_id: str = "g",
               stop: StopReason = StopReason.FINISHED) -> Trajectory:
    return Trajectory(task_id="t", group_id=group_id, segments=tuple(segments), messages=(),
                      counters=Counters(), stop_reason=stop,
                      reward=None if reward is None else RewardBreakdown.of({"tests": reward}))


def group(trajs: list[Trajectory], gid: str = "g") -> Group:
    return Group(task_id="t", group_id=gid, trajectories=tuple(trajs))
