"""Versioned policy weights over fsspec: deltas against the parent, a full snapshot every K.

    store = LocalWeightStore("/tmp/weights")            # or FsspecWeightStore("s3://bucket/run1")
    store = FsspecWeightStore("s3://bucket/run1", storage_options={"endpoint_url": "http://minio:9000"})
    store.publish(model.state_dict(), version=7)        # trainer
    v = store.latest(); sd = store.fetch(v)             # engine (exact version or WeightStoreError)
    got = store.load(v)                                 # engine, tolerant: got.version, got.fallback
    store.rollback(5, model.state_dict())               # trainer resumed from its checkpoint of v5

Layout under the root URL, one directory per version::

    v0000000007/data.zst        per-tensor zstd frames, concatenated (full bits or a delta)
    v0000000007/manifest.json   version, parent, kind, codec, per tensor dtype/shape/offset and
                                sha256 (of its bits, name, dtype and shape), the blob's sha256,
                                and the sha256 of all of that (manifest_sha256)

Publishing is atomic for readers: the blob is written first, then the manifest under a temporary
name, renamed last; a version exists only once its manifest does. (On object stores the rename is
a copy, but a reader still never sees a manifest whose blob is incomplete.)

What a reader trusts: nothing it has not checked. A manifest must parse, carry the checksum of
its own content (so a renamed key, two swapped tensor names, an edited shape, dtype, offset or
version number are all detected), name its own version, and be consistent (offsets tile the blob,
every alias names a stored tensor, a delta's parent is older). The blob must have the size and
sha256 the manifest gives; each frame must declare the tensor's byte size before it is
decompressed; each tensor's rebuilt bits, with its name, dtype and shape, must match its sha256,
and a delta's parent must hold a tensor of the same size. Any failure is a ``WeightStoreError`` naming the version: ``fetch``
raises it, and ``load`` falls back to the last intact full snapshot at or before the requested
version and says so (``Loaded.fallback``), so an engine keeps serving an older but exact policy —
its tokens carry that older version number. ``load`` raises ``WeightStoreError`` only when no
full snapshot is intact. ``publish`` never builds a delta on a damaged parent: it writes a full
snapshot instead. ``looprl weights verify`` lists the damaged versions.

Not protected against: a writer who recomputes the checksums after editing (they detect damage,
not tampering — anyone who can write the store can publish weights; recomputing only the
manifest's checksum still fails on a renamed, retyped or reshaped tensor, but an alias pointed at
another tensor goes through), and a parent damaged after
its publisher cached it being used for the next delta (its publisher checks only the parent's
manifest and blob size; readers then fall back until the next full snapshot).

Resume (``rollback``): a trainer killed after publishing versions its checkpoint never saw
resumes from the checkpoint and calls ``rollback(checkpoint_version, checkpoint_weights)``: the
versions above it are removed (manifest first, so readers never see half a version), and the
checkpoint's version is republished if it is missing, damaged or holds other weights. The store
and the checkpoint then agree, and the trainer publishes the next versions again. A rollback
killed half way is finished by the next one. A reader that fetched a removed version compares
manifest checksums, never version numbers alone, so it never rebuilds from the lost weights.

Transport dtype: floating tensors are published in ``dtype`` (bf16 by default: half the bytes of
fp32, and a small update flips few bf16 bits, so deltas are tiny). The trainer keeps fp32 master
weights; the engine then samples from bf16-rounded weights, which shifts its logprobs slightly
from the trainer's — the truncated importance weight in the loss corrects exactly that. Updates
smaller than bf16's resolution accumulate in the fp32 master and appear once they cross a step.
Use ``dtype="float32"`` for bit-exact transport of an fp32 trainer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import fsspec
import numpy as np
import torch
import zstandard

from looprl import faults
from looprl.errors import ConfigError, InfraKind, WeightStoreError
from looprl.weights.delta import CODECS, bytes_to_tensor, decode, encode, tensor_bytes

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
"""Transport dtypes of floating tensors."""
TENSOR_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool)}
"""Dtypes a version may hold (a manifest naming another is damaged)."""
FORMAT = 2
"""Manifest format: 2 adds the manifest's and the blob's checksums (format 1 had neither)."""
BLOB = "data.zst"
_VERSION_DIR = re.compile(r"v(\d{10})$")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TENSOR_KEYS = {"name", "dtype", "shape", "offset", "length", "delta", "sha256"}


@dataclass(frozen=True)
class WeightStoreConfig:
    """Where and how weights are published."""

    url: str = ""
    """fsspec URL of the store root ('' = LOOPRL_HOME/weights; 's3://bucket/run' needs s3fs)."""
    storage_options: dict[str, bool | int | float | str] = field(default_factory=dict)
    """Passed to the fsspec filesystem (s3fs: endpoint_url, key, secret, anon...); credentials
    are better left to the backend's own environment (AWS_ACCESS_KEY_ID, ~/.aws)."""
    full_every: int = 10
    """A full snapshot every K versions bounds the delta chain a reader applies (and repairs)."""
    dtype: str = "bfloat16"
    """Transport dtype of floating tensors: bfloat16, float16, float32, or 'keep'."""
    codec: str = "zigzag"
    """Delta codec (``looprl.weights.delta.CODECS``): zigzag (smallest on bf16), xor or sub."""
    zstd_level: int = 1
    """zstd level of every frame. 1, not zstd's usual 3: on bf16 deltas and snapshots level 1 is
    both smaller and about twice as fast (benchmarks/weights.py; the bits are near-noise, which
    the fast strategy codes as literals, while level 3's matches cost more than they save)."""


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
Manifest = dict[str, Any]
"""A parsed manifest, checked by ``parse_manifest`` (JSON values: str, int, list, dict, None)."""


