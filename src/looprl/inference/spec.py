"""Speculative decoding for TorchEngine: draft with the model's MTP heads and/or by prompt
lookup, accept exactly.

    drafter = Drafter(model, heads, lookup=6)             # heads: looprl.models.mtp.MTPHeads or None
    looked_B = [index_b.propose(k) for each row]          # NgramIndex over the row's context
    draft = drafter.draft(hidden_B_H, last_B, temps_B, top_ps_B, u_B_K, looked_B)
    out = fwd.decode([[t, *d] for t, d in zip(last_B, draft.tokens_B_K)], pos_B)   # verify
    acc = accept(out.logits_B_T_V, draft, temps_B, top_ps_B, u_accept_B_K, u_final_B)
    acc.accepted_B, acc.tokens_B_T, acc.logprobs_B_T       # row b emits tokens_B_T[b, :accepted+1]

Exactness. Draft token d_i was drawn from the head's distribution q_i; the target distribution
p_i is the one plain decoding samples from (temperature-scaled, top-p truncated:
``sampling_logprobs_B_V``) computed by the verify forward. d_i is accepted with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is drawn from max(p_i - q_i, 0)
renormalised, and if every draft is accepted one more token comes from p_{k+1}. Every emitted
token then follows p exactly, whatever q is (Leviathan et al. 2023, Chen et al. 2023); q only
decides how many tokens a verify step yields. Greedy rows (temperature 0) are the limit where p
and q are point masses: a draft is accepted iff it is the target's argmax, the rejected position
emits that argmax, so the tokens are those of plain greedy decoding. The logprob recorded for
each token is the target's, as plain decoding records it.

Prompt lookup (``NgramIndex``): an agent's output copies its context a lot (the path and the
selected line it edits, the call format of its earlier turns), so the tokens that followed the
last earlier occurrence of the row's final n tokens (longest n first) are a draft that costs no
forward at all, and the only draft a model without heads has. A looked-up token is a
deterministic draft, q = a point mass on it: accepted with probability p(d), and on rejection the
residual max(p - q, 0) is p without d: the rule above, exact as it is. Where a row has both, its
looked-up tokens come first and the heads draft the positions past them (each head is fed the
token before it, looked up or drafted); a position neither fills is padded with the previous
token (a point mass too: exact, and rarely accepted).

Randomness: each row draws its 2k+1 uniforms per step from its request's generator, so a seeded
request is reproducible under a fixed draft length ("on", "off"); tokens differ between draft
lengths (same distribution, different coupling), and "auto" picks lengths by measured speed.

``SpecController`` decides the draft length per batch size (``"auto"``): it measures the cost
per emitted token of plain steps and of each draft length 1..k, uses the cheapest, and
re-measures the others now and then (acceptance moves as the weights move).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from looprl.errors import ConfigError
from looprl.inference.config import MODES
from looprl.inference.sampling import sampling_logprobs_B_V
from looprl.models.mtp import MTPHeads, input_embeddings, lm_head


@dataclass(frozen=True)
class Draft:
    """Drafted tokens of a batch and the distributions they were drawn from."""

    tokens_B_K: torch.Tensor  # long
    probs_B_K_V: torch.Tensor | None
    """q, fp32 (greedy rows draft the argmax and ignore it); None when every row is greedy."""


@dataclass(frozen=True)
class Accepted:
    """The outcome of verifying a draft: row b emits ``tokens_B_T[b, :accepted_B[b] + 1]``."""

    accepted_B: list[int]
    tokens_B_T: list[list[int]]
    logprobs_B_T: list[list[float]]


def _inverse_cdf(probs_B_V: torch.Tensor, u_B: torch.Tensor) -> torch.Tensor:
    """One token per row from (unnormalised) probabilities and uniforms in [0, 1). The first
    index whose cdf exceeds u x total: never a token of probability 0 (its cdf equals the one
    before it), and u < 1 keeps the index inside the vocabulary."""
    cdf = probs_B_V.cumsum(dim=-1)
    return torch.searchsorted(cdf, (u_B * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)


class NgramIndex:
    """Where each n-gram (n = 1..``max_n``) of a growing token sequence last occurred with a
    token after it: the source of prompt-lookup drafts.

    >>> ix = NgramIndex([5, 6, 7, 8, 5, 6])
    >>> ix.propose(3)       # ..., 5, 6 occurred before, followed by 7, 8, 5
    [7, 8, 5]
    >>> ix.extend([9]); ix.propose(3)   # "6, 9" never did; "9" neither
    []
    """

    def __init__(self, tokens: Sequence[int] = (), max_n: int = 4) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        seq, nxt = self.tokens, self._next
        for t in tokens:
            i = len(seq)  # t's index: every n-gram ending just before it is now followed
            for n in range(1, min(self.max_n, i) + 1):
                nxt[tuple(seq[i - n:i])] = i
            seq.append(t)

    def propose(self, k: int, min_n: int = 1) -> list[int]:
        """Up to ``k`` tokens that followed the last earlier occurrence of the longest suffix
        (of ``min_n`` tokens or more) seen before ([] when none was)."""
        seq = self.tokens
        for n in range(min(self.max_n, len(seq)), min_n - 1, -1):
            i = self._next.get(tuple(seq[-n:]))
            if i is not None:
                return seq[i:i + k]
        return []


class Drafter:
    """Drafts at decode time (one row per running request): the row's looked-up tokens
    (``NgramIndex``), then the model's MTP head chain, if it has heads."""

    def __init__(self, model: nn.Module, heads: MTPHeads | None, lookup: int = 0) -> None:
        self.heads, self.lookup = heads, lookup
        self.embed = input_embeddings(model)
        self.lm_head = lm_head(model)

    @property
    def num_heads(self) -> int:
        return self.heads.num_heads if self.heads is not None else 0

    @property
    def max_draft(self) -> int:
        return max(self.num_heads, self.lookup)

    @torch.inference_mode()
    def draft(self, hidden_B_H: torch.Tensor, last_B: list[int], temps_B: torch.Tensor,
              top_ps_B: torch.Tensor, u_B_K: torch.Tensor,
              looked_B: list[list[int]] | None = None) -> Draft:
        """k tokens per row after ``last_B`` (sampled, not yet fed), whose target distribution
        came from the main model's hidden state ``hidden_B_H``; a row's ``looked_B`` tokens
        (at most k) take the first positions."""
        B, K = u_B_K.shape
        dev = u_B_K.device
        greedy = temps_B <= 0
        all_greedy = bool(greedy.all())
        mixed = not all_greedy and bool(greedy.any())
        V = self.lm_head.weight.shape[0]
        forced_B_K = torch.full((B, K), -1, dtype=torch.long, device=dev)
        for b, looked in enumerate(looked_B or ()):
            if looked:
                forced_B_K[b, :len(looked)] = torch.tensor(looked[:K], device=dev)
        state, tok = hidden_B_H, torch.tensor(last_B, device=dev)
        toks, probs = [], []
        for j in range(K):
            f, has = forced_B_K[:, j], forced_B_K[:, j] >= 0
            q = None
            if self.heads is not None and j < self.heads.num_heads:
                head = self.heads.head(j)
                state = head(state, self.embed(tok))
                logits = self.lm_head(head.lm_input(state)).float()
                if all_greedy:
                    drafted = logits.argmax(dim=-1)
                else:
                    q = sampling_logprobs_B_V(logits, temps_B, top_ps_B).exp()
                    drafted = _inverse_cdf(q, u_B_K[:, j])
                    if mixed:
                        drafted = torch.where(greedy, logits.argmax(dim=-1), drafted)
                tok = torch.where(has, f, drafted)
            else:
                tok = torch.where(has, f, tok)  # looked up, or the previous token as filler
            if not all_greedy:
                point = torch.nn.functional.one_hot(tok, V).float()
                probs.append(point if q is None else torch.where(has.unsqueeze(1), point, q))
            toks.append(tok)
        return Draft(torch.stack(toks, 1), torch.stack(probs, 1) if probs else None)


