import numpy as np
import pytest
import torch
import zstandard

from looprl.errors import ConfigError
from looprl.weights.delta import CODECS, bytes_to_tensor, decode, encode, tensor_bytes


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16, torch.int64, torch.uint8])
def test_delta_round_trip_is_bit_exact(codec, dtype):
    g = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        a = torch.randn(257, 3, generator=g).to(dtype)
        b = (a.float() + 1e-2 * torch.randn(257, 3, generator=g)).to(dtype)
        b.view(-1)[:3] = torch.tensor([float("inf"), float("nan"), -0.0], dtype=dtype)
    else:
        a = torch.randint(0, 200, (257, 3), generator=g).to(dtype)
        b = torch.randint(0, 200, (257, 3), generator=g).to(dtype)
    ra, rb = tensor_bytes(a), tensor_bytes(b)
    blob = encode(rb, ra, itemsize=a.element_size(), codec=codec)
    out = bytes_to_tensor(decode(blob, ra, itemsize=a.element_size(), codec=codec), dtype, tuple(b.shape))
    assert np.array_equal(tensor_bytes(out), rb)
    k = a.element_size()
    full = decode(encode(rb, None, itemsize=k), None, itemsize=k)
    assert np.array_equal(full, rb)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_small_update_compresses_far_below_a_full_copy(codec):
    w = torch.randn(200_000) * 0.02
    new = w + 1e-5 * torch.sign(torch.randn(200_000))  # an Adam-sized step
    a, b = tensor_bytes(w.to(torch.bfloat16)), tensor_bytes(new.to(torch.bfloat16))
    delta = encode(b, a, itemsize=2, codec=codec)
    assert len(delta) < 0.3 * b.size
    assert len(encode(a, a, itemsize=2, codec=codec)) < 0.01 * a.size  # no change: ~nothing


def test_grouping_by_exponent_shrinks_an_rl_sized_step():
    """At lr 1e-4 a step moves small weights by many bf16 ulps and large ones by few: grouped by
    the parent's exponent, the delta compresses smaller than in storage order."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(400_000, generator=g) * 0.02
    new = w + 1e-4 * torch.sign(torch.randn(400_000, generator=g))
    for dtype in (torch.bfloat16, torch.float32):
        a, b = tensor_bytes(w.to(dtype)), tensor_bytes(new.to(dtype))
        k = w.to(dtype).element_size()
        plain = len(encode(b, a, itemsize=k, codec="zigzag", level=1))
        grouped = len(encode(b, a, itemsize=k, codec="zigzag_sorted", level=1))
        assert grouped < 0.8 * plain, (dtype, grouped / plain)


def test_damaged_frame_and_unknown_codec_raise():
    a = tensor_bytes(torch.randn(1000))
    blob = bytearray(encode(a, None, itemsize=4))
    with pytest.raises(zstandard.ZstdError):
        decode(bytes(blob[: len(blob) // 2]), None, itemsize=4)
    with pytest.raises(ConfigError, match="xor"):
        encode(a, a, itemsize=4, codec="lz4")
