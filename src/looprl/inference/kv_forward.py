"""A decoder forward over a pre-allocated, slot-based KV cache for Llama-family HF models.

HF's default cache grows by ``torch.cat`` every step (~58% of a decode step on CPU). Here every
cached sequence owns a *slot* of a fixed ``[slots, kv_heads, max_len, head_dim]`` tensor per layer;
a decode step writes one K/V row per sequence in place and attends over a view of the cache. The
decode batch is always the first ``B`` slots (the engine keeps active sequences packed there), so
no gather is needed.

The forward reuses the model's own modules (norms, projections, MLP, rotary embedding), so weights
swapped into the model are used at once. Supported: Llama, Qwen2, Qwen3, Mistral (no sliding window),
and Qwen3-MoE and Mixtral (no sliding window), whose sparse blocks run through the model's own router and experts; the forward then
also returns the top-k experts each returned position was routed to (``routes_B_T_L_K``, uint8,
one entry per MoE layer), which the engine records with every sampled token (router replay,
``looprl.models.moe``).

    fwd = CachedForward(model, num_slots=16, max_len=4096)
    out = fwd.prefill(ids, slot=0, start=0)     # out.logits_B_T_V [1, 1, V]: the last new token
    out = fwd.decode([[t] for t in ids_B], pos_B)  # one token per slot 0..B-1: [B, 1, V]
    out = fwd.decode(ids_B_T, pos_B)            # T tokens per slot (speculative verification)

Both also return the hidden state the LM head reads (``hidden_B_T_H``), which MTP heads draft from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from looprl.errors import ConfigError

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral", "qwen3_moe", "mixtral")
PREFILL_CHUNK = 1024  # bounds the attention matrix of a long prefill


def _lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor; on CPU its pages are committed only when written (calloc: fresh mmap pages).

    Zeros, not ``torch.empty``: a decode step attends over positions ``lo..end`` of every row and
    masks the ones past a row's length; a NaN left there by a freed allocation would survive the
    mask (NaN * 0 weight = NaN) and turn the whole row's logits into NaN.
    On CPU ``torch.zeros`` would write (commit) the full KV budget up front; an accelerator's
    memory is not overcommitted, so there the budget is held from the start anyway.
    """
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean 'may attend' mask -> additive float mask (SDPA would convert it in every layer)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


@dataclass(frozen=True)
class ForwardOut:
    """What a cached forward returns for its last positions."""

    logits_B_T_V: torch.Tensor
    """fp32 logits."""
    hidden_B_T_H: torch.Tensor
    """The LM head's input (the final norm's output), in the model's dtype."""
    routes_B_T_L_K: torch.Tensor | None = None
    """MoE models: the experts each position was routed to in each MoE layer (uint8, CPU)."""