def manifest_digest(manifest: Manifest) -> str:
    """sha256 of the manifest's content without its own checksum field, in canonical JSON."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def tensor_digest(name: str, dtype: str, shape: list[int], raw: np.ndarray) -> str:
    """sha256 of a tensor's bits bound to its name, dtype and shape: bits read under another
    name, dtype or shape fail it even where a manifest's own checksum was recomputed."""
    h = hashlib.sha256(json.dumps([name, dtype, shape]).encode() + b"\0")
    h.update(raw.data)
    return h.hexdigest()


def _int(x: object, low: int = 0) -> TypeGuard[int]:
    return type(x) is int and x >= low


def _entry_problem(e: object, kind: str, stored: dict[str, int], names: set[str], offset: int) -> str | None:
    """What is wrong with one tensor entry (None: nothing); ``stored``: name -> bytes so far."""
    if not isinstance(e, dict) or not isinstance(e.get("name"), str) or e["name"] in names:
        return f"has a tensor entry without a unique name: {str(e)[:80]}"
    if "alias" in e:
        return None if set(e) == {"name", "alias"} and isinstance(e["alias"], str) and \
            e["alias"] in stored else f"aliases {e['name']!r} to a tensor it does not store"
    if set(e) != _TENSOR_KEYS:
        return f"tensor {e['name']!r} has keys {sorted(e)}, expected {sorted(_TENSOR_KEYS)}"
    if not isinstance(e["dtype"], str) or e["dtype"] not in TENSOR_DTYPES or \
            not isinstance(e["shape"], list) or not all(_int(n) for n in e["shape"]):
        return f"tensor {e['name']!r} has dtype {e['dtype']!r} / shape {e['shape']!r}"
    if e["offset"] != offset or not _int(e["length"]) or not isinstance(e["delta"], bool) or \
            (e["delta"] and kind != "delta") or not (isinstance(e["sha256"], str) and _HEX64.fullmatch(e["sha256"])):
        return f"tensor {e['name']!r} has offset/length/delta/sha256 that do not fit the blob"
    return None


