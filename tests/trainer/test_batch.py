import dataclasses

import pytest
import torch

from looprl.trainer.batch import Credit, build_batch
from looprl.types import StopReason, TokenSpan

from .helpers import group, segment, trajectory


def test_rows_tensors_and_chain_segments_share_the_advantage():
    chain = [segment([1, 2], [3, 4], -0.5, version=3), segment([5], [6, 7, 8], -0.25, version=4)]
    g = group([trajectory(chain, 1.0), trajectory([segment([1, 2], [9], -1.0)], 0.0)])
    b = build_batch([g], micro_batch_tokens=1000)
    assert b.num_sequences == 3 and len(b.micro_batches) == 1
    mb = b.micro_batches[0]
    rows = {tuple(r[: int(a.sum())].tolist()): i
            for i, (r, a) in enumerate(zip(mb.tokens_B_T, mb.attention_mask_B_T, strict=True))}
    i, j, k = rows[(1, 2, 3, 4)], rows[(5, 6, 7, 8)], rows[(1, 2, 9)]
    assert mb.advantages_B[i] == mb.advantages_B[j] == pytest.approx(0.5)
    assert mb.advantages_B[k] == pytest.approx(-0.5)
    assert mb.loss_mask_B_T[i].tolist() == [0, 0, 1, 1]
    assert mb.old_logprobs_B_T[j].tolist() == [0.0, -0.25, -0.25, -0.25]
    assert mb.policy_version_B_T[j].tolist() == [-1, 4, 4, 4]
    # the shorter row is padded: attention, mask 0, version -1 on padding
    assert mb.attention_mask_B_T[k].tolist() == [1, 1, 1, 0]
    assert mb.loss_mask_B_T[k].tolist() == [0, 0, 1, 0] and mb.policy_version_B_T[k, 3] == -1
    assert b.num_model_tokens == 2 + 3 + 1


def test_infra_errors_dropped_before_advantages_and_zero_variance_counted():
    g1 = group([trajectory([segment([1], [2])], 1.0), trajectory([segment([1], [3])], 0.0),
                trajectory([segment([1], [4])], None, stop=StopReason.INFRA_ERROR)], "g1")
    g2 = group([trajectory([segment([1], [5])], 1.0), trajectory([segment([1], [6])], 1.0)], "g2")
    b = build_batch([g1, g2])
    assert b.dropped_infra == 1 and b.zero_variance_groups == 1 and b.groups == 2
    assert b.num_sequences == 2  # the zero-variance group is skipped
    adv = sorted(float(a) for mb in b.micro_batches for a in mb.advantages_B)
    assert adv == [-0.5, 0.5]  # the infra error did not pull the mean down
    kept = build_batch([g1, g2], Credit(skip_zero_variance=False))
    assert kept.num_sequences == 4 and kept.zero_variance_groups == 1


def test_groups_without_a_pass_are_counted_and_skipped_only_when_asked():
    # g1: one pass; g2: two failures that differ only by shaping (-0.2 vs -0.8): no pass
    g1 = group([trajectory([segment([1], [2])], 1.0), trajectory([segment([1], [3])], 0.0)], "g1")
    g2 = group([trajectory([segment([1], [5])], -0.2), trajectory([segment([1], [6])], -0.8)], "g2")
    kept = build_batch([g1, g2])
    assert kept.no_pass_groups == 1 and kept.num_sequences == 4
    b = build_batch([g1, g2], Credit(skip_without_pass=True))
    assert b.no_pass_groups == 1 and b.num_sequences == 2 and b.zero_variance_groups == 0
    assert sorted(float(a) for mb in b.micro_batches for a in mb.advantages_B) == [-0.5, 0.5]


def _advantages(b):
    """A batch's advantages, one per row, sorted."""
    return sorted(round(float(a), 6) for mb in b.micro_batches for a in mb.advantages_B)


def test_flat_failures_give_a_groups_failures_one_reward():
    # one pass (1.0) and two failures that differ only by shaping: quitting (-0.2), trying (-0.8)
    g1 = group([trajectory([segment([1], [2])], 1.0), trajectory([segment([1], [3])], -0.2),
                trajectory([segment([1], [4])], -0.8)], "g1")
    g2 = group([trajectory([segment([1], [5])], -0.2), trajectory([segment([1], [6])], -0.8)], "g2")

    assert _advantages(build_batch([g1])) == [-0.8, -0.2, 1.0]  # quitting beats trying
    flat = build_batch([g1, g2], Credit(flat_failures=True))
    assert _advantages(flat) == [-0.5, -0.5, 1.0]
    # the all-fail group has no signal left; the logged mean reward is the real one
    assert flat.zero_variance_groups == 1 and flat.num_sequences == 3
    assert flat.mean_reward == pytest.approx((1.0 - 0.2 - 0.8 - 0.2 - 0.8) / 5)


def test_negative_scale_shrinks_only_negative_advantages():
    from looprl.errors import ConfigError
    from looprl.trainer.step import GRPOConfig

    g = group([trajectory([segment([1], [2])], 1.0), trajectory([segment([1], [3])], -0.2),
               trajectory([segment([1], [4])], -0.8)], "g")

    assert _advantages(build_batch([g], Credit(negative_scale=0.5))) == [-0.4, -0.1, 1.0]
    assert _advantages(build_batch([g], Credit(negative_scale=0.0))) == [0.0, 0.0, 1.0]
    with pytest.raises(ConfigError, match="negative_advantage_scale"):
        GRPOConfig(negative_advantage_scale=1.5)


