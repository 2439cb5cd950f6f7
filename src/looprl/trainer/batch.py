"""Groups -> TrainBatch: credit every model token with an advantage, then pack trajectories'
segments into padded micro-batches of tensors.

    batch = build_batch(groups, Credit(), std_norm="never", micro_batch_tokens=4096)
    for mb in batch.micro_batches: ...   # mb.tokens_B_T, mb.loss_mask_B_T, mb.advantages_B_T, ...

One row per segment. Every segment of a trajectory (a self-summarization chain has several) gets
the trajectory's advantage (``std_norm`` and ``Credit`` say how it is made from the group's
rewards); with ``Credit.broken_call_advantage`` the tokens of a broken tool call's own block get
that instead, whatever the trajectory's outcome (token-level credit: the broken call, not the
trajectory, is what was wrong; the valid calls and text around it keep the trajectory's
advantage). Infra-error trajectories (and ones without a reward) are dropped
before advantages are computed — they are never scored as the model's fault. A group whose
remaining rewards are all equal has no signal: it is counted, and skipped when
``skip_zero_variance`` (the default).

A group whose ``metadata["baseline"]`` is a number takes its advantages against it,
``A_i = r_i - baseline``, instead of against the group's mean: production traffic has one sample
of most prompts, so its baseline is a value estimate made outside the group
(``feedback.window.window_groups``). Such a group may hold a single trajectory.

Rows are packed so that each micro-batch's cost stays within ``micro_batch_tokens``. The cost
counts what the forward runs (``step.token_logprobs``): a row that repeats another runs once
(a group's passing rollouts are often identical), and rows that share a prefix of
``MIN_SHARED_PREFIX``+ tokens (a group's prompt) run it once, so a micro-batch costs prefix +
distinct rows x (longest row - prefix); without a shared prefix (or with ``share_prefix=False``,
e.g. under DDP) rows x longest row. Prefix-sharing rows train together (a group's prompt runs once,
not once per micro-batch of two rows); the others are packed by length, longest first. A row
longer than the budget gets a micro-batch of its own.

``drop_silent``: a row whose advantage is 0 at every token (a failure whose negative advantage
``negative_advantage_scale = 0`` zeroed) adds nothing to the policy gradient, yet its forward
and backward cost as much as any row's, and failures are the long rows. Such rows are left out
and counted (``TrainBatch.silent_rows``); the loss still divides by every row of the step
(``TrainBatch.num_sequences``), so the gradient is the one the full batch gives. Only where
nothing else reads a row: no KL term (it makes every row's advantage nonzero) and no MTP heads
distilled from the forward (``GRPOStep.batch`` decides).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from looprl.trainer.advantages import group_advantages, is_zero_variance
from looprl.trainer.config import Credit
from looprl.types import Group, Segment, Trajectory


@dataclass(frozen=True)
class MicroBatch:
    """Padded rows (padding: token ``pad_id``, mask 0, attention 0, version -1, advantage 0)."""

    tokens_B_T: torch.Tensor  # long
    attention_mask_B_T: torch.Tensor  # long, 1 on real tokens
    loss_mask_B_T: torch.Tensor  # float, 1 on model-sampled tokens
    old_logprobs_B_T: torch.Tensor  # float, the sampling engine's logprobs
    policy_version_B_T: torch.Tensor  # long, -1 on non-model tokens
    advantages_B: torch.Tensor  # float, the row's trajectory's advantage
    advantages_B_T: torch.Tensor  # float, each token's (the row's, unless token-level credit)
    routes_B_T_L_K: torch.Tensor | None = None
    """uint8, MoE models: the engine's experts per token (``Segment.routes``; 255 = none)."""

    @property
    def num_rows(self) -> int:
        return int(self.tokens_B_T.shape[0])

    def to(self, device: torch.device) -> MicroBatch:
        """The same rows on ``device`` (the model's: batches are built on the CPU)."""
        if self.tokens_B_T.device == device:
            return self
        return dataclasses.replace(self, **{
            f.name: t.to(device) for f in dataclasses.fields(self)
            if (t := getattr(self, f.name)) is not None})


