"""The weight store under damage: every file of every version bit-flipped, truncated, deleted, and
its manifest edited into other valid JSON (renamed keys, swapped names, other shapes, dtypes,
versions, and random one-character edits). Whatever the damage, a reader gets the exact weights
of the version it is told it got, or ``WeightStoreError`` — never wrong tensors, never another
exception — and a publisher can still publish a readable next version.

    pytest -s tests/weights/test_corruption.py    # prints the counts per kind of damage
"""

import json
import random
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from looprl.errors import WeightStoreError
from looprl.weights.delta import tensor_bytes
from looprl.weights.store import LocalWeightStore, manifest_digest

N_VERSIONS = 6  # full_every=3: full, delta, delta, full, delta, delta
FILES = ("data.zst", "manifest.json")
EDITED = (0, 1, 3, 5)
"""Versions whose manifests get the named edits: the first full snapshot, a delta on it, a later
snapshot and the newest delta."""


def weights(i: int) -> dict[str, torch.Tensor]:
    """Version i of a small model: two same-shape matrices (a name swap keeps every size), a tied
    head, a bias, an int counter and a bool mask."""
    g = torch.Generator().manual_seed(i)
    emb = torch.randn(12, 8, generator=g)
    return {"a.weight": torch.randn(8, 8, generator=g), "b.weight": torch.randn(8, 8, generator=g),
            "emb.weight": emb, "head.weight": emb, "bias": torch.randn(8, generator=g),
            "steps": torch.tensor([i], dtype=torch.int64), "mask": torch.arange(4) % (i + 2) == 0}


def transport(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}


TRUTH = [transport(weights(i)) for i in range(N_VERSIONS + 1)]


