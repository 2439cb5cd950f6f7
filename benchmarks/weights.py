"""Delta weight sync: bytes and latency of publishing / applying successive policy versions.

    .venv/bin/python benchmarks/weights.py [--versions 8] [--lr 1e-5] [--lora 8 --lora-lr 1e-4]

Workload: a ~10M-parameter Llama (2,048 vocab) takes real AdamW steps (lr as in RL, 1e-5) on
byte-tokenized Python source between versions; every version is published to a local store. The
same sequence of weights is published with each codec and transport dtype, so they compare on
identical updates. The baseline is a full bf16 snapshot (2 bytes per parameter, uncompressed).

``--lora RANK`` also trains a LoRA adapter of that rank (``looprl.models.lora``) on the same
model and batches and publishes its merged weights, as ``looprl train -o model.lora.rank=…``
syncs them: its delta bytes are printed beside full fine-tuning's, with their ratio.

Last line: ``delta_bytes_fraction=… publish_ms=… apply_ms=…`` for the default store config:
mean bytes of a delta version / full bf16 snapshot, mean publish time of a delta version, mean
time for a reader holding version v-1 to reconstruct version v.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.models.lora import LoraSettings, merged_state_dict, with_lora
from looprl.weights.delta import CODECS
from looprl.weights.store import LocalWeightStore, WeightStoreConfig


def model_10m() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=2048, hidden_size=320, intermediate_size=864, num_hidden_layers=8,
                      num_attention_heads=5, num_key_value_heads=5, max_position_embeddings=512,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def source_batches(batch: int, seq: int):
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


def measure(versions: list[dict[str, torch.Tensor]], dtype: str, codec: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        pub = LocalWeightStore(d, full_every=len(versions) + 1, dtype=dtype, codec=codec)
        sizes, pub_ms = [], []
        for v, sd in enumerate(versions):
            t0 = time.perf_counter()
            pub.publish(sd, v)
            pub_ms.append((time.perf_counter() - t0) * 1e3)
            sizes.append(pub.last_publish.blob_bytes)
        reader = LocalWeightStore(d)
        t0 = time.perf_counter()
        reader.fetch(0)
        full_fetch_ms = (time.perf_counter() - t0) * 1e3
        apply_ms = []
        for v in range(1, len(versions)):
            t0 = time.perf_counter()
            reader.fetch(v)
            apply_ms.append((time.perf_counter() - t0) * 1e3)
        raw = pub.last_publish.raw_bytes
    n_params = sum(t.numel() for k, t in versions[0].items() if k != "lm_head.weight")
    bf16_full = 2 * n_params
    return {"delta_bytes_fraction": sum(sizes[1:]) / len(sizes[1:]) / bf16_full,
            "full_compressed_fraction": sizes[0] / bf16_full, "raw_fraction": raw / bf16_full,
            "publish_full_ms": pub_ms[0], "publish_ms": sum(pub_ms[1:]) / len(pub_ms[1:]),
            "fetch_full_ms": full_fetch_ms, "apply_ms": sum(apply_ms) / len(apply_ms)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--versions", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--lora", type=int, default=0, help="also a LoRA adapter of this rank")
    ap.add_argument("--lora-lr", type=float, default=1e-4, help="LoRA's rate (~10x full's)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    versions = train_versions(args.versions, args.lr)
    results = {}
    for dtype in ("bfloat16", "float32"):
        for codec in CODECS:
            r = results[(dtype, codec)] = measure(versions, dtype, codec)
            print(f"{dtype:9s} {codec}: delta/bf16_full={r['delta_bytes_fraction']:.4f} "
                  f"full_zstd/bf16_full={r['full_compressed_fraction']:.3f} "
                  f"publish full={r['publish_full_ms']:.0f}ms delta={r['publish_ms']:.0f}ms "
                  f"fetch full={r['fetch_full_ms']:.0f}ms apply delta={r['apply_ms']:.0f}ms")
    default = WeightStoreConfig()
    r = results[(default.dtype, default.codec)]
    if args.lora:
        lora = measure(train_versions(args.versions, args.lora_lr, args.lora), default.dtype,
                       default.codec)
        print(f"lora rank {args.lora}: delta/bf16_full={lora['delta_bytes_fraction']:.4f} "
              f"({lora['delta_bytes_fraction'] / r['delta_bytes_fraction']:.2f}x full "
              f"fine-tuning's) publish delta={lora['publish_ms']:.0f}ms "
              f"apply delta={lora['apply_ms']:.0f}ms")
    print(f"delta_bytes_fraction={r['delta_bytes_fraction']:.4f} publish_ms={r['publish_ms']:.1f} "
          f"apply_ms={r['apply_ms']:.1f}")


if __name__ == "__main__":
    main()