def test_balanced_negatives_push_down_no_more_token_mass_than_passes_push_up():
    # one short pass (2 model tokens), three long failures (8 each): 0.75*2 up vs 0.25*24 down
    g = group([trajectory([segment([1], [2, 2])], 1.0)]
              + [trajectory([segment([1], [3] * 8)], 0.0) for _ in range(3)])
    plain = build_batch([g])
    balanced = build_batch([g], Credit(balance_negatives=True))
    assert _advantages(plain) == [-0.25, -0.25, -0.25, 0.75]
    assert _advantages(balanced) == [-0.0625, -0.0625, -0.0625, 0.75]

    def mass(b):  # sum of advantage x model tokens over the batch
        return sum(float((mb.advantages_B_T * mb.loss_mask_B_T).sum()) for mb in b.micro_batches)

    assert mass(plain) == pytest.approx(1.5 - 6.0) and mass(balanced) == pytest.approx(0.0)


def test_a_broken_call_is_pushed_down_even_inside_a_passing_trajectory():
    # pass: prompt [1], a broken call [7, 7] (tokens 1-2), then a good call [2, 2] (tokens 3-4)
    passed = dataclasses.replace(trajectory([segment([1], [7, 7, 2, 2])], 1.0),
                                 broken_spans=(TokenSpan(0, 1, 3),))
    g = group([passed, trajectory([segment([1], [3, 3])], 0.0)])
    row = {int(mb.tokens_B_T[b, 1]): mb.advantages_B_T[b].tolist()
           for mb in build_batch([g], Credit(broken_call_advantage=-0.3)).micro_batches
           for b in range(mb.num_rows)}
    assert row[7] == pytest.approx([0.5, -0.3, -0.3, 0.5, 0.5])
    assert row[3] == pytest.approx([-0.5, -0.5, -0.5, 0.0, 0.0])  # padding: 0
    plain = {int(mb.tokens_B_T[b, 1]): mb.advantages_B_T[b].tolist()
             for mb in build_batch([g]).micro_batches for b in range(mb.num_rows)}
    assert plain[7] == pytest.approx([0.5] * 5)  # without token-level credit: the trajectory's


def test_micro_batches_respect_the_token_budget_and_pack_by_length():
    lengths = [30, 5, 28, 6, 29, 4, 7, 31]
    g = group([trajectory([segment([1], [2] * (n - 1))], float(i)) for i, n in enumerate(lengths)])
    b = build_batch([g], micro_batch_tokens=64)
    for mb in b.micro_batches:
        assert mb.tokens_B_T.numel() <= 64
    assert sum(mb.num_rows for mb in b.micro_batches) == len(lengths)
    # sorting by length: the long rows travel together, the short rows together
    assert b.padded_tokens <= 31 * 2 + 29 * 2 + 7 * 4
    assert b.padded_tokens <= 1.1 * b.num_tokens  # padding everything to 31 would waste 44%


def test_a_row_longer_than_the_budget_gets_its_own_micro_batch():
    g = group([trajectory([segment([1], [2] * 99)], 1.0), trajectory([segment([1], [3])], 0.0)])
    b = build_batch([g], micro_batch_tokens=16)
    assert [mb.tokens_B_T.shape for mb in b.micro_batches] == [torch.Size([1, 100]), torch.Size([1, 2])]


def test_a_groups_rows_share_a_micro_batch_and_their_prompt_counts_once():
    """Two groups, long prompts, short completions: each group's rows pack into one micro-batch
    (its prompt runs once: prompt + rows x completion fits the budget), where packing by padded
    size would split them into micro-batches of two rows, each re-running the prompt."""
    prompts = {"a": list(range(10, 210)), "b": list(range(300, 500))}  # 200 tokens each
    groups = [group([trajectory([segment(prompts[k], [7 + i] * (10 + i))], float(i))
                     for i in range(8)], k) for k in prompts]
    b = build_batch(groups, micro_batch_tokens=450)
    assert len(b.micro_batches) == 2
    for mb in b.micro_batches:
        assert mb.num_rows == 8
        first = mb.tokens_B_T[:, :200]
        assert (first == first[:1]).all()  # one group per micro-batch
    plain = build_batch(groups, micro_batch_tokens=450, share_prefix=False)
    assert len(plain.micro_batches) == 8  # 2 rows of ~217 padded tokens each
    assert all(mb.tokens_B_T.numel() <= 450 for mb in plain.micro_batches)


def test_a_prefix_below_the_sharing_threshold_counts_in_full():
    from looprl.trainer.batch import MIN_SHARED_PREFIX
    for extra, rows_per_mb in ((-1, [2, 2]), (0, [4])):  # one short of being shared; shared
        prompt = list(range(10, 10 + MIN_SHARED_PREFIX + extra))
        g = group([trajectory([segment(prompt, [5 + i] * 4)], float(i)) for i in range(4)])
        b = build_batch([g], micro_batch_tokens=2 * (len(prompt) + 4))
        assert [mb.num_rows for mb in b.micro_batches] == rows_per_mb


def test_repeated_rows_cost_nothing_and_join_their_groups_micro_batch():
    """Four identical passes and four different failures of one group: the repeats cost one
    row (``token_logprobs`` runs them once), so the group still fits one micro-batch of the
    budget its distinct rows need."""
    prompt = list(range(10, 210))
    rows = [trajectory([segment(prompt, [7] * 10)], 1.0) for _ in range(4)]
    rows += [trajectory([segment(prompt, [20 + i] * 10)], 0.0) for i in range(4)]
    b = build_batch([group(rows)], micro_batch_tokens=200 + 5 * 10)
    assert [mb.num_rows for mb in b.micro_batches] == [8]
    # one distinct row short of the budget: the group splits
    assert len(build_batch([group(rows)], micro_batch_tokens=200 + 4 * 10).micro_batches) == 2
