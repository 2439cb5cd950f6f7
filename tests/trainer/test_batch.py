import pytest
import torch

from looprl.trainer.batch import build_batch
from looprl.types import StopReason

from .helpers import group, segment, trajectory


def test_rows_tensors_and_chain_segments_share_the_advantage():
    chain = [segment([1, 2], [3, 4], -0.5, version=3), segment([5], [6, 7, 8], -0.25, version=4)]
    g = group([trajectory(chain, 1.0), trajectory([segment([1, 2], [9], -1.0)], 0.0)])
    b = build_batch([g], std_norm="never", micro_batch_tokens=1000)
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
    kept = build_batch([g1, g2], skip_zero_variance=False)
    assert kept.num_sequences == 4 and kept.zero_variance_groups == 1


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
