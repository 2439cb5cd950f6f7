"""Delta weight sync: bytes and latency of publishing / applying successive policy versions.

    .venv/bin/python benchmarks/weights.py [--versions 8] [--lr 1e-4] [--store both|local|s3]
                                           [--lora 8 --lora-lr 1e-4]

Workload: a ~10M-parameter Llama (2,048 vocab) takes real AdamW steps at the quickstart's RL
learning rate (``[grpo] lr = 1e-4`` in configs/quickstart.toml; ``--lr 1e-5`` for a pretrained
model's) on byte-tokenized Python source between versions. The same sequence of weights goes to
every arm, so they compare on identical updates.

Baseline: the same store publishing every version as a zstd-compressed full snapshot
(``full_every=1``), i.e. what a reader fetches without deltas. It is the fair baseline because it
pays the same transport-dtype conversion, checksums and manifest as a delta, and is already
compressed; the uncompressed bf16 snapshot (2 bytes a parameter) is printed beside it as the
flattering one. Delta and full publishes alternate version by version, so load on a shared
machine hits both alike; times are medians.

Stores: ``local`` (a directory) and ``s3`` — a real S3 API on loopback (moto's server in a child
process, reached by s3fs over HTTP, as ``fleet.experimental.weights_url = "s3://..."`` with
``weights_options.endpoint_url`` would), where bytes cost time. ``--store both`` (default) runs
both; ``s3`` needs ``pip install s3fs 'moto[server]'`` (the test extra).

``--lora RANK`` also trains a LoRA adapter of that rank (``looprl.models.lora``) on the same
model and batches and publishes its merged weights, as ``looprl train -o model.lora.rank=…``
syncs them: its delta bytes are printed beside full fine-tuning's, with their ratio.

Last line, for the default store config (``WeightStoreConfig``) through S3 (local without it):
``delta_vs_full_zstd=`` mean delta bytes / zstd full snapshot bytes (the headline),
``delta_bytes_fraction=`` the same over the uncompressed bf16 snapshot (flattering; the figure
earlier versions of this benchmark printed),
``publish_ms=`` / ``publish_full_ms=`` and ``apply_ms=`` / ``fetch_full_ms=`` (a reader holding
v-1 rebuilds v / a reader fetches full v), ``speedup=`` (full publish + fetch) / (delta
publish + apply) in wall time, and ``speedup_cpu=`` the same in CPU time of this process and
the S3 server's (steadier than wall time on a shared machine).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.models.config import LoraSettings
from looprl.models.lora import merged_state_dict, with_lora
from looprl.weights.store import FsspecWeightStore, WeightStoreConfig

ARMS = [("zigzag", 1), ("zigzag", 3), ("zigzag_sorted", 1)]
"""(codec, zstd level) pairs measured against the full-snapshot baseline."""
_SERVE = ("from moto.moto_server.threaded_moto_server import ThreadedMotoServer as S\n"
          "import threading\n"
          "s = S('127.0.0.1', 0, verbose=False); s.start()\n"
          "print(s.get_host_and_port()[1], flush=True); threading.Event().wait()")


def model_10m() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=2048, hidden_size=320, intermediate_size=864, num_hidden_layers=8,
                      num_attention_heads=5, num_key_value_heads=5, max_position_embeddings=512,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def source_batches(batch: int, seq: int) -> Iterator[torch.Tensor]:
    files = sorted(Path(sysconfig.get_paths()["purelib"], "torch", "optim").glob("*.py"))
    data = torch.tensor(list(b"".join(f.read_bytes() for f in files)), dtype=torch.long)
    step = batch * seq
    for i in range(0, len(data) - step, step):
        yield data[i:i + step].reshape(batch, seq)


def train_versions(n: int, lr: float, lora_rank: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` versions of the weights an engine is sent: the model's, or with ``lora_rank`` the
    merged weights of a LoRA adapter trained on the frozen model."""
    model = with_lora(model_10m(), LoraSettings(rank=lora_rank))
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params", file=sys.stderr)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    batches = source_batches(4, 128)
    versions = [{k: v.clone() for k, v in merged_state_dict(model).items()}]
    for _ in range(n - 1):
        x = next(batches)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        versions.append({k: v.clone() for k, v in merged_state_dict(model).items()})
    return versions