def _manifest_problem(m: Manifest, version: int) -> str | None:
    """What is inconsistent in a manifest whose checksum matched (None: nothing). Checked even
    so: the checksum says the manifest is as written, this says it can be read safely."""
    if m.get("version") != version or type(m["version"]) is not int:
        return f"names version {m.get('version')!r}"
    kind, parent, depth = m.get("kind"), m.get("parent"), m.get("depth")
    if not (_int(depth) and ((kind == "full" and parent is None and depth == 0) or
                             (kind == "delta" and _int(parent) and parent < version and depth >= 1))):
        return f"has kind {kind!r}, parent {parent!r}, depth {depth!r}"
    if m.get("codec") not in CODECS or m.get("blob") != BLOB:
        return f"has codec {m.get('codec')!r}, blob {m.get('blob')!r}"
    if not (_int(m.get("blob_bytes")) and _int(m.get("raw_bytes")) and isinstance(m.get("blob_sha256"), str)
            and _HEX64.fullmatch(m["blob_sha256"]) and isinstance(m.get("tensors"), list)):
        return "lacks blob_bytes, raw_bytes, blob_sha256 or tensors"
    stored: dict[str, int] = {}
    names: set[str] = set()
    offset = 0
    for e in m["tensors"]:
        problem = _entry_problem(e, kind, stored, names, offset)
        if problem:
            return problem
        names.add(e["name"])
        if "alias" not in e:
            stored[e["name"]] = math.prod(e["shape"]) * TENSOR_DTYPES[e["dtype"]].itemsize
            offset += e["length"]
    if offset != m["blob_bytes"] or sum(stored.values()) != m["raw_bytes"]:
        return "has tensor lengths that do not add up to blob_bytes / raw_bytes"
    return None


def parse_manifest(raw: bytes, version: int) -> Manifest:
    """The manifest of ``version`` from its bytes, checked (see the module docstring);
    ``WeightStoreError`` if it is unreadable, fails its checksum or is inconsistent."""
    try:
        m = json.loads(raw)
        ok = isinstance(m, dict) and m.get("manifest_sha256") == manifest_digest(m)
    except (ValueError, RecursionError) as e:  # bad JSON or UTF-8, or a number too long to print
        raise WeightStoreError(f"weight version {version}: manifest unreadable ({e})") from None
    if not ok:
        fmt = m.get("format") if isinstance(m, dict) else None
        hint = " (format 1, written before manifests were checksummed: republish)" if fmt == 1 else ""
        raise WeightStoreError(f"weight version {version}: manifest fails its checksum{hint}")
    problem = m.get("format") != FORMAT and f"has format {m.get('format')!r}, expected {FORMAT}"
    problem = problem or _manifest_problem(m, version)
    if problem:
        raise WeightStoreError(f"weight version {version}: manifest {problem}")
    return m


