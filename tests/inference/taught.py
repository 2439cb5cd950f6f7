"""A tiny Llama taught, in seconds, to answer given prompts with given turns: a real model (real
weights, served by the real engine and server) whose greedy replies a test knows in advance.
Untrained tiny models never write a well-formed tool call; this one does, so a test can drive a
real client or agent harness through real tool-call round trips.

    path = teach(tok, [(prompt_ids, turn_ids), ...], tmp_path / "m")   # overfit until exact
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.models.loading import save_model

MARGIN = 1.0
"""Logit lead of each taught token over the runner-up: greedy decoding through the engine's
cached forward (other kernels, other rounding) picks the same tokens."""


def teach(tok, examples: list[tuple[list[int], list[int]]], out_dir: Path, *,
          max_positions: int = 4096, max_steps: int = 600, seed: int = 0,
          ends: tuple[str, ...] = ("<|im_end|>",), hidden: int = 32, heads: int = 4,
          margin: float = MARGIN) -> Path:
    """Train until greedy decoding of every prompt gives exactly its turn (teacher-forced, every
    turn token leads by ``MARGIN``; the turn ends with one of the end tokens ``ends``, which the
    saved model stops on), then save. ``hidden / heads`` is the head size (vLLM's CPU attention
    takes 32, 64, 80, ...). ``margin`` above ``MARGIN`` scales the final norm's weight, hence
    every logit, by ``margin / MARGIN`` (cross-entropy alone stalls long before a lead of 20):
    at ``margin=20`` sampling at temperature 1 gives the turn too (a rival token's probability
    is below e^-20)."""
    torch.manual_seed(seed)
    end_ids = [tok.convert_tokens_to_ids(e) for e in ends]
    eot: int | list[int] = end_ids[0] if len(end_ids) == 1 else end_ids
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=max_positions,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=eot))
    width = max(len(p) + len(t) for p, t in examples)
    ids_B_T = torch.full((len(examples), width), tok.pad_token_id)
    labels_B_T = torch.full((len(examples), width), -100)
    for b, (prompt, turn) in enumerate(examples):
        assert turn and turn[-1] in end_ids, "each turn must end with an end-of-turn token"
        seq = prompt + turn
        ids_B_T[b, :len(seq)] = torch.tensor(seq)
        labels_B_T[b, len(prompt):len(seq)] = torch.tensor(turn)
    mask_B_T = (labels_B_T[:, 1:] != -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(max_steps):
        logits_B_T_V = model(ids_B_T).logits[:, :-1]
        target_B_T = labels_B_T[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits_B_T_V.transpose(1, 2), target_B_T,
                                                 ignore_index=-100)
        seen_B_T_V, at_B_T1 = logits_B_T_V.detach(), target_B_T.clamp(min=0)[..., None]
        picked = seen_B_T_V.gather(-1, at_B_T1)[..., 0]
        rival = seen_B_T_V.scatter(-1, at_B_T1, float("-inf"))
        if bool((picked - rival.amax(-1))[mask_B_T].min() > MARGIN):
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    else:
        raise AssertionError(f"not learnt in {max_steps} steps (loss {loss.item():.3f})")
    with torch.no_grad():  # logits = norm(h) * weight @ E^T: scaling the weight scales each lead
        model.model.norm.weight.mul_(max(1.0, margin / MARGIN))
    model.generation_config.eos_token_id = eot
    return save_model(model.eval(), tok, out_dir)
