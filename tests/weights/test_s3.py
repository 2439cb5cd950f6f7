"""The weight store through a real S3 API: moto's server on loopback, reached by s3fs over HTTP.

The server runs in its own process (as a real object store would); each reader opens its own
s3fs client (``skip_instance_cache``), as an engine on another node does, so nothing is shared
through fsspec's in-process caches.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("s3fs", reason="pip install s3fs (the s3 extra)")
pytest.importorskip("moto.server", reason="pip install 'moto[server]' (the test extra)")

from looprl.errors import WeightStoreError  # noqa: E402
from looprl.weights.store import FsspecWeightStore, WeightStoreConfig  # noqa: E402
from tests.weights.test_store import as_bf16, same, versions  # noqa: E402

_SERVE = ("from moto.moto_server.threaded_moto_server import ThreadedMotoServer as S\n"
          "import threading\n"
          "s = S('127.0.0.1', 0, verbose=False); s.start()\n"
          "print(s.get_host_and_port()[1], flush=True); threading.Event().wait()")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """An S3 API on a free loopback port, in a child process; its URL."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVE], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"moto server did not start (printed {line!r})"
        yield f"http://127.0.0.1:{int(line)}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def opts(endpoint: str, **extra: object) -> dict[str, object]:
    # moto takes any credentials; a fresh client per store, as each node would have
    return {"endpoint_url": endpoint, "key": "test", "secret": "test",
            "skip_instance_cache": True, **extra}


def test_round_trip_exact_through_s3(endpoint):
    vs = versions(6)
    pub = FsspecWeightStore("s3://looprl-weights/run-a", full_every=3,
                            storage_options=opts(endpoint))
    for v, sd in enumerate(vs):
        pub.publish(sd, v)
    reader = FsspecWeightStore("s3://looprl-weights/run-a", storage_options=opts(endpoint))
    assert reader.versions() == list(range(6))
    assert [reader.manifest(v)["kind"] for v in range(6)] == ["full", "delta", "delta"] * 2
    for v in (2, 4, 5, 1):  # from a snapshot and from the cached version
        assert same(reader.fetch(v), as_bf16(vs[v])), v
    # what the objects hold: a delta is a small fraction of a full snapshot
    full, delta = pub.manifest(3)["blob_bytes"], pub.manifest(4)["blob_bytes"]
    assert pub.fs.size(f"{pub.root}/v0000000004/data.zst") == delta < full


def test_from_config_passes_storage_options(endpoint):
    cfg = WeightStoreConfig(url="s3://looprl-weights/run-cfg",
                            storage_options=opts(endpoint))  # type: ignore[arg-type]
    store = FsspecWeightStore.from_config(cfg)
    store.publish(versions(1)[0], 0)
    assert store.fs.endpoint_url == endpoint and store.latest() == 0


def test_reader_sees_versions_published_after_it_listed(endpoint):
    """s3fs caches listings: a reader polling ``latest`` must still see the publisher's next
    version, written through another client."""
    vs = versions(3)
    pub = FsspecWeightStore("s3://looprl-weights/run-b", storage_options=opts(endpoint))
    reader = FsspecWeightStore("s3://looprl-weights/run-b", storage_options=opts(endpoint))
    pub.publish(vs[0], 0)
    assert reader.latest() == 0
    pub.publish(vs[1], 1)
    pub.publish(vs[2], 2)
    assert reader.latest() == 2 and same(reader.load().state_dict, as_bf16(vs[2]))
    pub.rollback(1, vs[1])
    assert reader.latest() == 1 and reader.versions() == [0, 1]


def test_damaged_object_falls_back_to_the_snapshot(endpoint):
    vs = versions(3)
    pub = FsspecWeightStore("s3://looprl-weights/run-c", storage_options=opts(endpoint))
    for v, sd in enumerate(vs):
        pub.publish(sd, v)
    key = f"{pub.root}/v0000000002/data.zst"
    blob = bytearray(pub.fs.cat_file(key))
    blob[len(blob) // 2] ^= 0xFF
    pub.fs.pipe_file(key, bytes(blob))  # overwritten in the bucket, as a bad upload would be
    reader = FsspecWeightStore("s3://looprl-weights/run-c", storage_options=opts(endpoint))
    with pytest.raises(WeightStoreError, match="version 2: blob damaged"):
        reader.fetch(2)
    got = reader.load(2)
    assert got.version == 0 and got.fallback and same(got.state_dict, as_bf16(vs[0]))
