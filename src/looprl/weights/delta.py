"""Bit-exact tensor deltas: raw bits of a new version against its parent, byte-shuffled, zstd.

    raw = tensor_bytes(t)                                   # uint8 view of the tensor's bits
    blob = encode(raw, parent_raw, itemsize=2, codec="xor") # compressed delta (parent None: full)
    assert (decode(blob, parent_raw, itemsize=2, codec="xor") == raw).all()

Codecs (``CODECS``, picked by name; ``benchmarks/weights.py`` measures each):

- ``xor``: new bits XOR parent bits. A small optimizer step leaves sign, exponent and the top of
  the mantissa unchanged, so the high byte of most elements XORs to 0.
- ``sub``: new bits minus parent bits as unsigned integers (mod 2^bits): a numeric diff of the
  bit patterns, exact like XOR; small moves of nearby values give small integers.
- ``zigzag``: the same difference read as a signed integer and zigzag-mapped (0, -1, 1, -2 ->
  0, 1, 2, 3), so the common one-ulp moves either way become small bytes and the high byte
  plane is all zeros.
- ``zigzag_sorted``: zigzag with the elements grouped by the parent's exponent (the reader has
  the parent, so the order costs no bytes). At RL's learning rates a step moves small weights by
  many ulps and large ones by few; grouped, zstd's per-block tables fit each group. Measured
  smallest on bf16 at lr 1e-4, at the cost of a sort (``benchmarks/weights.py``).

Before zstd the bytes are shuffled into planes (all first bytes, then all second bytes, ...), so
the runs of zero high bytes become long and compress to almost nothing. All codecs are
lossless: a reader reproduces the published bits exactly (checked by sha256 in the manifest).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import zstandard

from looprl.errors import ConfigError

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's raw bits as a flat uint8 array (a copy, CPU, contiguous)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().copy()


def bytes_to_tensor(raw: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of ``tensor_bytes``."""
    return torch.from_numpy(raw.copy()).view(dtype).reshape(shape)


def shuffle(raw: np.ndarray, itemsize: int) -> np.ndarray:
    """Bytes grouped by position within the element (plane 0 of all elements, then plane 1...)."""
    return raw.reshape(-1, itemsize).T.reshape(-1) if itemsize > 1 else raw


def unshuffle(planes: np.ndarray, itemsize: int) -> np.ndarray:
    return planes.reshape(itemsize, -1).T.reshape(-1) if itemsize > 1 else planes


def _xor(new: np.ndarray, parent: np.ndarray, itemsize: int) -> np.ndarray:
    return np.bitwise_xor(new, parent)


def _xor_inv(delta: np.ndarray, parent: np.ndarray, itemsize: int) -> np.ndarray:
    return np.bitwise_xor(delta, parent)


def _sub(new: np.ndarray, parent: np.ndarray, itemsize: int) -> np.ndarray:
    u = _UINT[itemsize]
    return (new.view(u) - parent.view(u)).view(np.uint8)  # wraps mod 2^bits


def _sub_inv(delta: np.ndarray, parent: np.ndarray, itemsize: int) -> np.ndarray:
    u = _UINT[itemsize]
    return (parent.view(u) + delta.view(u)).view(np.uint8)


Codec = tuple[Callable[[np.ndarray, np.ndarray, int], np.ndarray],
              Callable[[np.ndarray, np.ndarray, int], np.ndarray]]
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def _zigzag(new: np.ndarray, parent: np.ndarray, itemsize: int) -> np.ndarray:
    d = _sub(new, parent, itemsize).view(_INT[itemsize])
    shift = _INT[itemsize](8 * itemsize - 1)
    return ((d << _INT[itemsize](1)) ^ (d >> shift)).view(np.uint8)  # -1 -> 1, 1 -> 2, -2 -> 3...


def _zigzag_inv(delta: np.ndarray, parent: np.ndarray, itemsize: int) -> np.ndarray:
    z = delta.view(_UINT[itemsize])
    d = (z >> _UINT[itemsize](1)) ^ (-(z & _UINT[itemsize](1)))  # unsigned negate wraps: 0 or all ones
    return _sub_inv(d.view(np.uint8), parent, itemsize)


def _by_exponent(parent: np.ndarray, itemsize: int) -> np.ndarray | None:
    """A stable order of the elements grouping them by their parent's exponent (None: keep the
    order, for non-float widths). An optimizer step moves a weight by about the same amount
    whatever its size, so the ulps it moves depend on its exponent: grouped, each zstd block sees
    one exponent's typical moves and codes them with tables of their own."""
    if itemsize == 2:  # bf16: exponent bits 7..14 (fp16: its exponent and top mantissa bits)
        key = (parent.view(np.uint16) >> np.uint16(7)).astype(np.uint8)
    elif itemsize == 4:  # fp32: exponent bits 23..30
        key = (parent.view(np.uint32) >> np.uint32(23)).astype(np.uint8)
    else:
        return None
    return np.argsort(key, kind="stable")  # radix sort on 8-bit keys: linear time


def _zigzag_sorted(new: np.ndarray, parent: np.ndarray, itemsize: int) -> np.ndarray:
    z = _zigzag(new, parent, itemsize)
    order = _by_exponent(parent, itemsize)
    return z if order is None else z.view(_UINT[itemsize])[order].view(np.uint8)


def _zigzag_sorted_inv(delta: np.ndarray, parent: np.ndarray, itemsize: int) -> np.ndarray:
    order = _by_exponent(parent, itemsize)
    if order is not None:
        z = np.empty(delta.size // itemsize, dtype=_UINT[itemsize])
        z[order] = delta.view(_UINT[itemsize])
        delta = z.view(np.uint8)
    return _zigzag_inv(delta, parent, itemsize)


CODECS: dict[str, Codec] = {"xor": (_xor, _xor_inv), "sub": (_sub, _sub_inv),
                            "zigzag": (_zigzag, _zigzag_inv),
                            "zigzag_sorted": (_zigzag_sorted, _zigzag_sorted_inv)}


def _codec(name: str) -> Codec:
    if name not in CODECS:
        raise ConfigError(f"unknown delta codec {name!r}; choose one of {sorted(CODECS)}")
    return CODECS[name]


def encode(raw: np.ndarray, parent: np.ndarray | None, *, itemsize: int, codec: str = "xor",
           level: int = 1) -> bytes:
    """Compressed full bits (``parent`` None) or compressed delta against ``parent``."""
    body = raw if parent is None else _codec(codec)[0](raw, parent, itemsize)
    return zstandard.ZstdCompressor(level=level).compress(shuffle(body, itemsize).tobytes())


def decode(blob: bytes, parent: np.ndarray | None, *, itemsize: int, codec: str = "xor",
           size: int | None = None) -> np.ndarray:
    """Inverse of ``encode``; raises ``zstandard.ZstdError`` on a damaged frame. ``size``: the
    bytes the tensor must have; a frame that declares another size raises ``ValueError`` before
    anything is allocated (a flipped size field could otherwise ask for terabytes)."""
    if size is not None:
        declared = zstandard.get_frame_parameters(blob).content_size
        if declared != size:
            raise ValueError(f"frame declares {declared} bytes, the tensor has {size}")
    planes = np.frombuffer(zstandard.ZstdDecompressor().decompress(blob), dtype=np.uint8)
    body = unshuffle(planes, itemsize)
    if parent is None:
        return body.copy()
    if body.size != parent.size:
        raise ValueError(f"delta has {body.size} bytes, parent {parent.size}")
    return _codec(codec)[1](body, parent, itemsize)
