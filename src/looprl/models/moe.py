"""Mixture-of-experts helpers: find a model's routers, replay recorded routes, the load-balancing loss.

    with RouterTap(model, routes_B_T_L_K, replay=True) as tap:   # routes from the engine
        logits = model(input_ids=tokens_B_T, attention_mask=attn_B_T).logits
    tap.aux_loss(attn_B_T)        # Switch-style load balancing over this forward's real tokens
    tap.disagree_L, tap.decisions  # per MoE layer: (token, layer) decisions unlike the recorded

A *route* is the top-k expert ids one MoE layer chose for one token, ``uint8`` (so at most 255
experts; ``NO_ROUTE`` = 255 marks a token without a record). The engine (``inference.kv_forward``)
records, for every sampled token, the routes of the forward position whose output it was sampled
from; ``Segment.routes`` keeps them aligned with the segment's tokens, so token ``p``'s routes
apply at position ``p - 1`` of the trainer's forward (``shifted_routes``).

Router replay (R3, arXiv 2510.11370): the trainer's forward uses the recorded experts instead of
its own top-k (numerics — bf16 sampling, other kernels — flip near-ties, and a flipped expert
changes the token's logprob by far more than rounding does), while the mixing weights stay the
trainer's own: a softmax over its router logits at the recorded experts (renormalised over the
top-k as the router does), so the router still gets a gradient. Positions without a record (the
prompt, tool output, the first position) keep the trainer's own routing.

Supports HF routers shaped like Qwen3-MoE's, Mixtral's and OLMoE's (``mlp.gate`` returning
``(logits, weights, indices)``, ``mlp.experts``).

``upcycle`` makes a MoE of a trained dense Llama (sparse upcycling, Komatsuzaki et al. 2022,
arXiv 2212.05055): a Mixtral whose every expert is a copy of the dense MLP, so it starts as the
dense model's function and RL moves the experts apart from a competent start.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, PreTrainedModel

NO_ROUTE = 255
"""The uint8 route of a token the engine did not record (prompt and tool tokens)."""


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """The sparse MoE blocks of ``model`` in layer order (empty for a dense model)."""
    return [m for m in model.modules() if hasattr(m, "gate") and hasattr(m, "experts")
            and hasattr(m.gate, "top_k")]


def is_moe(model: nn.Module) -> bool:
    return bool(moe_blocks(model))


def shifted_routes(routes_B_T_L_K: torch.Tensor) -> torch.Tensor:
    """Per-token routes (token p's: the forward at position p-1 sampled it) -> per-position routes
    of the trainer's forward (position i gets token i+1's; the last position none)."""
    out = torch.full_like(routes_B_T_L_K, NO_ROUTE)
    out[:, :-1] = routes_B_T_L_K[:, 1:]
    return out


def replayed_weights(logits_N_E: torch.Tensor, experts_N_K: torch.Tensor,
                     normalize: bool) -> torch.Tensor:
    """The router's mixing weights for the given experts: softmax (fp32) of its own logits taken at
    them, renormalised over the k when the router renormalises its top-k (``norm_topk_prob``)."""
    w = F.softmax(logits_N_E, dtype=torch.float, dim=-1).gather(-1, experts_N_K)
    if normalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w.to(logits_N_E.dtype)


class RouterTap:
    """Forward hooks on every MoE router of ``model`` for the forwards inside ``with``.

    ``routes_B_T_L_K`` (per position of the forward, ``shifted_routes``; NO_ROUTE where none):
    counts, per layer, the positions whose experts differ from the recorded ones (as sets), and,
    with ``replay``, routes those positions to the recorded experts. Every forward's router
    logits are kept for ``aux_loss``. A forward whose token count is not ``B * T`` (a prefix run
    apart) is neither replayed nor counted: give the tap full-batch forwards."""

    def __init__(self, model: nn.Module, routes_B_T_L_K: torch.Tensor | None = None, *,
                 replay: bool = False) -> None:
        self.blocks = moe_blocks(model)
        self.routes = routes_B_T_L_K
        if routes_B_T_L_K is not None and routes_B_T_L_K.shape[2] != len(self.blocks):
            raise ValueError(f"routes recorded for {routes_B_T_L_K.shape[2]} MoE layers, the model "
                             f"has {len(self.blocks)}: trajectories sampled from another model")
        self.replay = replay
        self.logits_L: list[torch.Tensor] = []
        self.disagree_L = [0] * len(self.blocks)
        self.decisions = 0
        """Positions with a recorded route (per layer; the same for every layer)."""
        self.aux: torch.Tensor | None = None
        """Set by the caller to ``aux_loss(...)`` of its forward (``trainer.step.moe_logprobs``)."""
        self._handles: list[Any] = []

    def __enter__(self) -> RouterTap:
        for i, b in enumerate(self.blocks):
            self._handles.append(cast(nn.Module, b.gate).register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, layer: int):
        def hook(gate: nn.Module, args: tuple[Any, ...], out: tuple[torch.Tensor, ...]):
            logits, weights, experts = out
            self.logits_L.append(logits)
            if self.routes is None or logits.shape[0] != self.routes.shape[0] * self.routes.shape[1]:
                return None
            rec_N_K = self.routes[:, :, layer].reshape(logits.shape[0], -1).to(experts.device).long()
            has_N = rec_N_K[:, 0] != NO_ROUTE
            rec_N_K = torch.where(has_N.unsqueeze(-1), rec_N_K, experts)
            if layer == 0:
                self.decisions += int(has_N.sum())
            if self.replay:
                experts = rec_N_K
                weights = replayed_weights(logits, experts, bool(getattr(gate, "norm_topk_prob", True)))
            own = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, experts, True)
            rec = torch.zeros_like(own).scatter_(-1, rec_N_K, True)
            self.disagree_L[layer] += int(((own != rec).any(-1) & has_N).sum())
            return (logits, weights, experts) if self.replay else None
        return hook

    def aux_loss(self, attention_mask_B_T: torch.Tensor | None = None) -> torch.Tensor | None:
        """The Switch-Transformer load-balancing loss (Fedus et al., eq. 4-6, as HF's MoE models
        compute it) over the last full-batch forward's router logits, padding excluded; None for a
        dense model or before any forward."""
        n = len(self.blocks)
        if not n or len(self.logits_L) < n:
            return None
        logits_L = self.logits_L[-n:]
        E, K = logits_L[0].shape[-1], int(cast(Any, self.blocks[0].gate).top_k)
        mask_N = None
        if attention_mask_B_T is not None and attention_mask_B_T.numel() == logits_L[0].shape[0]:
            mask_N = attention_mask_B_T.reshape(-1).float()
        tokens_E = torch.zeros(E, device=logits_L[0].device)
        probs_E = torch.zeros(E, device=logits_L[0].device)
        rows = 0.0
        for lg in logits_L:
            p = F.softmax(lg.float(), dim=-1)
            top = p.topk(K, dim=-1).indices
            m = torch.ones(p.shape[0], device=p.device) if mask_N is None else mask_N.to(p.device)
            tokens_E = tokens_E + torch.zeros(E, device=p.device).scatter_add_(
                0, top.reshape(-1), m.repeat_interleave(K))
            probs_E = probs_E + (p * m.unsqueeze(-1)).sum(0)
            rows = rows + float(m.sum())
        return E * (tokens_E / max(rows, 1.0) * probs_E / max(rows, 1.0)).sum()


def aux_loss_coef(model: nn.Module) -> float:
    """The model's load-balancing coefficient (``router_aux_loss_coef`` in its config; 0 dense)."""
    cfg = getattr(model, "config", None)
    return float(getattr(cfg, "router_aux_loss_coef", 0.0) or 0.0) if is_moe(model) else 0.0