def exact(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(
        got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
        and bool((tensor_bytes(got[k]) == tensor_bytes(want[k])).all()) for k in want)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("template")
    store = LocalWeightStore(root, full_every=3)
    for v in range(N_VERSIONS):
        store.publish(weights(v), v)
    return root


def vdir(root: Path, v: int) -> Path:
    return root / f"v{v:010d}"


class Tally:
    """Outcomes over all cases: wrong weights and foreign exceptions must stay 0."""

    def __init__(self) -> None:
        self.cases: Counter[str] = Counter()
        self.detected: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.other: list[str] = []
        self.publish_failed: list[str] = []
        self.tampered: list[str] = []

    def call(self, case: str, fn: Callable[[], object]) -> object | None:
        """``fn()``, or None on WeightStoreError; anything else is recorded against ``case``."""
        try:
            return fn()
        except WeightStoreError:
            return None
        except Exception as e:  # noqa: BLE001 — the property under test: nothing else escapes
            self.other.append(f"{case}: {type(e).__name__}: {e}")
            return None

    def check(self, root: Path, kind: str, case: str, damaged: int | None,
              harmless: bool = False) -> None:
        """Read every version of the damaged store, then publish the next one and read it back.
        ``damaged``: the version whose files were hit (its fetch must fail unless ``harmless``).
        Re-signed manifests are tampering, which checksums cannot stop: their wrong weights are
        counted apart (``tampered``), foreign exceptions still fail the test."""
        self.cases[kind] += 1
        wrong = self.tampered if kind == "re-signed edit" else self.wrong
        reader = LocalWeightStore(root)
        failed = set()
        for v in [*range(N_VERSIONS), None]:
            if v is not None:
                got = self.call(case, lambda v=v: reader.fetch(v))
                if got is None:
                    failed.add(v)
                elif not exact(got, TRUTH[v]):
                    wrong.append(f"{case}: fetch({v})")
            if v is not None and damaged is not None and v < damaged:
                continue  # load reads these exactly as fetch did
            loaded = self.call(case, lambda v=v: LocalWeightStore(root).load(v))
            if loaded is not None:
                asked = N_VERSIONS - 1 if v is None else v
                if not (loaded.version <= asked and exact(loaded.state_dict, TRUTH[loaded.version])
                        and (loaded.fallback is None) == (loaded.version == loaded.requested)):
                    wrong.append(f"{case}: load({v}) -> {loaded.version}")
        if damaged is not None and damaged in failed:
            self.detected[kind] += 1
        elif damaged is not None and not harmless:
            wrong.append(f"{case}: damage to v{damaged} went unnoticed")
        publisher = LocalWeightStore(root, full_every=3)
        self.call(case, lambda: publisher.publish(weights(N_VERSIONS), N_VERSIONS))
        got = self.call(case, lambda: LocalWeightStore(root).fetch(N_VERSIONS))
        if got is None or not exact(got, TRUTH[N_VERSIONS]):
            self.publish_failed.append(case)


def fresh(template: Path, tmp: Path, i: int) -> Path:
    root = tmp / f"case{i}"
    shutil.copytree(template, root)
    return root


def edit_manifest(root: Path, v: int, edit: Callable[[dict], None], resign: bool = False) -> bool:
    """Apply ``edit`` to version ``v``'s manifest; False if it changed nothing (e.g. parent -> 0
    on version 1)."""
    path = vdir(root, v) / "manifest.json"
    before = json.loads(path.read_text())
    m = json.loads(path.read_text())
    edit(m)
    if resign:  # a writer who recomputes the manifest's checksum (tampering, not damage)
        m["manifest_sha256"] = manifest_digest(m)
    path.write_text(json.dumps(m))
    return m != before


def _entry(m: dict, name: str) -> dict:
    return next(e for e in m["tensors"] if e["name"] == name)


def _swap(m: dict, a: str, b: str, key: str) -> None:
    ea, eb = _entry(m, a), _entry(m, b)
    ea[key], eb[key] = eb[key], ea[key]


def _rename(d: dict, key: str) -> None:
    d[key + "_x"] = d.pop(key)


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda m: m.__setitem__(key, value)


def _set_entry(name: str, key: str, value: object) -> Callable[[dict], None]:
    return lambda m: _entry(m, name).__setitem__(key, value)


def manifest_edits(v: int) -> list[tuple[str, Callable[[dict], None]]]:
    """Named valid-JSON edits of version ``v``'s manifest, each one a change of meaning."""
    top = ["format", "version", "parent", "kind", "depth", "codec", "blob", "blob_bytes",
           "blob_sha256", "raw_bytes", "created", "tensors", "manifest_sha256"]
    edits: list[tuple[str, Callable[[dict], None]]] = [
        (f"rename {k}", lambda m, k=k: _rename(m, k)) for k in top]
    edits += [(f"rename tensor key {k}", lambda m, k=k: _rename(_entry(m, "bias"), k))
              for k in ("name", "dtype", "shape", "offset", "length", "delta", "sha256")]
    edits += [
        ("rename alias key", lambda m: _rename(_entry(m, "head.weight"), "alias")),
        ("swap names a/b", lambda m: _swap(m, "a.weight", "b.weight", "name")),
        ("swap offsets a/b", lambda m: _swap(m, "a.weight", "b.weight", "offset")),
        ("swap sha256 a/b", lambda m: _swap(m, "a.weight", "b.weight", "sha256")),
        ("swap names a/bias", lambda m: _swap(m, "a.weight", "bias", "name")),
        ("shape 8x8 -> 4x16", _set_entry("a.weight", "shape", [4, 16])),
        ("shape 8x8 -> 64", _set_entry("a.weight", "shape", [64])),
        ("shape 8x8 -> 8x8x1", _set_entry("a.weight", "shape", [8, 8, 1])),
        ("shape 8x8 -> 16x8", _set_entry("a.weight", "shape", [16, 8])),
        ("shape 8x8 -> 8x-8", _set_entry("a.weight", "shape", [8, -8])),
        ("shape -> string", _set_entry("a.weight", "shape", "8,8")),
        ("dtype bf16 -> f16", _set_entry("a.weight", "dtype", "float16")),
        ("dtype bf16 -> int16", _set_entry("a.weight", "dtype", "int16")),
        ("dtype bf16 -> f32", _set_entry("a.weight", "dtype", "float32")),
        ("dtype int64 -> f64", _set_entry("steps", "dtype", "float64")),
        ("dtype bool -> uint8", _set_entry("mask", "dtype", "uint8")),
        ("dtype -> unknown", _set_entry("a.weight", "dtype", "manual_seed")),
        ("dtype -> list", _set_entry("a.weight", "dtype", ["bfloat16"])),
        ("version + 1", lambda m: m.__setitem__("version", m["version"] + 1)),
        ("version - 1", lambda m: m.__setitem__("version", m["version"] - 1)),
        ("version -> string", lambda m: m.__setitem__("version", str(m["version"]))),
        ("version -> true", _set("version", True)),
        ("parent -> self", lambda m: m.__setitem__("parent", m["version"])),
        ("parent -> 0", _set("parent", 0)),
        ("parent -> huge", _set("parent", 10**30)),
        ("kind flipped", lambda m: m.__setitem__("kind", "delta" if m["kind"] == "full" else "full")),
        ("depth + 1", lambda m: m.__setitem__("depth", m["depth"] + 1)),
        ("codec zigzag -> xor", _set("codec", "xor")),
        ("codec -> unknown", _set("codec", "lz4")),
        ("blob -> ../../escape", _set("blob", "../../escape")),
        ("blob_bytes + 1", lambda m: m.__setitem__("blob_bytes", m["blob_bytes"] + 1)),
        ("length + 1", lambda m: _entry(m, "bias").__setitem__("length", _entry(m, "bias")["length"] + 1)),
        ("delta flag flipped", lambda m: _entry(m, "bias").__setitem__("delta", not _entry(m, "bias")["delta"])),
        ("alias -> a.weight", _set_entry("head.weight", "alias", "a.weight")),
        ("alias -> missing", _set_entry("head.weight", "alias", "nope")),
        ("alias -> list", _set_entry("head.weight", "alias", ["emb.weight"])),
        ("drop a tensor", lambda m: m["tensors"].pop(0)),
        ("duplicate a tensor", lambda m: m["tensors"].append(dict(m["tensors"][0]))),
        ("tensors -> dict", _set("tensors", {})),
        ("format -> 1", _set("format", 1)),
        ("top level -> list", lambda m: (m.clear(), m.__setitem__("x", [1]))),
    ]
    return edits


def char_edits(text: str, rng: random.Random, n: int) -> list[tuple[int, str]]:
    """``n`` single-character replacements of ``text`` that keep it valid JSON."""
    pool = '0123456789abcdefxyzABEFNST"{}[]:,.-+eE \\/_'
    out: list[tuple[int, str]] = []
    while len(out) < n:
        i, c = rng.randrange(len(text)), rng.choice(pool)
        new = text[:i] + c + text[i + 1:]
        if new == text:
            continue
        try:
            json.loads(new)
        except ValueError:
            continue
        out.append((i, c))
    return out


@pytest.mark.slow
def test_no_damage_yields_wrong_weights_or_a_foreign_exception(template, tmp_path):
    rng = random.Random(23)
    tally = Tally()
    n = iter(range(10**6))
    for v in range(N_VERSIONS):
        for f in FILES:
            size = (vdir(template, v) / f).stat().st_size
            for off in rng.sample(range(size), 8):  # bit flips at random offsets
                root = fresh(template, tmp_path, next(n))
                p = vdir(root, v) / f
                data = bytearray(p.read_bytes())
                data[off] ^= 1 << rng.randrange(8)
                p.write_bytes(bytes(data))
                tally.check(root, "bit flip", f"flip v{v}/{f}@{off}", v)
            for keep in (0, 1, rng.randrange(2, size - 1), size - 1):  # truncation
                root = fresh(template, tmp_path, next(n))
                p = vdir(root, v) / f
                p.write_bytes(p.read_bytes()[:keep])
                tally.check(root, "truncation", f"truncate v{v}/{f} to {keep}", v)
            root = fresh(template, tmp_path, next(n))  # deletion of each file kind
            (vdir(root, v) / f).unlink()
            tally.check(root, "deletion", f"delete v{v}/{f}", v)
        root = fresh(template, tmp_path, next(n))
        shutil.rmtree(vdir(root, v))
        tally.check(root, "deletion", f"delete v{v}/", v)
        for name, edit in manifest_edits(v) if v in EDITED else ():
            root = fresh(template, tmp_path, next(n))
            if edit_manifest(root, v, edit):
                tally.check(root, "manifest edit", f"v{v} {name}", v)
            root = fresh(template, tmp_path, next(n))
            if edit_manifest(root, v, edit, resign=True):
                tally.check(root, "re-signed edit", f"v{v} {name} (re-signed)", None)
    for i in range(240):  # random single-character edits that keep the JSON valid
        v = i % N_VERSIONS
        text = (vdir(template, v) / "manifest.json").read_text()
        ((pos, c),) = char_edits(text, rng, 1)
        edited = text[:pos] + c + text[pos + 1:]
        root = fresh(template, tmp_path, next(n))
        (vdir(root, v) / "manifest.json").write_text(edited)
        same_meaning = json.loads(edited) == json.loads(text)  # e.g. a space became a newline
        tally.check(root, "char edit", f"v{v} char {pos} -> {c!r}", v, harmless=same_meaning)
    print(f"\ncases {dict(tally.cases)} (total {sum(tally.cases.values())}); damaged version "
          f"detected {dict(tally.detected)}; wrong weights {len(tally.wrong)}; exceptions other "
          f"than WeightStoreError {len(tally.other)}; failed publishes after damage "
          f"{len(tally.publish_failed)}; re-signed (tampered) manifests read as other weights "
          f"{len(tally.tampered)}: {sorted({c.split(' (')[0][3:] for c in tally.tampered})}")
    assert tally.cases["char edit"] >= 200
    assert tally.wrong == [] and tally.other == [] and tally.publish_failed == []
    for kind in ("bit flip", "truncation", "deletion", "manifest edit"):
        assert tally.detected[kind] == tally.cases[kind], kind