@dataclass(frozen=True)
class TrainBatch:
    """What one optimizer step consumes, plus the bookkeeping of what was left out."""

    micro_batches: tuple[MicroBatch, ...]
    num_sequences: int
    num_tokens: int
    """Real (unpadded) tokens over all rows."""
    num_model_tokens: int
    groups: int
    zero_variance_groups: int
    """Groups whose rewards were all equal (skipped when ``skip_zero_variance``)."""
    dropped_infra: int
    """Trajectories dropped for an infra error or a missing reward."""
    padded_tokens: int
    """rows x longest row, summed over micro-batches (padding waste = 1 - num_tokens / this)."""
    mean_reward: float
    """Mean reward over kept-or-skipped valid trajectories (for logging)."""
    no_pass_groups: int = 0
    """Groups where no trajectory passed the tests (skipped when ``skip_without_pass``)."""
    silent_rows: int = 0
    """Rows with advantage 0 at every token left out (``drop_silent``); counted in
    ``num_sequences``, which the loss divides by."""

    @property
    def empty(self) -> bool:
        return not self.micro_batches


@dataclass(frozen=True)
class _Row:
    segment: Segment
    advantage: float
    token_advantages: tuple[float, ...] | None = None
    """Per token of ``segment`` when they differ from ``advantage`` (token-level credit)."""


def flatten_failures(rewards_G: Sequence[float], passed_G: Sequence[bool]) -> list[float]:
    """``rewards_G`` with every failed trajectory's reward replaced by the mean over the failed
    ones: the shaping terms (length, broken calls, giving up) then rank passing trajectories
    only, and a cheap failure (quitting) gains nothing over a costly one inside a group.

    >>> flatten_failures([1.0, -0.2, -0.8], [True, False, False])
    [1.0, -0.5, -0.5]
    """
    fails = [r for r, ok in zip(rewards_G, passed_G, strict=True) if not ok]
    if not fails:
        return list(rewards_G)
    m = sum(fails) / len(fails)
    return [r if ok else m for r, ok in zip(rewards_G, passed_G, strict=True)]


def scale_negatives(advantages_G: Sequence[float], scale: float) -> list[float]:
    """Negative advantages times ``scale`` (``Credit.negative_advantage_scale``).

    >>> scale_negatives([0.875, -0.125, -0.125], 0.5)
    [0.875, -0.0625, -0.0625]
    """
    return [a * scale if a < 0 else a for a in advantages_G]


def balance_negatives(advantages_G: Sequence[float], tokens_G: Sequence[int]) -> list[float]:
    """Negative advantages scaled down (never up) so that the group's negative token mass,
    sum |A| x model tokens, is at most its positive mass. With no length normalisation a
    failure pushes down every one of its tokens; failures are many and long (flailing to the
    turn limit) and passes short, so tokens both share (the call format) would be pushed down
    on net. Balanced, a token as common in passes as in failures gets no net push; the tokens
    that set failures apart still do.

    >>> balance_negatives([0.75, -0.25, -0.25, -0.25], [10, 40, 40, 40])  # 7.5 up vs 30 down
    [0.75, -0.0625, -0.0625, -0.0625]
    >>> balance_negatives([0.5, -0.5], [100, 10])  # failures already push less: unchanged
    [0.5, -0.5]
    """
    pos = sum(a * n for a, n in zip(advantages_G, tokens_G, strict=True) if a > 0)
    neg = sum(-a * n for a, n in zip(advantages_G, tokens_G, strict=True) if a < 0)
    if neg <= pos or neg == 0:
        return list(advantages_G)
    return [a * pos / neg if a < 0 else a for a in advantages_G]


def _trajectory_rows(t: Trajectory, advantage: float, credit: Credit) -> list[_Row]:
    spans = t.broken_spans if credit.broken_call_advantage is not None else ()
    rows = []
    for i, seg in enumerate(t.segments):
        if seg.num_model_tokens == 0:
            continue
        mine = [(a, b) for s, a, b in spans if s == i]
        if not mine:
            rows.append(_Row(seg, advantage))
            continue
        adv_T = [advantage] * len(seg.token_ids_T)
        for a, b in mine:
            adv_T[a:b] = [float(credit.broken_call_advantage)] * (b - a)  # type: ignore[arg-type]
        rows.append(_Row(seg, advantage, tuple(adv_T)))
    return rows