class FsspecWeightStore:
    """``looprl.protocols.WeightStore`` over any fsspec filesystem. One publisher, many readers."""

    def __init__(self, url: str, *, full_every: int = 10, dtype: str = "bfloat16",
                 codec: str = "zigzag", zstd_level: int = 1,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if dtype != "keep" and dtype not in DTYPES:
            raise ConfigError(f"weights dtype {dtype!r} unknown; choose one of {sorted(DTYPES)} or keep")
        if full_every < 1:
            raise ConfigError("weights full_every must be >= 1 (1 = every version a full snapshot)")
        if codec not in CODECS:
            raise ConfigError(f"unknown delta codec {codec!r}; choose one of {sorted(CODECS)}")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except ImportError as e:
            raise WeightStoreError(f"cannot open weight store {url!r}: {e}; install the fsspec "
                                   "backend for that scheme (e.g. pip install s3fs)") from None
        self.url, self.full_every, self.dtype, self.codec, self.level = (
            url, full_every, dtype, codec, zstd_level)
        self.fs.makedirs(self.root, exist_ok=True)
        self._cache: tuple[int, str, _State] | None = None
        """(version, manifest checksum, bits) of the last version published or rebuilt."""
        self.last_publish: PublishInfo | None = None
        self.fallbacks = 0

    @classmethod
    def from_config(cls, cfg: WeightStoreConfig) -> FsspecWeightStore:
        if not cfg.url:
            return LocalWeightStore(None, full_every=cfg.full_every, dtype=cfg.dtype,
                                    codec=cfg.codec, zstd_level=cfg.zstd_level)
        return cls(cfg.url, full_every=cfg.full_every, dtype=cfg.dtype, codec=cfg.codec,
                   zstd_level=cfg.zstd_level, storage_options=cfg.storage_options)

    # -- layout ---------------------------------------------------------------------------------
    def _dir(self, version: int) -> str:
        return f"{self.root}/v{version:010d}"

    def _dirs(self) -> set[int]:
        """Versions with a directory, published or left half-written by a killed publisher."""
        found = (_VERSION_DIR.search(p.rstrip("/")) for p in self.fs.glob(f"{self.root}/v*"))
        return {int(m.group(1)) for m in found if m}

    def versions(self) -> list[int]:
        """Published versions (those with a manifest, intact or not), ascending."""
        out = []
        for p in self.fs.glob(f"{self.root}/v*/manifest.json"):
            m = _VERSION_DIR.search(p.rsplit("/", 2)[-2])
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def latest(self) -> int | None:
        """The newest published version (it may be damaged: ``load`` falls back, ``fetch`` raises)."""
        vs = self.versions()
        return vs[-1] if vs else None

    def _read(self, version: int, name: str) -> bytes:
        try:
            return self.fs.cat_file(f"{self._dir(version)}/{name}")
        except FileNotFoundError:
            what = "is not in" if name == "manifest.json" else f"has no {name} in"
            raise WeightStoreError(f"weight version {version} {what} {self.url!r}; "
                                   f"published: {self.versions()[-5:]}") from None
        except OSError as e:  # a directory in its place, permissions, a failing object store
            raise WeightStoreError(f"weight version {version}: cannot read {name} ({e})") from None

    def manifest(self, version: int) -> Manifest:
        """``version``'s checked manifest; ``WeightStoreError`` if it is missing or damaged."""
        return parse_manifest(self._read(version, "manifest.json"), version)

    # -- publish --------------------------------------------------------------------------------
    def _to_transport(self, t: torch.Tensor) -> torch.Tensor:
        if self.dtype == "keep" or not t.is_floating_point():
            return t
        return t.to(DTYPES[self.dtype])

    def _delta_base(self, latest: int | None, version: int) -> tuple[int | None, _State | None, int]:
        """(parent, its bits, depth) to write ``version`` as a delta, or (None, None, 0) for a full
        snapshot: after ``full_every`` versions, or when the latest version is damaged."""
        if latest is None:
            return None, None, 0
        try:
            m = self.manifest(latest)
            if m["depth"] + 1 >= self.full_every:
                return None, None, 0
            if self.fs.size(f"{self._dir(latest)}/{BLOB}") != m["blob_bytes"]:
                raise WeightStoreError(f"weight version {latest}: blob size differs from the manifest")
            return latest, self._state(latest)[1], m["depth"] + 1
        except (WeightStoreError, OSError) as e:
            log.warning("weights %d unreadable (%s); publishing %d as a full snapshot", latest, e, version)
            return None, None, 0

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write ``version`` as a delta against the latest version (or as a full snapshot)."""
        faults.maybe_raise(InfraKind.WEIGHT_WRITE, "FsspecWeightStore.publish")
        vs = self.versions()
        if vs and version <= vs[-1]:
            raise WeightStoreError(f"cannot publish version {version}: versions must increase and "
                                   f"{vs[-1]} is already published in {self.url!r} (a resumed "
                                   "trainer calls rollback(version, weights) first)",
                                   kind=InfraKind.INTERNAL)
        parent, parent_state, depth = self._delta_base(vs[-1] if vs else None, version)
        entries: list[dict[str, Any]] = []
        frames: list[bytes] = []
        state: dict[str, np.ndarray] = {}
        seen: dict[tuple[int, tuple[int, ...], torch.dtype], str] = {}
        offset = raw_total = 0
        for name, tensor in state_dict.items():
            if tensor.dtype not in TENSOR_DTYPES.values():
                raise WeightStoreError(f"cannot publish tensor {name!r} of dtype {tensor.dtype}; "
                                       f"the store holds {sorted(TENSOR_DTYPES)}",
                                       kind=InfraKind.INTERNAL)
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
            dtype, shape = str(t.dtype).removeprefix("torch."), list(t.shape)
            entries.append({"name": name, "dtype": dtype, "shape": shape, "offset": offset,
                            "length": len(frame), "delta": base is not None,
                            "sha256": tensor_digest(name, dtype, shape, raw)})
            frames.append(frame)
            offset += len(frame)
            raw_total += raw.size
            state[name] = raw
        blob = b"".join(frames)
        kind = "delta" if parent_state is not None else "full"
        manifest = {"format": FORMAT, "version": version, "parent": parent if kind == "delta" else None,
                    "kind": kind, "depth": depth, "codec": self.codec, "blob": BLOB,
                    "blob_bytes": len(blob), "blob_sha256": hashlib.sha256(blob).hexdigest(),
                    "raw_bytes": raw_total, "created": time.time(), "tensors": entries}
        manifest["manifest_sha256"] = digest = manifest_digest(manifest)
        d = self._dir(version)
        self.fs.makedirs(d, exist_ok=True)
        self.fs.pipe_file(f"{d}/{BLOB}", blob)
        self.fs.pipe_file(f"{d}/manifest.json.tmp", json.dumps(manifest).encode())
        self.fs.mv(f"{d}/manifest.json.tmp", f"{d}/manifest.json")  # the version appears here
        self._cache = (version, digest, state)
        self.last_publish = PublishInfo(version, parent if kind == "delta" else None, kind,
                                        len(blob), raw_total)

    # -- resume ---------------------------------------------------------------------------------
    def _remove(self, version: int) -> None:
        """Delete a version, manifest first: readers stop seeing it before its blob goes."""
        d = self._dir(version)
        if self.fs.exists(f"{d}/manifest.json"):
            self.fs.rm(f"{d}/manifest.json")
        if self.fs.exists(d):
            self.fs.rm(d, recursive=True)

    def _holds(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> bool:
        """Whether ``version`` is intact and holds exactly ``state_dict`` in transport dtype."""
        try:
            got = self.fetch(version)
        except WeightStoreError:
            return False
        want = {k: self._to_transport(v) for k, v in state_dict.items()}
        return got.keys() == want.keys() and all(
            got[k].dtype == w.dtype and got[k].shape == w.shape
            and np.array_equal(tensor_bytes(got[k]), tensor_bytes(w)) for k, w in want.items())

    def rollback(self, version: int, state_dict: Mapping[str, torch.Tensor] | None = None) -> list[int]:
        """Make ``version`` the newest version: remove every version above it (and leftovers of
        interrupted publishes); with ``state_dict``, make sure ``version`` holds exactly these
        weights, republishing it if it is missing, damaged or different. Returns the removed
        versions above ``version``. Safe to repeat; one killed half way is finished by the next."""
        gone = sorted((v for v in self.versions() if v > version), reverse=True)
        for v in gone:
            self._remove(v)
        for v in self._dirs():  # blobs of publishes killed before their manifest
            if v > version:
                self._remove(v)
        if self._cache is not None and self._cache[0] > version:
            self._cache = None
        if state_dict is not None and not self._holds(version, state_dict):
            log.warning("weights %d missing, damaged or not the checkpoint's; republishing it", version)
            self._remove(version)
            self.publish(state_dict, version)
        if gone:
            log.warning("removed weight versions %s published after version %d", gone[::-1], version)
        return gone[::-1]

    # -- read -----------------------------------------------------------------------------------
    def _chain(self, version: int) -> list[Manifest]:
        """Manifests from the nearest full snapshot, or the cached version, (first) to ``version``
        (last). Parents are older (checked), so the walk ends."""
        chain = [self.manifest(version)]
        cached = self._cache[:2] if self._cache is not None else None
        while chain[-1]["kind"] != "full" and (chain[-1]["version"], chain[-1]["manifest_sha256"]) != cached:
            chain.append(self.manifest(chain[-1]["parent"]))
        return chain[::-1]

    def _apply(self, m: Manifest, parent: _State | None) -> _State:
        """Rebuild one version from its manifest and its parent's bits; verify every checksum."""
        v = m["version"]
        blob = self._read(v, BLOB)
        if len(blob) != m["blob_bytes"] or hashlib.sha256(blob).hexdigest() != m["blob_sha256"]:
            raise WeightStoreError(f"weight version {v}: blob damaged ({len(blob)} bytes, manifest "
                                   f"says {m['blob_bytes']}; or its checksum differs)")
        state: _State = {}
        for e in m["tensors"]:
            if "alias" in e:
                continue
            itemsize = TENSOR_DTYPES[e["dtype"]].itemsize
            size = math.prod(e["shape"]) * itemsize
            base = parent.get(e["name"]) if (e["delta"] and parent is not None) else None
            if e["delta"] and (base is None or base.size != size):
                raise WeightStoreError(f"weight version {v}: parent lacks tensor {e['name']} "
                                       f"of {size} bytes")
            frame = blob[e["offset"]:e["offset"] + e["length"]]
            try:
                raw = decode(frame, base, itemsize=itemsize, codec=m["codec"], size=size)
            except (zstandard.ZstdError, ValueError) as err:
                raise WeightStoreError(f"weight version {v}: tensor {e['name']} undecodable ({err})") from None
            if tensor_digest(e["name"], e["dtype"], e["shape"], raw) != e["sha256"]:
                raise WeightStoreError(f"weight version {v}: checksum mismatch on {e['name']}")
            state[e["name"]] = raw
        return state

    def _state(self, version: int) -> tuple[Manifest, _State]:
        """``version``'s manifest and exact bits, starting from the cache when it lies on the chain."""
        chain = self._chain(version)
        state = None
        first = chain[0]
        if self._cache is not None and (first["version"], first["manifest_sha256"]) == self._cache[:2]:
            state, chain = self._cache[2], chain[1:]
        for m in chain:
            state = self._apply(m, state)
        assert state is not None, "a chain starts at a full snapshot or at the cached version"
        top = chain[-1] if chain else first
        self._cache = (version, top["manifest_sha256"], state)
        return top, state

    def fetch(self, version: int) -> dict[str, torch.Tensor]:
        """Exactly ``version``'s weights (transport dtype); ``WeightStoreError`` if unreadable."""
        m, state = self._state(version)
        out: dict[str, torch.Tensor] = {}
        for e in m["tensors"]:
            if "alias" in e:
                out[e["name"]] = out[e["alias"]]
            else:
                out[e["name"]] = bytes_to_tensor(state[e["name"]], TENSOR_DTYPES[e["dtype"]],
                                                 tuple(e["shape"]))
        return out

    def load(self, version: int | None = None) -> Loaded:
        """``version`` (default latest), or the last intact full snapshot before it, reported;
        ``WeightStoreError`` when neither is readable."""
        faults.maybe_raise(InfraKind.WEIGHT_READ, "FsspecWeightStore.load")
        requested = self.latest() if version is None else version
        if requested is None:
            raise WeightStoreError(f"no weights published in {self.url!r} yet; the trainer "
                                   "publishes a version after each step")
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
    of the newest ``keep`` versions. Returns the deleted versions; ``WeightStoreError`` (nothing
    deleted) when that chain is damaged."""
    vs = store.versions()
    if keep < 1 or len(vs) <= keep:
        return []
    m = store.manifest(vs[-keep])
    while m["kind"] != "full":
        m = store.manifest(m["parent"])
    gone = [v for v in vs if v < m["version"]]
    for v in gone:
        store._remove(v)
    return gone


class LocalWeightStore(FsspecWeightStore):
    """A weight store in a local directory (default ``LOOPRL_HOME/weights``)."""

    def __init__(self, path: str | None = None, **kwargs: object) -> None:
        from looprl.paths import sub

        super().__init__(str(path) if path else str(sub("weights")), **kwargs)  # type: ignore[arg-type]
