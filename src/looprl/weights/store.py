"""Versioned policy weights over fsspec: deltas against the parent, a full snapshot every K.

    store = LocalWeightStore("/tmp/weights")            # or FsspecWeightStore("s3://bucket/run1")
    store.publish(model.state_dict(), version=7)        # trainer
    v = store.latest(); sd = store.fetch(v)             # engine (exact version or WeightStoreError)
    got = store.load(v)                                 # engine, tolerant: got.version, got.fallback

Layout under the root URL, one directory per version::

    v0000000007/data.zst        per-tensor zstd frames, concatenated (full bits or a delta)
    v0000000007/manifest.json   version, parent, kind, codec, per-tensor dtype/shape/offset/sha256

Publishing is atomic for readers: the blob is written first, then the manifest under a temporary
name, renamed last; a version exists only once its manifest does. (On object stores the rename is
a copy, but a reader still never sees a manifest whose blob is incomplete.)

Each version's tensors are checksummed (sha256 of the exact published bits). A reader walks back
to the nearest full snapshot and applies the deltas forward; if a delta is missing or its bits
do not match the checksum, ``fetch`` raises, and ``load`` falls back to the last intact full
snapshot at or before the requested version and says so (``Loaded.fallback``), so an engine keeps
serving an older but exact policy — its tokens carry that older version number.

Transport dtype: floating tensors are published in ``dtype`` (bf16 by default: half the bytes of
fp32, and a small update flips few bf16 bits, so deltas are tiny). The trainer keeps fp32 master
weights; the engine then samples from bf16-rounded weights, which shifts its logprobs slightly
from the trainer's — the truncated importance weight in the loss corrects exactly that. Updates
smaller than bf16's resolution accumulate in the fp32 master and appear once they cross a step.
Use ``dtype="float32"`` for bit-exact transport of an fp32 trainer.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

import fsspec
import numpy as np
import torch
import zstandard

from looprl.errors import ConfigError, WeightStoreError
from looprl.weights.delta import bytes_to_tensor, decode, encode, sha256, tensor_bytes

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_VERSION_DIR = re.compile(r"v(\d{10})$")


@dataclass(frozen=True)
class WeightStoreConfig:
    """Where and how weights are published."""

    url: str = ""
    """fsspec URL of the store root ('' = LOOPRL_HOME/weights; 's3://bucket/run' needs s3fs)."""
    full_every: int = 10
    """A full snapshot every K versions bounds the delta chain a reader applies (and repairs)."""
    dtype: str = "bfloat16"
    """Transport dtype of floating tensors: bfloat16, float16, float32, or 'keep'."""
    codec: str = "zigzag"
    """Delta codec (``looprl.weights.delta.CODECS``): zigzag (smallest on bf16), xor or sub."""
    zstd_level: int = 3


@dataclass(frozen=True)
class PublishInfo:
    """What the last ``publish`` wrote."""

    version: int
    parent: int | None
    kind: str  # "full" | "delta"
    blob_bytes: int
    raw_bytes: int
    """Bytes of the uncompressed tensors in transport dtype (a full snapshot's raw size)."""


@dataclass(frozen=True)
class Loaded:
    """Weights as a reader got them. ``fallback`` says why ``version`` differs from ``requested``."""

    state_dict: dict[str, torch.Tensor]
    version: int
    requested: int
    fallback: str | None = None


_State = dict[str, np.ndarray]  # tensor name -> raw bits in transport dtype


class FsspecWeightStore:
    """``looprl.protocols.WeightStore`` over any fsspec filesystem. One publisher, many readers."""

    def __init__(self, url: str, *, full_every: int = 10, dtype: str = "bfloat16",
                 codec: str = "zigzag", zstd_level: int = 3) -> None:
        if dtype != "keep" and dtype not in DTYPES:
            raise ConfigError(f"weights dtype {dtype!r} unknown; choose one of {sorted(DTYPES)} or keep")
        if full_every < 1:
            raise ConfigError("weights full_every must be >= 1 (1 = every version a full snapshot)")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except ImportError as e:
            raise WeightStoreError(f"cannot open weight store {url!r}: {e}; install the fsspec "
                                   "backend for that scheme (e.g. pip install s3fs)") from None
        self.url, self.full_every, self.dtype, self.codec, self.level = (
            url, full_every, dtype, codec, zstd_level)
        self.fs.makedirs(self.root, exist_ok=True)
        self._cache: tuple[int, _State] | None = None  # last published or reconstructed version
        self.last_publish: PublishInfo | None = None
        self.fallbacks = 0

    @classmethod
    def from_config(cls, cfg: WeightStoreConfig) -> FsspecWeightStore:
        if not cfg.url:
            return LocalWeightStore(None, full_every=cfg.full_every, dtype=cfg.dtype,
                                    codec=cfg.codec, zstd_level=cfg.zstd_level)
        return cls(cfg.url, full_every=cfg.full_every, dtype=cfg.dtype, codec=cfg.codec,
                   zstd_level=cfg.zstd_level)

    # -- layout ---------------------------------------------------------------------------------
    def _dir(self, version: int) -> str:
        return f"{self.root}/v{version:010d}"

    def versions(self) -> list[int]:
        """Published versions (those with a manifest), ascending."""
        out = []
        for p in self.fs.glob(f"{self.root}/v*/manifest.json"):
            m = _VERSION_DIR.search(p.rsplit("/", 2)[-2])
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def latest(self) -> int | None:
        vs = self.versions()
        return vs[-1] if vs else None

    def manifest(self, version: int) -> dict:
        try:
            return json.loads(self.fs.cat_file(f"{self._dir(version)}/manifest.json"))
        except FileNotFoundError:
            raise WeightStoreError(f"weight version {version} is not in {self.url!r}; "
                                   f"published: {self.versions()[-5:]}") from None

    # -- publish --------------------------------------------------------------------------------
    def _to_transport(self, t: torch.Tensor) -> torch.Tensor:
        if self.dtype == "keep" or not t.is_floating_point():
            return t
        return t.to(DTYPES[self.dtype])

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write ``version`` as a delta against the latest version (or as a full snapshot)."""
        parent = self.latest()
        if parent is not None and version <= parent:
            raise WeightStoreError(f"cannot publish version {version}: versions must increase and "
                                   f"{parent} is already published in {self.url!r}")
        parent_state, depth = None, 0
        if parent is not None:
            depth = int(self.manifest(parent).get("depth", 0)) + 1
            if depth < self.full_every:
                parent_state = self._state(parent)
            else:
                depth = 0
        entries, frames, state, seen = [], [], {}, {}
        offset = raw_total = 0
        for name, tensor in state_dict.items():
            key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
            if tensor.numel() and key in seen:  # tied weights: store once
                entries.append({"name": name, "alias": seen[key]})
                continue
            seen[key] = name
            t = self._to_transport(tensor)
            raw = tensor_bytes(t)
            base = parent_state.get(name) if parent_state is not None else None
            if base is not None and base.size != raw.size:
                base = None  # shape changed: this tensor goes in full
            frame = encode(raw, base, itemsize=t.element_size(), codec=self.codec, level=self.level)
            entries.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."),
                            "shape": list(t.shape), "offset": offset, "length": len(frame),
                            "delta": base is not None, "sha256": sha256(raw)})
            frames.append(frame)
            offset += len(frame)
            raw_total += raw.size
            state[name] = raw
        blob = b"".join(frames)
        kind = "delta" if parent_state is not None else "full"
        manifest = {"format": 1, "version": version, "parent": parent if kind == "delta" else None,
                    "kind": kind, "depth": depth, "codec": self.codec, "blob": "data.zst",
                    "blob_bytes": len(blob), "raw_bytes": raw_total, "created": time.time(),
                    "tensors": entries}
        d = self._dir(version)
        self.fs.makedirs(d, exist_ok=True)
        self.fs.pipe_file(f"{d}/data.zst", blob)
        self.fs.pipe_file(f"{d}/manifest.json.tmp", json.dumps(manifest).encode())
        self.fs.mv(f"{d}/manifest.json.tmp", f"{d}/manifest.json")  # the version appears here
        self._cache = (version, state)
        self.last_publish = PublishInfo(version, manifest["parent"], kind, len(blob), raw_total)

    # -- read -----------------------------------------------------------------------------------
    def _chain(self, version: int) -> list[dict]:
        """Manifests from the nearest full snapshot (first) to ``version`` (last)."""
        chain = [self.manifest(version)]
        while chain[-1]["kind"] != "full":
            chain.append(self.manifest(int(chain[-1]["parent"])))
        return chain[::-1]

    def _apply(self, m: dict, parent: _State | None) -> _State:
        """Reconstruct one version from its manifest and its parent's state; verify checksums."""
        v = m["version"]
        try:
            blob = self.fs.cat_file(f"{self._dir(v)}/{m['blob']}")
        except FileNotFoundError:
            raise WeightStoreError(f"weight version {v}: blob missing") from None
        state: _State = {}
        for e in m["tensors"]:
            if "alias" in e:
                continue
            frame = blob[e["offset"]:e["offset"] + e["length"]]
            base = parent.get(e["name"]) if (e["delta"] and parent is not None) else None
            if e["delta"] and base is None:
                raise WeightStoreError(f"weight version {v}: parent lacks tensor {e['name']}")
            itemsize = DTYPES.get(e["dtype"], getattr(torch, e["dtype"])).itemsize
            try:
                raw = decode(frame, base, itemsize=itemsize, codec=m["codec"])
            except (zstandard.ZstdError, ValueError) as err:
                raise WeightStoreError(f"weight version {v}: tensor {e['name']} undecodable ({err})") from None
            if sha256(raw) != e["sha256"]:
                raise WeightStoreError(f"weight version {v}: checksum mismatch on {e['name']}")
            state[e["name"]] = raw
        return state

    def _state(self, version: int) -> _State:
        """Exact bits of ``version``, starting from the cache when it lies on the chain."""
        if self._cache is not None and self._cache[0] == version:
            return self._cache[1]
        chain = self._chain(version)
        start, state = 0, None
        if self._cache is not None:
            for i, m in enumerate(chain):
                if m["version"] == self._cache[0]:
                    start, state = i + 1, self._cache[1]
        for m in chain[start:]:
            state = self._apply(m, state)
        assert state is not None
        self._cache = (version, state)
        return state

    def _tensors(self, version: int, state: _State) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for e in self.manifest(version)["tensors"]:
            if "alias" in e:
                out[e["name"]] = out[e["alias"]]
            else:
                dtype = DTYPES.get(e["dtype"]) or getattr(torch, e["dtype"])
                out[e["name"]] = bytes_to_tensor(state[e["name"]], dtype, tuple(e["shape"]))
        return out

    def fetch(self, version: int) -> dict[str, torch.Tensor]:
        """Exactly ``version``'s weights (transport dtype); ``WeightStoreError`` if unreadable."""
        return self._tensors(version, self._state(version))

    def load(self, version: int | None = None) -> Loaded:
        """``version`` (default latest), or the last intact full snapshot before it, reported."""
        requested = self.latest() if version is None else version
        if requested is None:
            raise WeightStoreError(f"no weights published in {self.url!r} yet; the trainer "
                                   "publishes version 0 at start")
        try:
            return Loaded(self.fetch(requested), requested, requested)
        except WeightStoreError as err:
            reason = str(err)
        for v in reversed([v for v in self.versions() if v <= requested]):
            try:
                if self.manifest(v)["kind"] != "full":
                    continue
                sd = self.fetch(v)
            except WeightStoreError:
                continue
            self.fallbacks += 1
            log.warning("weights %d unreadable (%s); fell back to full snapshot %d",
                        requested, reason, v)
            return Loaded(sd, v, requested, fallback=reason)
        raise WeightStoreError(f"weight version {requested} unreadable ({reason}) and no intact "
                               f"full snapshot precedes it in {self.url!r}; republish from the trainer")


def prune(store: FsspecWeightStore, keep: int) -> list[int]:
    """Delete versions no reader needs: everything before the full snapshot that starts the chain
    of the newest ``keep`` versions. Returns the deleted versions."""
    vs = store.versions()
    if keep < 1 or len(vs) <= keep:
        return []
    oldest_kept = store._chain(vs[-keep])[0]["version"]
    gone = [v for v in vs if v < oldest_kept]
    for v in gone:
        store.fs.rm(store._dir(v), recursive=True)  # manifest goes with it: readers skip it
    return gone


class LocalWeightStore(FsspecWeightStore):
    """A weight store in a local directory (default ``LOOPRL_HOME/weights``)."""

    def __init__(self, path: str | None = None, **kwargs: object) -> None:
        from looprl.paths import sub

        super().__init__(str(path) if path else str(sub("weights")), **kwargs)  # type: ignore[arg-type]