def upcycle(dense: PreTrainedModel, experts: int = 8, top_k: int = 2, *, seed: int = 0,
            router_std: float = 0.02, aux_loss_coef: float = 0.01) -> MixtralForCausalLM:
    """A Mixtral of ``dense``: the same attention, norms and embeddings, ``experts`` copies of each
    layer's MLP and a router drawn N(0, ``router_std``) (seeded). Mixtral renormalises its top-k
    mixing weights to sum to 1, so with equal experts its logits are the dense model's whatever
    the routing; the router gets a gradient once RL has made the experts differ."""
    c = dense.config
    if not isinstance(dense, LlamaForCausalLM) or getattr(c, "mlp_bias", False) or getattr(
            c, "attention_bias", False):
        raise ValueError(f"upcycle takes a Llama without biases (the default model), not "
                         f"{type(dense).__name__}")
    if not 1 <= top_k <= experts <= 255:  # routes are uint8 with 255 for "none"
        raise ValueError(f"upcycle: need 1 <= top_k ({top_k}) <= experts ({experts}) <= 255")
    cfg = MixtralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads or c.num_attention_heads, head_dim=c.head_dim, hidden_act=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings, pad_token_id=c.pad_token_id,
        eos_token_id=c.eos_token_id, bos_token_id=c.bos_token_id, num_local_experts=experts,
        num_experts_per_tok=top_k, router_aux_loss_coef=aux_loss_coef, sliding_window=None)
    cfg.rope_parameters = dict(c.rope_parameters or {})
    moe = MixtralForCausalLM(cfg)
    state = {k: v for k, v in dense.state_dict().items() if ".mlp." not in k}
    gen = torch.Generator().manual_seed(seed)
    for i, layer in enumerate(dense.model.layers):
        m = layer.mlp
        gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach()
        state[f"model.layers.{i}.mlp.experts.gate_up_proj"] = gate_up.expand(experts, -1, -1).clone()
        state[f"model.layers.{i}.mlp.experts.down_proj"] = (
            m.down_proj.weight.detach().expand(experts, -1, -1).clone())
        state[f"model.layers.{i}.mlp.gate.weight"] = router_std * torch.randn(
            experts, c.hidden_size, generator=gen)
    missing, unexpected = moe.load_state_dict(state, strict=False)
    # a tied lm_head is the embedding's; anything else left out is a mapping error
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise AssertionError(f"upcycle: unmapped weights {missing} {unexpected}")
    if c.tie_word_embeddings:
        moe.tie_weights()
    for p in moe.parameters():  # the dense model's dtype (built in the default one)
        p.data = p.data.to(dense.dtype)
    return moe.eval()