def accept(logits_B_T_V: torch.Tensor, draft: Draft, temps_B: torch.Tensor, top_ps_B: torch.Tensor,
           u_accept_B_K: torch.Tensor, u_final_B: torch.Tensor) -> Accepted:
    """Rejection sampling of the drafts against the verify forward's logits (T = K + 1); see the
    module docstring."""
    B, T, V = logits_B_T_V.shape
    K = T - 1
    logp = sampling_logprobs_B_V(logits_B_T_V.reshape(B * T, V), temps_B.repeat_interleave(T),
                                 top_ps_B.repeat_interleave(T)).view(B, T, V)
    d = draft.tokens_B_K
    arg_B_T = logits_B_T_V.argmax(dim=-1)
    rows = torch.arange(B, device=logits_B_T_V.device)
    if draft.probs_B_K_V is None:  # every row greedy: accept the drafts that are the argmax
        a_B = (d == arg_B_T[:, :K]).long().cumprod(dim=1).sum(dim=1)
        final = arg_B_T[rows, a_B]
    else:
        greedy = temps_B <= 0
        q = draft.probs_B_K_V
        p = logp.exp()
        pd = p[:, :K].gather(2, d.unsqueeze(2)).squeeze(2)
        qd = q.gather(2, d.unsqueeze(2)).squeeze(2)
        # accept with probability min(1, p/q); a draft q gave no mass (round-off) is rejected
        ok = (u_accept_B_K * qd < pd) & (qd > 0)
        ok = torch.where(greedy.unsqueeze(1), d == arg_B_T[:, :K], ok)
        a_B = ok.long().cumprod(dim=1).sum(dim=1)
        p_sel = p[rows, a_B]
        resid = (p_sel - torch.cat([q, q.new_zeros(B, 1, V)], dim=1)[rows, a_B]).clamp(min=0)
        # all-accepted rows: q is 0 there, the residual is p. A rejection where p <= q everywhere
        # has probability 0; round-off can still get there, and then p is the right law.
        resid = torch.where(resid.sum(dim=-1, keepdim=True) > 0, resid, p_sel)
        final = torch.where(greedy, arg_B_T[rows, a_B], _inverse_cdf(resid, u_final_B))
    toks_B_T = torch.cat([d, d.new_zeros(B, 1)], dim=1)
    toks_B_T[rows, a_B] = final
    lps_B_T = logp.gather(2, toks_B_T.unsqueeze(2)).squeeze(2)
    a = a_B.tolist()
    toks, lps = toks_B_T.tolist(), lps_B_T.tolist()
    return Accepted(a, [t[:n + 1] for t, n in zip(toks, a, strict=True)],
                    [lp[:n + 1] for lp, n in zip(lps, a, strict=True)])


