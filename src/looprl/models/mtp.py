"""Multi-token-prediction (MTP) heads for any HF causal LM, trained by self-distillation.

    heads = attach_heads(model, new_heads(model, num_heads=3))  # or load_model(dir) attaches saved ones
    with capture_hidden(model) as seen:                         # any training forward
        loss = model(input_ids=x, labels=x).loss
    out = distill_loss(heads, model, seen[0], x)                # out.kl_K, out.accept_K
    (loss + out.loss).backward()             # the heads' term reaches the heads only (model detached)
    train_heads(model, sequences, steps=600)  # or distill on a frozen model's own rollouts / text
    save_heads(heads, model_dir)             # mtp_heads.safetensors + mtp_config.json beside the model

Head j (1..k) predicts token t+j+1. It follows DeepSeek-V3's MTP: the chain state starts at the
main model's last hidden state h_t (the LM head's input) and each head advances it by one token,
``s_j = s_{j-1}' + MLP(s_{j-1}')`` with ``s_{j-1}' = W [rmsnorm(s_{j-1}); rmsnorm(emb(x_{t+j}))]``,
then reads logits through the main model's own (frozen) LM head. Why this design and not
Medusa's independent heads on h_t: a draft token is accepted with probability 1 - TV(p, q)
where p is the model's distribution *given the tokens before it*; rollouts sample (temperature
1), so the token after a drafted one depends on which one was drawn, and a head that never sees
it can only predict the average over it. Conditioning on the next token's embedding is what lets
head j match p at depth j. The block has no attention (DeepSeek-V3's has a full transformer
block): decoding small batches is bound by reading weights and by per-op overhead, and attention
in a head would read the row's context once per drafted token (or keep a KV cache of its own).

Training target (self-distillation, as Composer does): head j at position t matches the main
model's full distribution at position t+j, KL(p_main || q_head), the main model detached — the
heads learn what the model would say, not what the data says, which is what acceptance measures.
The loss is computed from the hidden states a training forward already produced
(``capture_hidden`` records the LM head's input during any forward; the targets are the LM head
of them), so pretraining, SFT and the GRPO step keep the heads current at the cost of the heads'
own small forward and backward, on a bounded sample of positions (``DISTILL_POSITIONS``).

The heads are attached to the model as the submodule ``mtp_heads``: ``model.state_dict()``,
optimizers, checkpoints and the weights the trainer publishes to the engine carry them with the
policy, and the engine swaps both together. They are kept out of ``model.safetensors``
(``save_pretrained`` skips them); ``save_heads`` / ``load_heads`` use their own two files.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from looprl.errors import ConfigError
from looprl.models.config import MAX_HEADS

HEADS_ATTR = "mtp_heads"
WEIGHTS_FILE = "mtp_heads.safetensors"
CONFIG_FILE = "mtp_config.json"


@dataclass(frozen=True)
class MTPConfig:
    """Shape of a model's MTP heads."""

    num_heads: int = 3
    """k: head j predicts token t+j+1, so a verify step can accept up to k drafted tokens."""
    hidden_size: int = 256
    """The main model's hidden size (the LM head's input width)."""
    intermediate_size: int = 128
    """Width of each head's SwiGLU MLP."""
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 1 <= self.num_heads <= MAX_HEADS:
            raise ConfigError(f"mtp num_heads must be in 1..{MAX_HEADS}, got {self.num_heads}")


