"""Rollout-engine benchmark: TorchEngine vs HF ``generate`` on the same model, seed and workload.

    .venv/bin/python benchmarks/engine.py                 # default model, ~2-3 minutes
    .venv/bin/python benchmarks/engine.py --size medium --threads 1
    .venv/bin/python benchmarks/engine.py --vllm          # vLLM (`make vllm`) as one more baseline

Workload (an agent group): G=8 rollouts of one ~1,000-token prompt, 3 turns of 256 new tokens
(end-of-turn ignored so lengths are equal), ~200 tool-output tokens appended between turns.
- TorchEngine: the G trajectories run concurrently through the Engine protocol (session_id =
  trajectory, group_id = group), as the harness drives it; a full weight update is applied
  mid-decoding and its latency measured.
- HF per rollout: ``model.generate`` for one rollout, turn by turn (timed on one rollout: the
  rate does not depend on how many are run one after another).
- HF batched: ``model.generate`` over the G rollouts of the group at once, turn by turn.
- vLLM (``--vllm``): ``VLLMEngine`` (vLLM's CPU build in its worker process, ``--threads``
  OpenMP threads, fp32, prefix caching) driven exactly as TorchEngine, the same weight update
  included. Its CPU time is another process's: only its wall-clock rate is compared.
peak_fraction = tok_s x 2 x params / matmul peak measured in this run (model dtype).
The contestants run interleaved turn by turn so they see the same machine load; tok/s per
CPU-second is printed too (steadier than wall time on a shared machine). The last line is
machine-readable.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from looprl.inference.torch_engine import TorchEngine
from looprl.models.loading import load_model
from looprl.models.tiny import default_model_dir, python_sources
from looprl.types import SamplingParams

console = Console()


def matmul_peak_gflops(dtype: torch.dtype, n: int = 1024, seconds: float = 1.0) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9


def build_workload(tok, prompt_tokens: int, tool_tokens: int, turns: int) -> tuple[list[int], list[list[int]]]:
    """A chat-rendered prompt of ~prompt_tokens and the tool outputs inserted after each turn."""
    code = iter(python_sources(max_chars=400_000, seed=1))
    text = ""
    while len(tok.encode(text)) < prompt_tokens:
        text += next(code)[:3000]
    ids = tok.encode(text)[:prompt_tokens]
    msgs = [{"role": "user", "content": "Fix the failing test in this file:\n" + tok.decode(ids)}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    tools = []
    for _ in range(turns - 1):
        out = tok.encode(next(code))[:tool_tokens]
        tools.append(tok.encode("<|im_end|>\n<|im_start|>tool\n") + out
                     + tok.encode("<|im_end|>\n<|im_start|>assistant\n"))
    return list(prompt), tools


@dataclass
class Contestant:
    """Accumulated wall and CPU seconds and generated tokens of one contestant."""

    name: str
    wall_s: float = 0.0
    cpu_s: float = 0.0
    tokens: int = 0

    def timed(self, fn):
        w, c = time.perf_counter(), time.process_time()
        self.tokens += fn()
        self.wall_s += time.perf_counter() - w
        self.cpu_s += time.process_time() - c

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def tok_cpu_s(self) -> float:
        return self.tokens / self.cpu_s


class EngineRun:
    """G concurrent trajectories through the Engine protocol, one turn at a time."""

    def __init__(self, engine: TorchEngine, prompt: list[int], tools: list[list[int]], G: int, N: int):
        self.engine, self.tools, self.G, self.N = engine, tools, G, N
        self.ctx_G = [list(prompt) for _ in range(G)]
        self.update_ms: list[float] = []

    def turn(self, t: int, state_dict=None) -> int:
        return asyncio.run(self._turn(t, state_dict))

    async def _turn(self, t: int, state_dict) -> int:
        async def one(i: int) -> int:
            g = await self.engine.generate(self.ctx_G[i], SamplingParams(max_new_tokens=self.N, seed=100 * i + t),
                                           session_id=f"t{i}", group_id="g0")
            self.ctx_G[i] += list(g.token_ids) + (self.tools[t] if t < len(self.tools) else [])
            if t == len(self.tools):
                await self.engine.release(f"t{i}")
            return len(g.token_ids)

        async def updater() -> None:  # a full weight update while the group is decoding
            target = self.engine.stats.generated_tokens + self.G * self.N // 2
            while self.engine.stats.generated_tokens < target:
                await asyncio.sleep(0.02)  # coarse: polling must not steal the decode thread's GIL
            t0 = time.perf_counter()
            await self.engine.update_weights(state_dict, version=1)
            self.update_ms.append((time.perf_counter() - t0) * 1e3)

        up = asyncio.create_task(updater()) if state_dict is not None else None
        counts = await asyncio.gather(*[one(i) for i in range(self.G)])
        if up is not None:
            await up
        return sum(counts)


class HFRun:
    """HF ``generate`` turn by turn for ``batch`` rollouts at once (logits kept, as RL needs them)."""

    def __init__(self, model, prompt: list[int], tools: list[list[int]], batch: int, N: int):
        self.model, self.tools, self.N = model, tools, N
        self.ctx = torch.tensor([prompt] * batch)

    def turn(self, t: int) -> int:
        out = self.model.generate(self.ctx, attention_mask=torch.ones_like(self.ctx), do_sample=True,
                                  top_p=1.0, temperature=1.0, max_new_tokens=self.N,
                                  min_new_tokens=self.N, pad_token_id=0, output_scores=True,
                                  return_dict_in_generate=True)
        new = out.sequences.shape[1] - self.ctx.shape[1]
        self.ctx = out.sequences
        if t < len(self.tools):
            self.ctx = torch.cat([self.ctx, torch.tensor([self.tools[t]] * self.ctx.shape[0])], dim=1)
        return new * self.ctx.shape[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--model", type=Path, default=None, help="an HF model dir (default: build one)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--tool-tokens", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--vllm", action="store_true", help="add VLLMEngine (needs `make vllm`)")
    ap.add_argument("--engine-only", action="store_true",
                    help="skip the HF baselines (compare model sizes: --size tiny|small|medium)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = args.model or default_model_dir(args.size)
    lm = load_model(path, dtype=args.dtype)
    model, tok = lm.model, lm.tokenizer
    model.generation_config.eos_token_id = None  # equal lengths: ignore end-of-turn everywhere
    params = lm.num_params
    prompt, tools = build_workload(tok, args.prompt_tokens, args.tool_tokens, args.turns)
    G, N = args.group, args.new_tokens
    console.print(f"model {path.name if hasattr(path, 'name') else path}: {params / 1e6:.2f}M params, "
                  f"{args.dtype}, {args.threads} threads; prompt {len(prompt)} tokens, G={G}, "
                  f"{args.turns} turns x {N} new tokens, tool outputs {[len(t) for t in tools]} tokens")

    peak = matmul_peak_gflops(model.dtype)
    console.print(f"matmul peak ({model.dtype}): {peak:.0f} GFLOP/s")

    engine = TorchEngine(model, tok, stop_on_eos=False, max_len=4096)
    state_dict = {k: v.clone() for k, v in model.state_dict().items()}
    eng, hf1, hfb = Contestant("TorchEngine"), Contestant("HF per rollout"), Contestant("HF batched")
    runs = (EngineRun(engine, prompt, tools, G, N), HFRun(model, prompt, tools, 1, N),
            HFRun(model, prompt, tools, G, N))
    vl, vrun = Contestant("vLLM"), None
    if args.vllm:
        from looprl.inference.vllm_engine import VLLMEngine
        vrun = EngineRun(VLLMEngine(str(path), stop_on_eos=False, max_model_len=4096,  # type: ignore[arg-type]
                                    threads=args.threads), prompt, tools, G, N)
    # Interleaved turn by turn, so the three see the same load on a shared machine.
    for t in range(args.turns):
        eng.timed(lambda t=t: runs[0].turn(t, state_dict if t == 0 else None))
        if args.engine_only:
            continue
        hf1.timed(lambda t=t: runs[1].turn(t))
        hfb.timed(lambda t=t: runs[2].turn(t))
        if vrun is not None:
            vl.timed(lambda t=t: vrun.turn(t, state_dict if t == 0 else None))
        console.print(f"turn {t + 1}/{args.turns}: " + ", ".join(
            f"{c.name} {c.tokens} tok {c.tok_s:.0f} tok/s" for c in (eng, hf1, hfb, vl) if c.tokens))
    st = engine.stats
    engine.close()
    update_ms = runs[0].update_ms[0]
    if args.engine_only:
        print(f"size={args.size} params={params} tok_s={eng.tok_s:.0f} tok_cpu_s={eng.tok_cpu_s:.0f} "
              f"weight_update_ms={update_ms:.1f}")
        return
    console.print(f"prefilled {st.prefilled_tokens} of {st.prompt_tokens} prompt tokens: group sharing "
                  f"saved {st.reused_group_tokens}, session KV reuse saved {st.reused_session_tokens}; "
                  f"weight update during decoding {update_ms:.1f} ms")
    console.print("per CPU-second (robust to other load): " + ", ".join(
        f"{c.name} {c.tok_cpu_s:.0f}" for c in (eng, hf1, hfb))
        + f" -> {eng.tok_cpu_s / hf1.tok_cpu_s:.1f}x / {eng.tok_cpu_s / hfb.tok_cpu_s:.1f}x")
    vs_vllm = ""
    if vrun is not None:
        vst = vrun.engine.stats
        console.print(f"vLLM: {vl.tok_s:.0f} tok/s; its prefix cache served {vst.cached_prompt_tokens} "
                      f"of {vst.prompt_tokens} prompt tokens; weight update {vrun.update_ms[0]:.1f} ms")
        vrun.engine.close()
        vs_vllm = (f" vllm_tok_s={vl.tok_s:.0f} speedup_vs_vllm_batched={eng.tok_s / vl.tok_s:.2f}"
                   f" vllm_weight_update_ms={vrun.update_ms[0]:.1f}")
    tok_s, hf1, hfb = eng.tok_s, hf1.tok_s, hfb.tok_s
    frac = tok_s * 2 * params / (peak * 1e9)
    console.print(f"speed-up: {tok_s / hf1:.1f}x vs HF per rollout, {tok_s / hfb:.1f}x vs HF batched; "
                  f"{frac * 100:.2f}% of matmul peak")
    print(f"tok_s={tok_s:.0f} hf_per_rollout_tok_s={hf1:.0f} hf_batched_tok_s={hfb:.0f} "
          f"speedup_vs_hf_per_rollout={tok_s / hf1:.2f} speedup_vs_hf_batched={tok_s / hfb:.2f} "
          f"peak_fraction={frac:.4f} weight_update_ms={update_ms:.1f}{vs_vllm}")


if __name__ == "__main__":
    main()