def _rows(groups: Sequence[Group], credit: Credit, std_norm: str = "never"
          ) -> tuple[list[_Row], int, int, list[float], int]:
    rows: list[_Row] = []
    zero_var = dropped = no_pass = 0
    rewards: list[float] = []
    for g in groups:
        valid = [t for t in g.trajectories if not t.is_infra_error and t.reward is not None]
        dropped += len(g.trajectories) - len(valid)
        rewards_G = [t.reward.total for t in valid if t.reward is not None]
        rewards.extend(rewards_G)
        passed_G = [t.passed for t in valid]
        if not any(passed_G):
            no_pass += 1
            if credit.skip_groups_without_pass:
                continue
        if credit.flat_failures:
            rewards_G = flatten_failures(rewards_G, passed_G)
        baseline = g.metadata.get("baseline")
        if baseline is None:
            silent = is_zero_variance(rewards_G) or len(valid) < 2
        else:
            silent = not valid or is_zero_variance([*rewards_G, float(baseline)])
        if silent:
            zero_var += 1
            if credit.skip_zero_variance:
                continue
        advantages_G = scale_negatives(
            group_advantages(rewards_G, std_norm) if baseline is None
            else [r - float(baseline) for r in rewards_G], credit.negative_advantage_scale)
        if credit.balance_negatives:
            advantages_G = balance_negatives(
                advantages_G, [sum(s.num_model_tokens for s in t.segments) for t in valid])
        for traj, adv in zip(valid, advantages_G, strict=True):
            rows.extend(_trajectory_rows(traj, adv, credit))
    return rows, zero_var, dropped, rewards, no_pass


MIN_SHARED_PREFIX = 64
"""Rows sharing at least this many leading tokens run the prefix once (``token_logprobs``)."""