class MTPHead(nn.Module):
    """One depth of the chain: (state at t, embedding of token t+j) -> state predicting t+j+1."""

    def __init__(self, cfg: MTPConfig) -> None:
        super().__init__()
        H, inter = cfg.hidden_size, cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        self.norm_state = nn.Parameter(torch.ones(H))
        self.norm_embed = nn.Parameter(torch.ones(H))
        self.proj = nn.Linear(2 * H, H, bias=False)
        self.norm_mlp = nn.Parameter(torch.ones(H))
        self.gate_up = nn.Linear(H, 2 * inter, bias=False)  # gate and up fused: one matmul
        self.down = nn.Linear(inter, H, bias=False)
        self.norm_out = nn.Parameter(torch.ones(H))
        for lin in (self.proj, self.gate_up, self.down):
            nn.init.normal_(lin.weight, std=0.02)
        nn.init.zeros_(self.down.weight)  # starts as the projection alone; the MLP is learned

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)

    def forward(self, state: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        x = self.proj(torch.cat([self._norm(state, self.norm_state), self._norm(embed, self.norm_embed)], -1))
        gate, up = self.gate_up(self._norm(x, self.norm_mlp)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)

    def lm_input(self, state: torch.Tensor) -> torch.Tensor:
        """What the main model's LM head reads for this head's prediction."""
        return self._norm(state, self.norm_out)


class MTPHeads(nn.Module):
    """The k heads of a model (see the module docstring)."""

    def __init__(self, cfg: MTPConfig) -> None:
        super().__init__()
        self.config = cfg
        self.heads = nn.ModuleList(MTPHead(cfg) for _ in range(cfg.num_heads))

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    def head(self, j: int) -> MTPHead:
        """Head ``j`` of the chain, 0-based (it predicts token t+j+2)."""
        h = self.heads[j]
        assert isinstance(h, MTPHead), "only MTPHead modules are put in the list (typed as Modules)"
        return h


def input_embeddings(model: nn.Module) -> nn.Embedding:
    """An HF causal LM's token embeddings (its ``get_input_embeddings()``)."""
    # cast: torch's stubs type an attribute nn.Module does not declare as ``Tensor | Module``
    # (its __getattr__), so HF's method is not known to be callable; it returns an nn.Embedding
    return cast(Callable[[], nn.Embedding], model.get_input_embeddings)()


def lm_head(model: nn.Module) -> nn.Linear:
    """An HF causal LM's LM head (its ``get_output_embeddings()``)."""
    # cast: as in input_embeddings (torch types the attribute ``Tensor | Module``); an nn.Linear
    return cast(Callable[[], nn.Linear], model.get_output_embeddings)()


def new_heads(model: nn.Module, num_heads: int = 3, intermediate_size: int | None = None) -> MTPHeads:
    """Fresh heads shaped for ``model`` (same dtype). The MLP is hidden/2 wide unless given: a
    draft step reads all of a head's weights, and decoding small batches is bound by weight
    reads, so a narrow head drafts cheaply."""
    H = lm_head(model).weight.shape[1]
    cfg = MTPConfig(num_heads=num_heads, hidden_size=H, intermediate_size=intermediate_size or H // 2,
                    rms_norm_eps=float(getattr(model.config, "rms_norm_eps", 1e-6)))
    return MTPHeads(cfg).to(next(model.parameters()).dtype)


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def heads_of(model: nn.Module) -> MTPHeads | None:
    """The heads attached to ``model`` (or to the model a DDP wrapper holds), if any."""
    heads = getattr(_unwrap(model), HEADS_ATTR, None)
    return heads if isinstance(heads, MTPHeads) else None


def attach_heads(model: nn.Module, heads: MTPHeads) -> MTPHeads:
    """Make ``heads`` the submodule ``model.mtp_heads`` (kept out of ``save_pretrained``'s file)."""
    H = lm_head(model).weight.shape[1]
    if heads.config.hidden_size != H:
        raise ConfigError(f"MTP heads of hidden size {heads.config.hidden_size} do not fit a model of "
                          f"hidden size {H}; train new heads for this model")
    setattr(model, HEADS_ATTR, heads)
    skip = getattr(model, "_keys_to_ignore_on_save", None)
    keys = {f"{HEADS_ATTR}.{k}" for k in heads.state_dict()}
    # torch types Module.__setattr__'s value as Tensor | Module; HF reads this attribute as a set
    model._keys_to_ignore_on_save = set(skip or ()) | keys  # type: ignore[assignment]
    return heads


def policy_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The model's parameters without its MTP heads' (what the policy loss trains)."""
    heads = heads_of(model)
    own = {id(p) for p in heads.parameters()} if heads is not None else set()
    return [p for p in model.parameters() if id(p) not in own]


def clip_grad_norms(model: nn.Module, max_norm: float) -> float:
    """Clip the policy's and the heads' gradients separately (a large distillation gradient must
    not shrink the policy's step); returns the policy's norm. Non-finite head gradients are
    dropped, so the optimizer step leaves the heads as they are."""
    norm = float(torch.nn.utils.clip_grad_norm_(policy_parameters(model), max_norm))
    heads = heads_of(model)
    if heads is not None:
        hn = float(torch.nn.utils.clip_grad_norm_(heads.parameters(), max_norm))
        if not math.isfinite(hn):
            for p in heads.parameters():
                p.grad = None
    return norm


def save_heads(heads: MTPHeads, out_dir: str | Path) -> None:
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in heads.state_dict().items()}, out / WEIGHTS_FILE)
    (out / CONFIG_FILE).write_text(json.dumps(asdict(heads.config), indent=2))


def load_heads(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> MTPHeads | None:
    """The heads saved in ``model_dir`` (None if it has none)."""
    d = Path(model_dir).expanduser()
    if not (d / CONFIG_FILE).exists():
        return None
    if not (d / WEIGHTS_FILE).exists():
        raise ConfigError(f"{d / CONFIG_FILE} exists but {WEIGHTS_FILE} is missing; save the heads "
                          f"again (looprl.models.mtp.save_heads) or remove {CONFIG_FILE}")
    try:
        cfg = MTPConfig(**json.loads((d / CONFIG_FILE).read_text()))
    except TypeError as e:
        raise ConfigError(f"{d / CONFIG_FILE} is not an MTP config ({e}); remove it or save the heads "
                          "again") from e
    heads = MTPHeads(cfg)
    heads.load_state_dict(load_file(d / WEIGHTS_FILE))
    return heads.to(dtype).eval()


@contextlib.contextmanager
def capture_hidden(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Record the LM head's input ``[B, T, H]`` in every forward of ``model`` run inside the
    block (in order): the hidden states any HF causal LM computes anyway. The LM head of them
    gives the forward's logits, which is how the distillation targets are computed."""
    seen: list[torch.Tensor] = []
    hook = lm_head(_unwrap(model)).register_forward_hook(
        lambda _m, args, _out: seen.append(args[0]))
    try:
        yield seen
    finally:
        hook.remove()


@dataclass(frozen=True)
class DistillOut:
    """The heads' self-distillation loss on one forward and what it says about acceptance."""

    loss: torch.Tensor
    """Sum over heads of the mean KL(p_main || q_head) over valid target positions."""
    kl_K: tuple[float, ...]
    """Per head: mean KL."""
    accept_K: tuple[float, ...]
    """Per head: mean of 1 - TV(p, q), the probability a sampled draft would be accepted (at
    temperature 1, the chain's earlier tokens given)."""
    positions: int
    """Target positions of the first head."""


def _distill(heads: MTPHeads, model: nn.Module, hidden_N_H: torch.Tensor, tokens_N: torch.Tensor,
             ok_K_N: torch.Tensor, starts: torch.Tensor) -> DistillOut:
    """The chain from each start position i over flat positions: head j reads the state and
    token i + j and is compared with the model's distribution at i + j (``lm_head(hidden)``)
    where ``ok_K_N[j - 1, i]`` (that target exists, in the same sequence)."""
    m = _unwrap(model)
    emb_w = input_embeddings(m).weight.detach()
    lm = lm_head(m)
    lm_w = lm.weight.detach()
    lm_b = lm.bias.detach() if getattr(lm, "bias", None) is not None else None
    N = tokens_N.shape[0]
    hidden_N_H = hidden_N_H.detach().to(emb_w.dtype)
    state = hidden_N_H[starts]
    total = torch.zeros((), dtype=torch.float32, device=hidden_N_H.device)
    kls, accs = [], []
    for j in range(1, heads.num_heads + 1):
        head = heads.head(j - 1)
        w = ok_K_N[j - 1, starts]
        if not bool(w.any()):
            break
        at = (starts + j).clamp(max=N - 1)
        state = head(state, F.embedding(tokens_N[at], emb_w))
        q_logp = F.log_softmax(F.linear(head.lm_input(state[w]), lm_w, lm_b).float(), dim=-1)
        with torch.no_grad():
            p_logp = F.log_softmax(F.linear(hidden_N_H[at[w]], lm_w, lm_b).float(), dim=-1)
        kl = (p_logp.exp() * (p_logp - q_logp)).sum(-1).mean()
        total = total + kl
        kls.append(float(kl.detach()))
        with torch.no_grad():
            accs.append(float(1 - 0.5 * (p_logp.exp() - q_logp.exp()).abs().sum(-1).mean()))
    return DistillOut(total, tuple(kls), tuple(accs), int(ok_K_N[0, starts].sum()))


def _starts(ok_K_N: torch.Tensor, max_positions: int | None, gen: torch.Generator | None) -> torch.Tensor:
    starts = ok_K_N[0].nonzero().squeeze(1)
    if max_positions is not None and starts.numel() > max_positions:
        pick = torch.randperm(starts.numel(), generator=gen)[:max_positions]  # gen: a CPU one
        starts = starts[pick.to(starts.device)]
    return starts


def distill_loss(heads: MTPHeads, model: nn.Module, hidden_B_T_H: torch.Tensor, tokens_B_T: torch.Tensor,
                 mask_B_T: torch.Tensor | None = None, *, max_positions: int | None = None,
                 gen: torch.Generator | None = None) -> DistillOut:
    """Self-distillation of the heads on one forward over ``tokens_B_T`` (see the module
    docstring): ``hidden_B_T_H`` is the LM head's input there (``capture_hidden``), detached
    here; ``mask_B_T`` marks real tokens (default all). Head j's prediction at t is compared
    with the model's distribution at t+j; the embeddings and LM head are the model's, frozen.
    ``max_positions``: run the chains from that many random start positions only (the loss is
    an unbiased estimate at a fraction of the cost)."""
    B, T = tokens_B_T.shape
    K = heads.num_heads
    mask = torch.ones_like(tokens_B_T, dtype=torch.bool) if mask_B_T is None else mask_B_T.bool()
    ok = torch.zeros(K, B, T, dtype=torch.bool, device=tokens_B_T.device)
    prev = mask
    for j in range(1, K + 1):  # target t+j real (and every target before it on the chain)
        prev = prev & F.pad(mask[:, j:], (0, j), value=False)
        ok[j - 1] = prev
    return _distill(heads, model, hidden_B_T_H.reshape(B * T, -1), tokens_B_T.reshape(-1),
                    ok.reshape(K, -1), _starts(ok.reshape(K, -1), max_positions, gen))


DISTILL_POSITIONS = 2048
"""Chains a trainer's distillation term runs per forward (``distill_spans``): it bounds the
term's cost (k heads, each with a vocabulary-wide softmax) on long RL and SFT batches; a random
2,048 estimate the KL well."""


def distill_spans(heads: MTPHeads, model: nn.Module, seen: Sequence[torch.Tensor], tokens_B_T: torch.Tensor,
                  mask_B_T: torch.Tensor, max_positions: int | None = DISTILL_POSITIONS) -> DistillOut:
    """``distill_loss`` over forwards that ran on consecutive column spans of ``tokens_B_T``, each
    on its first rows (a prefix shared by all rows run once on row 0, then every row's rest, as
    ``trainer.step.token_logprobs`` does); position-weighted means of the spans' results, with
    ``max_positions`` shared among the spans by size."""
    total_cols = sum(h.shape[0] * h.shape[1] for h in seen)
    outs, col = [], 0
    for h in seen:
        b, t = h.shape[:2]
        share = None if max_positions is None else max(1, max_positions * b * t // max(total_cols, 1))
        outs.append(distill_loss(heads, model, h, tokens_B_T[:b, col:col + t], mask_B_T[:b, col:col + t],
                                 max_positions=share))
        col += t
    assert col == tokens_B_T.shape[1], "the captured forwards do not cover the batch's columns"
    n = max(sum(o.positions for o in outs), 1)
    K = max(len(o.kl_K) for o in outs)

    def mean(field: str, j: int) -> float:
        return sum(getattr(o, field)[j] * o.positions for o in outs if len(getattr(o, field)) > j) / n

    return DistillOut(sum((o.loss * o.positions for o in outs), tokens_B_T.new_zeros((), dtype=torch.float32)) / n,
                      tuple(mean("kl_K", j) for j in range(K)), tuple(mean("accept_K", j) for j in range(K)),
                      sum(o.positions for o in outs))


def train_heads(model: nn.Module, sequences: Sequence[Sequence[int]], *, steps: int,
                positions: int = 2048, lr: float = 3e-3, seed: int = 0) -> list[DistillOut]:
    """Distill the heads attached to ``model`` on whole token sequences (text, or the model's own
    rollouts with their prompts: the heads then see the contexts they will draft in), the model
    frozen: its hidden states are computed once, then each step runs the heads' chains from
    ``positions`` random start positions. One ``DistillOut`` a step."""
    heads = heads_of(model)
    if heads is None:
        raise ConfigError("train_heads: the model has no MTP heads; attach_heads(model, new_heads(model))")
    if steps < 1 or not sequences or min(len(s) for s in sequences) < 2:
        raise ConfigError("train_heads needs steps >= 1 and sequences of 2+ tokens")
    K = heads.num_heads
    dev = next(model.parameters()).device
    hidden, tokens, left = [], [], []
    with torch.no_grad(), capture_hidden(model) as seen:
        for seq in sequences:
            model(input_ids=torch.tensor([list(seq)], device=dev), use_cache=False)
            hidden.append(seen.pop()[0])
            tokens.append(torch.tensor(list(seq), device=dev))
            left.append(torch.arange(len(seq) - 1, -1, -1, device=dev))  # tokens after each one
    hidden_N_H, tokens_N, left_N = torch.cat(hidden), torch.cat(tokens), torch.cat(left)
    ok_K_N = torch.stack([left_N >= j for j in range(1, K + 1)])
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    was_training = heads.training
    heads.train()
    outs = []
    for step in range(steps):
        for g in opt.param_groups:  # linear warm-up over the first tenth, then cosine decay
            warm = max(1, steps // 10)
            g["lr"] = lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / steps))
        out = _distill(heads, model, hidden_N_H, tokens_N, ok_K_N, _starts(ok_K_N, positions, gen))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(heads.parameters(), 1.0)
        opt.step()
        outs.append(out)
    heads.train(was_training)
    return outs