@contextlib.contextmanager
def s3_server() -> Iterator[dict[str, Any]]:
    """Storage options of a moto S3 server on a free loopback port, in a child process."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVE], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise SystemExit(f"moto server did not start (printed {line!r}); "
                             "pip install s3fs 'moto[server]' or run with --store local")
        yield {"endpoint_url": f"http://127.0.0.1:{int(line)}", "key": "bench", "secret": "bench",
               "skip_instance_cache": True,  # a client per store, as on separate nodes
               "_pid": proc.pid}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def server_cpu_s(options: dict[str, Any]) -> float:
    """CPU-seconds the S3 server's process has used (0 without one): its share of the work."""
    pid = options.get("_pid")
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Clock:
    """Wall ms and CPU ms (this process and the S3 server's) of one timed call."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def __enter__(self) -> Clock:
        self.w, self.c = time.perf_counter(), time.process_time() + server_cpu_s(self.options)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_ms = (time.perf_counter() - self.w) * 1e3
        self.cpu_ms = (time.process_time() + server_cpu_s(self.options) - self.c) * 1e3


def open_store(where: str, name: str, options: dict[str, Any], **kw: Any) -> FsspecWeightStore:
    url = f"s3://bench/{name}" if options else f"{where}/{name}"
    return FsspecWeightStore(url, storage_options={k: v for k, v in options.items() if k != "_pid"},
                             **kw)


def measure(versions: list[dict[str, torch.Tensor]], codec: str, level: int, where: str,
            options: dict[str, Any], tag: str) -> dict[str, float]:
    """Delta arm and full-snapshot arm on the same versions, publishes interleaved."""
    kw = {"codec": codec, "zstd_level": level}
    delta = open_store(where, f"{tag}-delta", options, full_every=len(versions) + 1, **kw)
    full = open_store(where, f"{tag}-full", options, full_every=1, **kw)
    d_bytes, f_bytes, d_pub, f_pub = [], [], [], []
    for v, sd in enumerate(versions):
        for store, times, sizes in ((delta, d_pub, d_bytes), (full, f_pub, f_bytes))[::(-1) ** v]:
            with Clock(options) as c:
                store.publish(sd, v)
            times.append(c)
            sizes.append(store.last_publish.blob_bytes)
    d_reader = open_store(where, f"{tag}-delta", options)
    f_reader = open_store(where, f"{tag}-full", options)
    d_reader.fetch(0)
    apply: list[Clock] = []
    fetch: list[Clock] = []
    for v in range(1, len(versions)):
        for reader, times in ((d_reader, apply), (f_reader, fetch))[::(-1) ** v]:
            with Clock(options) as c:
                reader.fetch(v)
            times.append(c)
    n_params = sum(t.numel() for k, t in versions[0].items() if k != "lm_head.weight")

    def med(cs: list[Clock], what: str = "wall_ms") -> float:
        return statistics.median(getattr(c, what) for c in cs)

    return {"delta_bytes": statistics.mean(d_bytes[1:]), "full_bytes": statistics.mean(f_bytes[1:]),
            "raw_bf16": 2 * n_params, "publish_ms": med(d_pub[1:]), "publish_full_ms": med(f_pub[1:]),
            "apply_ms": med(apply), "fetch_full_ms": med(fetch),
            "cpu_delta_ms": med(d_pub[1:], "cpu_ms") + med(apply, "cpu_ms"),
            "cpu_full_ms": med(f_pub[1:], "cpu_ms") + med(fetch, "cpu_ms")}


def report(label: str, r: dict[str, float]) -> str:
    speedup = (r["publish_full_ms"] + r["fetch_full_ms"]) / (r["publish_ms"] + r["apply_ms"])
    return (f"delta_vs_full_zstd={r['delta_bytes'] / r['full_bytes']:.4f} "
            f"delta_bytes_fraction={r['delta_bytes'] / r['raw_bf16']:.4f} "
            f"publish_ms={r['publish_ms']:.0f} publish_full_ms={r['publish_full_ms']:.0f} "
            f"apply_ms={r['apply_ms']:.0f} fetch_full_ms={r['fetch_full_ms']:.0f} "
            f"speedup={speedup:.2f} speedup_cpu={r['cpu_full_ms'] / r['cpu_delta_ms']:.2f} "
            f"store={label}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--versions", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4, help="the quickstart's RL rate")
    ap.add_argument("--store", choices=("both", "local", "s3"), default="both")
    ap.add_argument("--lora", type=int, default=0, help="also a LoRA adapter of this rank")
    ap.add_argument("--lora-lr", type=float, default=1e-4, help="LoRA's rate")
    args = ap.parse_args()
    torch.set_num_threads(2)
    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines()
        if ln.startswith("Model name")), "unknown CPU")
    print(f"cpu: {cpu}; lr {args.lr}, {args.versions} versions", file=sys.stderr)
    versions = train_versions(args.versions, args.lr)
    default = WeightStoreConfig()
    arms = ARMS if (default.codec, default.zstd_level) in ARMS else \
        [(default.codec, default.zstd_level), *ARMS]
    stores = ["local", "s3"] if args.store == "both" else [args.store]
    last = {}
    with tempfile.TemporaryDirectory() as where, contextlib.ExitStack() as stack:
        for label in stores:
            options = stack.enter_context(s3_server()) if label == "s3" else {}
            for codec, level in arms:
                r = measure(versions, codec, level, where, options, f"{label}-{codec}-{level}")
                mark = "  (default)" if (codec, level) == (default.codec, default.zstd_level) else ""
                print(f"{label:5s} {codec:13s} zstd{level}: {report(label, r)}{mark}", flush=True)
                if mark:
                    last[label] = r
            if args.lora:
                lora = measure(train_versions(args.versions, args.lora_lr, args.lora),
                               default.codec, default.zstd_level, where, options, f"{label}-lora")
                ratio = lora["delta_bytes"] / last[label]["delta_bytes"]
                print(f"{label:5s} lora rank {args.lora}: {report(label, lora)} "
                      f"({ratio:.2f}x full fine-tuning's delta bytes)")
    print(report(stores[-1], last[stores[-1]]))


if __name__ == "__main__":
    main()