def distinct_rows(tokens_B_T: torch.Tensor, attention_mask_B_T: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep_U, of_B)``: the first row of each distinct row (same real tokens, same length), in
    row order, and for every row the index in ``keep_U`` of the row it repeats (itself if none).
    The rows of ``keep_U`` are the only ones a forward needs: a group's passing rollouts are
    often token for token the same.

    >>> t = torch.tensor([[5, 6], [7, 8], [5, 6], [5, 0]]); m = torch.tensor([[1, 1]] * 3 + [[1, 0]])
    >>> [x.tolist() for x in distinct_rows(t, m)]
    [[0, 1, 3], [0, 1, 0, 2]]
    """
    B = tokens_B_T.shape[0]
    if B < 2:
        every = torch.arange(B, device=tokens_B_T.device)
        return every, every
    key = torch.where(attention_mask_B_T == 1, tokens_B_T, -1)
    _, which_B = torch.unique(key, dim=0, return_inverse=True)
    first_U = torch.full((int(which_B.max()) + 1,), B, dtype=torch.long, device=key.device
                         ).scatter_reduce(0, which_B, torch.arange(B, device=key.device), "amin")
    order_U = first_U.argsort()
    rank_U = torch.empty_like(order_U)
    rank_U[order_U] = torch.arange(len(order_U), device=key.device)
    return first_U[order_U], rank_U[which_B]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _cost(rows: int, longest: int, prefix: int) -> int:
    """Tokens one forward of ``rows`` distinct rows runs: the shared prefix once when
    ``token_logprobs`` would share it."""
    if rows < 2 or prefix < MIN_SHARED_PREFIX or prefix >= longest - 1:
        return rows * longest
    return prefix + rows * (longest - prefix)


def _pack_by_length(idx: list[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Rows (no shared prefix) grouped so rows x longest <= budget: longest first, greedy."""
    order = sorted(idx, key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    for i in order:
        if bins and (len(bins[-1]) + 1) * lengths[bins[-1][0]] <= budget:
            bins[-1].append(i)
        else:
            bins.append([i])
    return bins


def _pack(seqs: Sequence[Sequence[int]], budget: int, share_prefix: bool = True) -> list[list[int]]:
    """Row indices grouped so each group's ``_cost`` <= budget.

    In lexicographic order rows that share a prefix are neighbours (a group's rows, then the
    groups that share only the system prompt), and a row that repeats another (a group's
    identical passes) comes next to it and costs nothing (``token_logprobs`` runs it once).
    Runs of neighbours join while a row adds less than it would cost alone and the run stays
    within budget; the rows left alone are packed by length (``_pack_by_length``)."""
    lengths = [len(q) for q in seqs]
    if not share_prefix:
        return _pack_by_length(list(range(len(seqs))), lengths, budget)
    order = sorted(range(len(seqs)), key=lambda i: tuple(seqs[i]))
    runs: list[list[int]] = []
    prefix = longest = distinct = 0
    for k, i in enumerate(order):
        if runs:
            common = _common_prefix(seqs[order[k - 1]], seqs[i])
            p = min(prefix, common)
            n = distinct + (not common == lengths[i] == lengths[order[k - 1]])  # a repeat: free
            top = max(longest, lengths[i])
            cost = _cost(n, top, p)
            if cost <= budget and cost - _cost(distinct, longest, prefix) < lengths[i]:
                runs[-1].append(i)
                prefix, longest, distinct = p, top, n
                continue
        runs.append([i])
        prefix = longest = lengths[i]
        distinct = 1
    shared = [r for r in runs if len(r) > 1]
    alone = [r[0] for r in runs if len(r) == 1]
    return shared + _pack_by_length(alone, lengths, budget)


def _collate(rows: list[_Row], pad_id: int) -> MicroBatch:
    B, T = len(rows), max(len(r.segment.token_ids_T) for r in rows)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    old = torch.zeros((B, T), dtype=torch.float32)
    ver = torch.full((B, T), -1, dtype=torch.long)
    adv_T = torch.zeros((B, T), dtype=torch.float32)
    for b, r in enumerate(rows):
        s, n = r.segment, len(r.segment.token_ids_T)
        tokens[b, :n] = torch.tensor(s.token_ids_T, dtype=torch.long)
        attn[b, :n] = 1
        mask[b, :n] = torch.tensor(s.loss_mask_T, dtype=torch.float32)
        old[b, :n] = torch.tensor(s.logprobs_T, dtype=torch.float32)
        ver[b, :n] = torch.tensor(s.policy_version_T, dtype=torch.long)
        adv_T[b, :n] = torch.tensor(r.token_advantages) if r.token_advantages else r.advantage
    # The first token has no prediction (nothing before it): never trained on.
    mask[:, 0] = 0.0
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    return MicroBatch(tokens, attn, mask, old, ver, adv, adv_T, _collate_routes(rows, T))


def _collate_routes(rows: list[_Row], T: int) -> torch.Tensor | None:
    """[B, T, L, K] uint8 of the rows' recorded routes (255 where none), None if no row has any."""
    shapes = {(r.segment.routes.layers, r.segment.routes.top_k) for r in rows if r.segment.routes}
    if len(shapes) != 1:
        return None
    L, K = shapes.pop()
    out = torch.full((len(rows), T, L, K), 255, dtype=torch.uint8)
    for b, r in enumerate(rows):
        if r.segment.routes is not None:
            a = r.segment.routes.array()
            out[b, :len(a)] = torch.from_numpy(a.copy())
    return out


def _pack_rows(rows: Sequence[_Row], micro_batch_tokens: int, pad_id: int,
               share_prefix: bool) -> tuple[MicroBatch, ...]:
    bins = _pack([r.segment.token_ids_T for r in rows], micro_batch_tokens, share_prefix)
    return tuple(_collate([rows[i] for i in b], pad_id) for b in bins)


def pack_segments(segments: Sequence[Segment], advantages_N: Sequence[float], *,
                  micro_batch_tokens: int = 4096, pad_id: int = 0,
                  share_prefix: bool = True) -> tuple[MicroBatch, ...]:
    """Segments (one row each, every token with its row's advantage) packed into micro-batches
    (used by SFT and tests); see the module docstring for the cost. ``share_prefix=False``: the
    forward will not share prefixes (DDP)."""
    return _pack_rows([_Row(s, a) for s, a in zip(segments, advantages_N, strict=True)],
                      micro_batch_tokens, pad_id, share_prefix)


def _silent(r: _Row) -> bool:
    return r.advantage == 0.0 and not any(r.token_advantages or ())


def build_batch(groups: Sequence[Group], credit: Credit = Credit(), *, std_norm: str = "never",
                micro_batch_tokens: int = 4096, pad_id: int = 0,
                share_prefix: bool = True, drop_silent: bool = False) -> TrainBatch:
    """Credit ``groups``' tokens (advantages by ``std_norm``, reshaped as ``credit`` says) and
    pack them into micro-batches of at most ``micro_batch_tokens`` tokens of forward (a shared
    prefix counted once), leaving out the rows with advantage 0 everywhere when
    ``drop_silent`` (module docstring)."""
    rows, zero_var, dropped, rewards, no_pass = _rows(groups, credit, std_norm)
    n_rows = len(rows)
    if drop_silent:
        rows = [r for r in rows if not _silent(r)]
    mbs = _pack_rows(rows, micro_batch_tokens, pad_id, share_prefix)
    return TrainBatch(
        micro_batches=mbs,
        num_sequences=n_rows,
        num_tokens=sum(len(r.segment.token_ids_T) for r in rows),
        num_model_tokens=int(sum(float(mb.loss_mask_B_T.sum()) for mb in mbs)),
        groups=len(groups),
        zero_variance_groups=zero_var,
        dropped_infra=dropped,
        padded_tokens=sum(mb.tokens_B_T.numel() for mb in mbs),
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        no_pass_groups=no_pass,
        silent_rows=n_rows - len(rows),
    )
