import json
from pathlib import Path

import pytest
import torch

from looprl.errors import WeightStoreError
from looprl.protocols import WeightStore
from looprl.weights.store import FsspecWeightStore, LocalWeightStore, WeightStoreConfig


def model_state(seed: int, tied: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(50, 8, generator=g)
    sd = {"embed.weight": emb, "layer.weight": torch.randn(8, 8, generator=g),
          "layer.bias": torch.randn(8, generator=g), "steps": torch.tensor([seed], dtype=torch.int64)}
    if tied:
        sd["lm_head.weight"] = emb
    return sd


def versions(n: int) -> list[dict[str, torch.Tensor]]:
    """A base model and n-1 small updates of it (like optimizer steps)."""
    base = model_state(0)
    out = [base]
    for i in range(1, n):
        g = torch.Generator().manual_seed(i)
        out.append({k: (v + 1e-3 * torch.randn(v.shape, generator=g)) if v.is_floating_point()
                    else v + i for k, v in out[-1].items()})
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def as_bf16(sd):
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}


def test_round_trip_exact_over_deltas_and_snapshots(tmp_path):
    vs = versions(7)
    pub = LocalWeightStore(tmp_path, full_every=3)
    assert isinstance(pub, WeightStore)
    for v, sd in enumerate(vs):
        pub.publish(sd, v)
    kinds = [pub.manifest(v)["kind"] for v in range(7)]
    assert kinds == ["full", "delta", "delta", "full", "delta", "delta", "full"]
    reader = LocalWeightStore(tmp_path)
    assert reader.latest() == 6 and reader.versions() == list(range(7))
    for v in (5, 1, 6, 2, 3):  # any order: from a snapshot or from the cached version
        got = reader.fetch(v)
        assert same(got, as_bf16(vs[v])), v
        assert got["layer.weight"].dtype == torch.bfloat16 and got["steps"].dtype == torch.int64
    m = reader.manifest(4)
    entry = next(e for e in m["tensors"] if e["name"] == "layer.weight")
    assert m["parent"] == 3 and entry["dtype"] == "bfloat16" and entry["shape"] == [8, 8]
    assert len(entry["sha256"]) == 64


def test_float32_transport_is_exact_to_the_trainer_weights(tmp_path):
    vs = versions(3)
    store = LocalWeightStore(tmp_path, dtype="float32")
    for v, sd in enumerate(vs):
        store.publish(sd, v)
    assert same(LocalWeightStore(tmp_path).fetch(2), vs[2])


def test_tied_weights_stored_once(tmp_path):
    store = LocalWeightStore(tmp_path)
    store.publish(model_state(1, tied=True), 0)
    entries = {e["name"]: e for e in store.manifest(0)["tensors"]}
    assert entries["lm_head.weight"] == {"name": "lm_head.weight", "alias": "embed.weight"}
    got = LocalWeightStore(tmp_path).fetch(0)
    assert torch.equal(got["lm_head.weight"], got["embed.weight"])


def test_corrupt_delta_is_detected_and_load_falls_back_to_the_snapshot(tmp_path, caplog):
    vs = versions(4)
    pub = LocalWeightStore(tmp_path, full_every=10)
    for v, sd in enumerate(vs):
        pub.publish(sd, v)
    blob = tmp_path / "v0000000002" / "data.zst"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    reader = LocalWeightStore(tmp_path)
    with pytest.raises(WeightStoreError, match="version 2"):
        reader.fetch(3)
    got = reader.load(3)
    assert got.version == 0 and got.requested == 3 and "version 2" in got.fallback
    assert same(got.state_dict, as_bf16(vs[0]))
    assert reader.fallbacks == 1 and "fell back" in caplog.text
    assert reader.load(1).fallback is None  # versions before the damage are intact


def test_missing_delta_falls_back(tmp_path):
    pub = LocalWeightStore(tmp_path)
    for v, sd in enumerate(versions(3)):
        pub.publish(sd, v)
    (tmp_path / "v0000000001" / "data.zst").unlink()
    got = LocalWeightStore(tmp_path).load()
    assert got.version == 0 and got.requested == 2 and "missing" in got.fallback


def test_reader_holding_the_parent_applies_only_the_new_delta(tmp_path):
    vs = versions(3)
    pub = LocalWeightStore(tmp_path)
    reader = LocalWeightStore(tmp_path)
    pub.publish(vs[0], 0)
    pub.publish(vs[1], 1)
    reader.fetch(1)
    pub.publish(vs[2], 2)
    for v in (0, 1):  # the reader no longer needs them
        (tmp_path / f"v{v:010d}" / "data.zst").unlink()
    assert same(reader.fetch(2), as_bf16(vs[2]))


def test_publish_is_invisible_until_the_manifest_lands(tmp_path):
    store = LocalWeightStore(tmp_path)
    store.publish(model_state(0), 0)
    half = tmp_path / "v0000000001"  # a publisher died after writing the blob
    half.mkdir()
    (half / "data.zst").write_bytes(b"partial")
    (half / "manifest.json.tmp").write_text("{")
    reader = LocalWeightStore(tmp_path)
    assert reader.latest() == 0 and reader.load().version == 0
    store.publish(model_state(2), 1)  # the next publish of that version replaces it
    assert same(reader.fetch(1), as_bf16(model_state(2)))


def test_versions_must_increase_and_unknown_versions_are_clear_errors(tmp_path):
    store = LocalWeightStore(tmp_path)
    store.publish(model_state(0), 5)
    with pytest.raises(WeightStoreError, match="must increase"):
        store.publish(model_state(1), 5)
    with pytest.raises(WeightStoreError, match="not in"):
        store.fetch(4)
    with pytest.raises(WeightStoreError, match="no weights published"):
        LocalWeightStore(tmp_path / "empty").load()


