"""A tiny training run that checkpoints every 2 steps and resumes from the latest checkpoint.

    python resume_worker.py CKPT_DIR LOG_FILE OUT_FILE [STEPS]

Batch i is a pure function of i; dropout draws from torch's global RNG, so an exact resume needs
the RNG state restored too. Each trained batch index is appended to LOG_FILE; final weights go to
OUT_FILE (safetensors).
"""

import sys
import time

import safetensors.torch
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint


def batch(i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randint(0, 64, (2, 12), generator=g)


def main() -> None:
    ckpt, log_path, out = sys.argv[1:4]
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.2)
    model = LlamaForCausalLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start = 0
    path = latest_checkpoint(ckpt)
    with open(log_path, "a") as log:
        if path is not None:
            start = load_checkpoint(path, model, opt).sampler_state["next"]
            log.write(f"resume {start}\n")
            log.flush()
        for i in range(start, steps):
            x = batch(i)
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()
            log.write(f"{i}\n")
            log.flush()
            if (i + 1) % 2 == 0:
                save_checkpoint(ckpt, i + 1, model, opt, sampler_state={"next": i + 1},
                                weight_version=i + 1)
            time.sleep(0.05)
    safetensors.torch.save_model(model, out)


if __name__ == "__main__":
    main()