@dataclass
class _Arm:
    """Seconds one emitted token costs with a given draft length in one bucket: the mean over
    the current measuring window (warm-up, or a re-measurement, which replaces what was known),
    an EMA while the length is in use."""

    s_per_token: float = math.nan
    steps: int = 0
    window: int | None = 0

    def add(self, seconds: float, tokens: int, alpha: float) -> None:
        x = seconds / max(tokens, 1)
        if self.window is not None:
            self.window += 1
            self.s_per_token = x if self.window == 1 else self.s_per_token + (x - self.s_per_token) / self.window
        else:
            self.s_per_token = (1 - alpha) * self.s_per_token + alpha * x
        self.steps += 1


@dataclass
class _Bucket:
    arms: list[_Arm]
    """Index = draft length (0 = plain steps)."""
    best: int | None = None
    since_probe: int = 0
    probe: int = 0
    """The next draft length to re-measure (round robin over the others)."""


@dataclass
class SpecCounters:
    """What speculation did (summed over the engine's life)."""

    spec_steps: int = 0
    plain_steps: int = 0
    verified_rows: int = 0
    """Row-steps that verified a draft."""
    drafted_tokens: int = 0
    looked_up_tokens: int = 0
    """Drafted tokens that came from prompt lookup (the rest from heads, or filler)."""
    accepted_tokens: int = 0
    spec_emitted: int = 0
    """Tokens emitted by speculative steps (accepted drafts + one per verified row)."""
    switches: int = 0
    """Times ``auto`` changed the draft length it uses for a batch-size bucket."""