class CachedForward:
    """Forward passes of ``model`` that read and write a static slot cache."""

    def __init__(self, model: PreTrainedModel, num_slots: int, max_len: int) -> None:
        cfg = model.config
        if cfg.model_type not in SUPPORTED:
            raise ConfigError(f"TorchEngine supports {SUPPORTED} architectures, not {cfg.model_type!r}; "
                              "serve other models through the 'openai' or 'vllm' engine")
        if getattr(cfg, "use_sliding_window", False) or (
                cfg.model_type in ("mistral", "mixtral") and getattr(cfg, "sliding_window", None)):
            raise ConfigError("sliding-window attention is not supported by TorchEngine; "
                              "disable it in config.json or use the 'vllm' engine")
        self.model = model
        self.base = model.model
        self.layers = list(self.base.layers)
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.scale = attn.scaling
        self.num_slots, self.max_len = num_slots, max_len
        self._routes: list[torch.Tensor] = []  # this forward's [B, T, K] per MoE layer
        param = next(model.parameters())
        self.device = param.device  # the cache and every input tensor live beside the weights
        shape = (num_slots, self.kv_heads, max_len, self.head_dim)
        self.k_L = [_lazy_zeros(shape, param.dtype, self.device) for _ in self.layers]
        self.v_L = [_lazy_zeros(shape, param.dtype, self.device) for _ in self.layers]
        self.refresh_weights()

    @torch.no_grad()
    def refresh_weights(self) -> None:
        """Rebuild the fused q|k|v and gate|up matrices (call after changing the model's weights).

        Fusing cuts a layer's matmul calls from 7 to 4; at decode batch sizes a CPU matmul's fixed
        cost dominates its flops, so this is a large share of a step.
        """
        self.wqkv_L, self.bqkv_L, self.wgu_L = [], [], []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            self.wqkv_L.append(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            bias = a.q_proj.bias is not None
            self.bqkv_L.append(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]) if bias else None)
            fuse_mlp = hasattr(m, "gate_proj") and m.gate_proj.bias is None
            self.wgu_L.append(torch.cat([m.gate_proj.weight, m.up_proj.weight]) if fuse_mlp else None)

    @property
    def slot_bytes(self) -> int:
        k = self.k_L[0]
        return 2 * len(self.layers) * k[0].numel() * k.element_size()

    # -- cache maintenance -------------------------------------------------------------------
    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst``."""
        if length <= 0 or src == dst:
            return
        for k, v in zip(self.k_L, self.v_L, strict=True):
            k[dst, :, :length].copy_(k[src, :, :length])
            v[dst, :, :length].copy_(v[src, :, :length])

    def swap_slots(self, a: int, b: int, len_a: int, len_b: int) -> None:
        """Exchange the contents of two slots (their first ``len_a`` / ``len_b`` positions)."""
        if a == b:
            return
        for cache in (*self.k_L, *self.v_L):
            tmp = cache[a, :, :len_a].clone()
            if len_b:
                cache[a, :, :len_b].copy_(cache[b, :, :len_b])
            if len_a:
                cache[b, :, :len_a].copy_(tmp)

    # -- forward ---------------------------------------------------------------------------
    def _layer(self, i: int, h_B_T_E: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               write, attend) -> torch.Tensor:
        layer = self.layers[i]
        attn = layer.self_attn
        B, T, _ = h_B_T_E.shape
        x = layer.input_layernorm(h_B_T_E)
        nq, nk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        qkv = F.linear(x, self.wqkv_L[i], self.bqkv_L[i])
        q = qkv[..., :nq].view(B, T, self.heads, self.head_dim)
        k = qkv[..., nq:nq + nk].view(B, T, self.kv_heads, self.head_dim)
        v = qkv[..., nq + nk:].view(B, T, self.kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        write(self.k_L[i], self.v_L[i], k, v)
        o = attend(self.k_L[i], self.v_L[i], q)
        h_B_T_E = h_B_T_E + attn.o_proj(o.transpose(1, 2).reshape(B, T, -1))
        return h_B_T_E + self._mlp(i, layer.post_attention_layernorm(h_B_T_E))

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        m, wgu = self.layers[i].mlp, self.wgu_L[i]
        if hasattr(m, "experts"):  # a sparse MoE block: the model's own router and experts
            B, T, H = x.shape
            flat = x.reshape(-1, H)
            _, weights, experts = m.gate(flat)
            self._routes.append(experts.view(B, T, -1))
            return m.experts(flat, experts, weights).view(B, T, H)
        if wgu is None:
            return m(x)
        gate, up = F.linear(x, wgu).chunk(2, dim=-1)
        return m.down_proj(m.act_fn(gate) * up)

    def _out(self, h: torch.Tensor) -> ForwardOut:
        hidden = self.base.norm(h)
        routes = None
        if self._routes:
            T = h.shape[1]  # the last T positions of the forward
            routes = torch.stack([r[:, -T:] for r in self._routes], dim=2).to("cpu", torch.uint8)
            self._routes = []
        return ForwardOut(self.model.lm_head(hidden).float(), hidden, routes)

    @torch.inference_mode()
    def prefill(self, ids: list[int], slot: int, start: int) -> ForwardOut:
        """Run ``ids`` at positions ``start..`` of ``slot``; returns the last one's output ``[1, 1, .]``."""
        assert ids and start + len(ids) <= self.max_len, "prefill past the slot's capacity"
        for c0 in range(0, len(ids), PREFILL_CHUNK):
            self._routes = []  # only the last position's routes are returned
            chunk = ids[c0:c0 + PREFILL_CHUNK]
            p0, n = start + c0, len(chunk)
            pos_1_T = torch.arange(p0, p0 + n, device=self.device).unsqueeze(0)
            h = self.base.embed_tokens(torch.tensor([chunk], device=self.device))
            cos, sin = self.base.rotary_emb(h, pos_1_T)
            kpos = torch.arange(p0 + n, device=self.device)
            mask = _additive((kpos.unsqueeze(0) <= pos_1_T[0].unsqueeze(1)).view(1, 1, n, p0 + n), h.dtype)

            def write(kc, vc, k, v, p0=p0, n=n):
                kc[slot, :, p0:p0 + n] = k[0]
                vc[slot, :, p0:p0 + n] = v[0]

            def attend(kc, vc, q, end=p0 + n, mask=mask):
                return F.scaled_dot_product_attention(
                    q, kc[slot:slot + 1, :, :end], vc[slot:slot + 1, :, :end], attn_mask=mask,
                    scale=self.scale, enable_gqa=self.heads != self.kv_heads)

            for i in range(len(self.layers)):
                h = self._layer(i, h, cos, sin, write, attend)
        return self._out(h[:, -1:])

    @torch.inference_mode()
    def decode(self, ids_B_T: list[list[int]], pos_B: list[int],
               prefix_B: list[tuple[int, int] | None] | None = None) -> ForwardOut:
        """``T`` tokens for each of slots ``0..B-1``, row b's at positions ``pos_B[b]..+T-1``
        (causal among themselves); returns their outputs ``[B, T, .]``. T = 1 is a decode step;
        T > 1 verifies drafted tokens (the KV of all T is written; a row's later step simply
        overwrites the positions of the drafts it rejected).

        ``prefix_B[b] = (slot, P)`` says row b's first P positions equal those of ``slot`` (its
        group's shared prompt). Rows sharing a prefix attend to it in ONE pass (cascade attention:
        the prefix KV is read once per group instead of once per row) and to their own positions
        ``P..pos`` separately; the two softmax parts are merged exactly through their log-sum-exps.
        """
        B, T = len(ids_B_T), len(ids_B_T[0])
        dev = self.device
        self._routes = []
        assert max(pos_B) + T <= self.max_len, "decode past the slot's capacity"
        pos = torch.tensor(pos_B, device=dev)
        pos_B_T = pos.unsqueeze(1) + torch.arange(T, device=dev)
        rows_B_T = torch.arange(B, device=dev).unsqueeze(1).expand(B, T)
        prefix_B = prefix_B or [None] * B
        plen_B = [p[1] if p else 0 for p in prefix_B]
        lo, end = min(plen_B), max(pos_B) + T  # each row's own keys lie in [lo, end)
        h = self.base.embed_tokens(torch.tensor(ids_B_T, device=dev))
        cos, sin = self.base.rotary_emb(h, pos_B_T)
        G = self.heads // self.kv_heads
        kpos = torch.arange(lo, end, device=dev).view(1, 1, -1)
        allowed = (kpos <= pos_B_T.unsqueeze(2)) & (kpos >= torch.tensor(plen_B, device=dev).view(B, 1, 1))
        # the G query heads sharing a KV head become G*T query rows of that head (no GQA expand);
        # with T = 1 one mask row broadcasts over the G
        L = end - lo
        allowed = allowed.unsqueeze(1) if T == 1 else \
            allowed.unsqueeze(1).expand(B, G, T, L).reshape(B, 1, G * T, L)
        mask = _additive(allowed, h.dtype)
        groups: dict[tuple[int, int], list[int]] = {}
        for b, p in enumerate(prefix_B):
            if p and p[1] > 0:
                groups.setdefault(p, []).append(b)
        group_rows = [(slot, P, torch.tensor(bs, device=dev)) for (slot, P), bs in groups.items()]
        GT = G * T

        def write(kc, vc, k, v):
            if T == 1:
                kc[rows_B_T[:, 0], :, pos] = k[:, :, 0]
                vc[rows_B_T[:, 0], :, pos] = v[:, :, 0]
            else:
                kc[rows_B_T, :, pos_B_T] = k.transpose(1, 2)
                vc[rows_B_T, :, pos_B_T] = v.transpose(1, 2)

        def attend(kc, vc, q):
            qg = q.reshape(B, self.kv_heads, GT, self.head_dim)
            if not group_rows:
                o = F.scaled_dot_product_attention(qg, kc[:B, :, lo:end], vc[:B, :, lo:end],
                                                   attn_mask=mask, scale=self.scale)
                return o.reshape(B, self.heads, T, self.head_dim)
            o, lse = _flash(qg, kc[:B, :, lo:end], vc[:B, :, lo:end], mask, self.scale)
            for slot, P, bs in group_rows:
                n = len(bs)
                # all rows of the group as one batch of n*G*T query rows against the shared prefix
                qp = qg[bs].transpose(0, 1).reshape(1, self.kv_heads, n * GT, self.head_dim)
                op, lp = _flash(qp, kc[slot:slot + 1, :, :P], vc[slot:slot + 1, :, :P], None, self.scale)
                op = op.view(self.kv_heads, n, GT, self.head_dim).transpose(0, 1)
                lp = lp.view(self.kv_heads, n, GT).transpose(0, 1)
                ls = lse[bs]
                tot = torch.logaddexp(ls, lp)
                o[bs] = o[bs] * (ls - tot).exp().unsqueeze(-1).to(o.dtype) \
                    + op * (lp - tot).exp().unsqueeze(-1).to(o.dtype)
            return o.reshape(B, self.heads, T, self.head_dim)

        for i in range(len(self.layers)):
            h = self._layer(i, h, cos, sin, write, attend)
        return self._out(h)


def _flash(q, k, v, mask, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA that also returns the fp32 log-sum-exp of each query row: torch's fused kernel on
    CPU, plain ops elsewhere (CUDA's flash kernel takes no float mask)."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=mask, scale=scale)
        return out, lse.float()
    s = (q @ k.transpose(-1, -2)).float() * scale
    if mask is not None:
        s = s + mask
    lse = s.logsumexp(dim=-1)
    return ((s - lse.unsqueeze(-1)).exp().to(v.dtype) @ v), lse
