"""Temperature / top-p sampling whose logprob is that of the sampled token under exactly the
distribution it was drawn from (temperature-scaled, top-p truncated and renormalised).

Temperature 0 is greedy; its distribution is a point mass, so the logprob reported for a greedy
token is the model's untempered log-probability (useful for training, unlike a constant 0).

    tokens_B, logprobs_B = sample_B(logits_B_V, temps_B, top_ps_B, generators_B, default_gen)
"""

from __future__ import annotations

import torch


def sampling_logprobs_B_V(logits_B_V: torch.Tensor, temps_B: torch.Tensor,
                          top_ps_B: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the distribution actually sampled (-inf outside the nucleus)."""
    t = torch.where(temps_B > 0, temps_B, torch.ones_like(temps_B)).unsqueeze(1)
    logp = torch.log_softmax(logits_B_V.float() / t, dim=-1)
    if bool((top_ps_B < 1.0).any()):
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(dim=-1)
        # keep a token if the mass before it is below top_p (the top token is always kept)
        drop_sorted = (cum - sorted_lp.exp()) >= top_ps_B.unsqueeze(1)
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
        logp = logp - torch.logsumexp(logp, dim=-1, keepdim=True)
    return logp


def sample_B(logits_B_V: torch.Tensor, temps_B: list[float], top_ps_B: list[float],
             generators_B: list[torch.Generator | None],
             default_gen: torch.Generator) -> tuple[list[int], list[float]]:
    """Sample one token per row; returns the tokens and their logprobs (see module docstring).

    The generators are CPU ones whatever the logits' device: a seed draws the same uniforms
    everywhere, and only those B numbers cross to the device."""
    dev = logits_B_V.device
    temps = torch.tensor(temps_B, dtype=torch.float32, device=dev)
    top_ps = torch.tensor(top_ps_B, dtype=torch.float32, device=dev)
    logp_B_V = sampling_logprobs_B_V(logits_B_V, temps, top_ps)
    # inverse-CDF sampling with one uniform per row, so each request's seed is honoured in a batch
    u_B = torch.cat([torch.rand(1, generator=g or default_gen) for g in generators_B]).to(dev)
    cdf_B_V = logp_B_V.exp().cumsum(dim=-1)
    sampled = torch.searchsorted(cdf_B_V, (u_B * cdf_B_V[:, -1]).unsqueeze(1)).squeeze(1)
    sampled = sampled.clamp(max=logits_B_V.shape[1] - 1)
    # never land on a zero-probability token through float round-off at the cdf's edge
    bad = torch.gather(logp_B_V, 1, sampled.unsqueeze(1)).squeeze(1) == float("-inf")
    if bool(bad.any()):
        sampled = torch.where(bad, logp_B_V.argmax(dim=-1), sampled)
    greedy = temps <= 0
    tokens = torch.where(greedy, logits_B_V.argmax(dim=-1), sampled)
    lp = torch.gather(logp_B_V, 1, tokens.unsqueeze(1)).squeeze(1)
    return tokens.tolist(), lp.tolist()