class SpecController:
    """How many tokens a step drafts per row, by batch-size bucket (1, 2-3, 4-7, 8-15, ...).

    ``on``: always all the heads' (k); ``off``: none. ``auto``: each draft length 0..k is
    measured (``warmup`` steps each), then the one with the lowest EMA cost per emitted token is
    used; every ``probe_every`` steps one other length is re-measured for ``probe_steps`` steps
    (round robin), since acceptance moves with the weights and cost with the context length.
    """

    def __init__(self, mode: str, max_draft: int, *, warmup: int = 3, probe_every: int = 32,
                 probe_steps: int = 3, alpha: float = 0.15) -> None:
        if mode not in MODES:
            raise ConfigError(f"engine speculative={mode!r}; choose one of {MODES}")
        if mode == "on" and max_draft < 1:
            raise ConfigError("engine speculative='on' needs MTP heads on the model or prompt "
                              "lookup: load a model dir with mtp_heads.safetensors "
                              "(looprl.models.mtp), set lookup=N (> 0), or use 'auto'/'off'")
        self.mode, self.max_draft = mode, max_draft
        self.warmup, self.probe_every, self.probe_steps, self.alpha = warmup, probe_every, probe_steps, alpha
        self.buckets: dict[int, _Bucket] = {}
        self.counters = SpecCounters()

    @staticmethod
    def bucket(batch: int) -> int:
        return batch.bit_length()

    def _bucket(self, batch: int) -> _Bucket:
        key = self.bucket(batch)
        if key not in self.buckets:
            self.buckets[key] = _Bucket([_Arm() for _ in range(self.max_draft + 1)])
        return self.buckets[key]

    def draft_len(self, batch: int) -> int:
        """Tokens to draft per row for a step of ``batch`` rows (0: a plain step)."""
        if self.mode == "off" or self.max_draft < 1:
            return 0
        if self.mode == "on":
            return self.max_draft
        b = self._bucket(batch)
        cold = [k for k, arm in enumerate(b.arms) if arm.steps < self.warmup]
        if cold:  # measure every length first, in turn
            return min(cold, key=lambda k: (b.arms[k].steps, k))
        best = min(range(len(b.arms)), key=lambda k: b.arms[k].s_per_token)
        if b.best is not None and best != b.best:
            self.counters.switches += 1
        b.best = best
        b.since_probe += 1
        if b.since_probe <= self.probe_every:
            for arm in b.arms:
                arm.window = None  # measuring windows are over: EMAs from here
            return best
        others = [k for k in range(len(b.arms)) if k != best]
        k = others[b.probe % len(others)]
        if b.since_probe == self.probe_every + 1:
            b.arms[k].window = 0  # a fresh measurement replaces the stale one
        if b.since_probe >= self.probe_every + self.probe_steps:
            b.since_probe = 0
            b.probe += 1
        return k

    def record(self, batch: int, draft_len: int, tokens: int, seconds: float, *, accepted: int = 0,
               verified: int | None = None, looked_up: int = 0) -> None:
        """A step of ``batch`` rows that drafted at most ``draft_len`` tokens per row (the arm;
        ``verified`` per row in fact, default ``draft_len``: 0 is a plain step, ``looked_up``
        of them from prompt lookup) emitted ``tokens`` (``accepted`` of them drafts) in
        ``seconds``."""
        c = self.counters
        self._bucket(batch).arms[draft_len].add(seconds, tokens, self.alpha)
        n = draft_len if verified is None else verified
        if n:
            c.spec_steps += 1
            c.verified_rows += batch
            c.drafted_tokens += batch * n
            c.looked_up_tokens += looked_up
            c.accepted_tokens += accepted
            c.spec_emitted += tokens
        else:
            c.plain_steps += 1

    def metrics(self) -> dict[str, float]:
        """Acceptance rate of drafted tokens, tokens per verify step (per row), the measured
        speed-up of the best draft length over plain steps (step-weighted over buckets where both
        ran; NaN if none), the share of steps that drafted, the share of drafted tokens that
        prompt lookup supplied, and ``auto``'s switches."""
        c = self.counters
        num = den = 0.0
        for b in self.buckets.values():
            spec = [a for a in b.arms[1:] if a.steps]
            if spec and b.arms[0].steps:
                w = sum(a.steps for a in b.arms)
                num += w * b.arms[0].s_per_token / min(a.s_per_token for a in spec)
                den += w
        total = c.spec_steps + c.plain_steps
        return {
            "spec/acceptance": c.accepted_tokens / c.drafted_tokens if c.drafted_tokens else math.nan,
            "spec/tokens_per_verify": c.spec_emitted / c.verified_rows if c.verified_rows else math.nan,
            "spec/speedup": num / den if den else math.nan,
            "spec/on_fraction": c.spec_steps / total if total else 0.0,
            "spec/looked_up_fraction": c.looked_up_tokens / c.drafted_tokens if c.drafted_tokens else math.nan,
            "spec/switches": float(c.switches),
        }