def test_other_fsspec_backends_and_default_location(tmp_path, monkeypatch):
    mem = FsspecWeightStore("memory://looprl-test-store")
    vs = versions(2)
    mem.publish(vs[0], 0)
    mem.publish(vs[1], 1)
    assert same(FsspecWeightStore("memory://looprl-test-store").fetch(1), as_bf16(vs[1]))
    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path))
    store = FsspecWeightStore.from_config(WeightStoreConfig())
    store.publish(vs[0], 0)
    assert json.loads(Path(tmp_path, "weights", "v0000000000", "manifest.json").read_text())["version"] == 0


def test_prune_keeps_every_chain_the_newest_versions_need(tmp_path):
    from looprl.weights.store import prune

    vs = versions(8)
    store = LocalWeightStore(tmp_path, full_every=3)  # full at 0, 3, 6
    for v, sd in enumerate(vs):
        store.publish(sd, v)
    assert prune(store, keep=4) == [0, 1, 2]  # version 4 still needs snapshot 3
    reader = LocalWeightStore(tmp_path)
    assert reader.versions() == [3, 4, 5, 6, 7]
    assert same(reader.fetch(4), as_bf16(vs[4])) and same(reader.fetch(7), as_bf16(vs[7]))
    assert prune(store, keep=10) == []


def test_truncated_manifest_falls_back_and_the_next_publish_is_a_readable_snapshot(tmp_path):
    vs = versions(4)
    pub = LocalWeightStore(tmp_path)
    for v, sd in enumerate(vs[:3]):
        pub.publish(sd, v)
    (tmp_path / "v0000000002" / "manifest.json").write_text("")  # empty: was a JSONDecodeError
    got = LocalWeightStore(tmp_path).load()
    assert got.version == 0 and got.requested == 2 and "manifest unreadable" in got.fallback
    pub.publish(vs[3], 3)  # the publisher still holds v2's bits; it must not build on them
    assert pub.last_publish.kind == "full"
    assert same(LocalWeightStore(tmp_path).fetch(3), as_bf16(vs[3]))


def test_a_manifest_edited_into_other_valid_json_is_refused(tmp_path):
    sd = {"a": torch.randn(4, 4), "b": torch.randn(4, 4)}
    LocalWeightStore(tmp_path).publish(sd, 0)
    path = tmp_path / "v0000000000" / "manifest.json"
    m = json.loads(path.read_text())
    m["tensors"][0]["name"], m["tensors"][1]["name"] = "b", "a"  # same shapes: bits would fit
    path.write_text(json.dumps(m))
    with pytest.raises(WeightStoreError, match="checksum"):
        LocalWeightStore(tmp_path).fetch(0)
    with pytest.raises(WeightStoreError, match="no intact full snapshot"):
        LocalWeightStore(tmp_path).load()


def test_rollback_removes_newer_versions_and_restores_the_checkpoint_version(tmp_path):
    vs = versions(6)
    pub = LocalWeightStore(tmp_path, full_every=10)
    for v, sd in enumerate(vs[:5]):
        pub.publish(sd, v)
    half = tmp_path / "v0000000005"  # a publish killed before its manifest
    half.mkdir()
    (half / "data.zst").write_bytes(b"partial")
    resumed = LocalWeightStore(tmp_path)  # a new trainer process, checkpoint at version 2
    assert resumed.rollback(2, vs[2]) == [3, 4]
    assert resumed.versions() == [0, 1, 2] and not half.exists()
    assert resumed.rollback(2, vs[2]) == []  # repeating it changes nothing
    assert resumed.latest() == 2
    resumed.publish(vs[5], 3)  # the next step publishes version 3 again, as a delta of 2
    assert resumed.manifest(3)["parent"] == 2
    assert same(LocalWeightStore(tmp_path).fetch(3), as_bf16(vs[5]))


@pytest.mark.parametrize("damage", ["missing", "corrupt", "other weights"])
def test_rollback_republishes_a_version_the_store_lost_or_that_differs(tmp_path, damage):
    vs = versions(3)
    pub = LocalWeightStore(tmp_path)
    pub.publish(vs[0], 0)
    if damage != "missing":
        pub.publish(vs[1] if damage == "other weights" else vs[2], 1)
    if damage == "corrupt":
        blob = tmp_path / "v0000000001" / "data.zst"
        blob.write_bytes(blob.read_bytes()[:-3])
    assert LocalWeightStore(tmp_path).rollback(1, vs[2]) == []
    got = LocalWeightStore(tmp_path).load()
    assert got.version == 1 and got.fallback is None and same(got.state_dict, as_bf16(vs[2]))


def test_a_reader_never_rebuilds_from_a_version_that_was_rolled_back(tmp_path):
    """A reader cached version 2 of a branch the trainer lost; after the rollback the same
    version numbers hold other weights, and the reader gets those."""
    vs = versions(5)
    pub = LocalWeightStore(tmp_path)
    for v in range(3):
        pub.publish(vs[v], v)
    reader = LocalWeightStore(tmp_path)
    assert same(reader.fetch(2), as_bf16(vs[2]))
    trainer = LocalWeightStore(tmp_path)  # resumed from its checkpoint of version 1
    trainer.rollback(1, vs[1])
    trainer.publish(vs[3], 2)
    trainer.publish(vs[4], 3)  # a delta of the new version 2
    assert same(reader.fetch(3), as_bf16(vs[4])) and same(reader.fetch(2), as_bf16(vs[3]))
