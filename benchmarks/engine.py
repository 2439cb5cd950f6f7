"""Rollout-engine benchmark: TorchEngine vs HF ``generate`` and vLLM on the same model, seed and workload.

    .venv/bin/python benchmarks/engine.py                 # default model, several minutes on 2 cores
    .venv/bin/python benchmarks/engine.py --size medium --threads 1
    .venv/bin/python benchmarks/engine.py --vllm --threads 2   # vLLM (`make vllm`) as two more baselines

Workload (an agent group): G=8 rollouts of one ~1,000-token prompt, 3 turns of 256 new tokens
(end-of-turn ignored so lengths are equal), ~200 tool-output tokens appended between turns.
- TorchEngine: the G trajectories run concurrently through the Engine protocol (session_id =
  trajectory, group_id = group), as the harness drives it; a full weight update is applied
  mid-decoding and its latency measured.
- HF with reuse (the headline's baseline): ``model.generate`` over the G rollouts at once, given
  the tricks the engine has: the shared prompt prefilled once and its KV cache expanded to the
  group (``DynamicCache.batch_repeat_interleave``), and each rollout's cache
  (``past_key_values``) carried across turns, so a turn prefills only the tool output. This is
  the fair baseline: the same prefill work as the engine, the same batch, HF's own decode loop.
- HF batched: ``generate`` over the group, re-prefilling the whole context every turn (what a
  stateless caller does; flattering to the engine, whose prefix and session reuse it lacks).
- HF per rollout: ``generate`` for one rollout, turn by turn (more flattering still).
- vLLM batched (``--vllm``; the fair vLLM baseline): ``VLLMEngine`` (vLLM's CPU build in its
  worker process) driven exactly as TorchEngine: the same G concurrent trajectories through the
  Engine protocol, the same weights (it loads the same checkpoint), fp32 as TorchEngine runs,
  ``--threads`` OpenMP threads against TorchEngine's ``--threads`` decode threads, its automatic
  prefix caching standing for the engine's group and session reuse, and the same full weight
  update mid-decoding (after which vLLM, as RL needs, reuses no KV the old weights computed).
- vLLM per rollout: the same engine given one rollout at a time, turn by turn (flattering, as
  HF per rollout is: it leaves vLLM's continuous batching nothing to batch; it may find the
  repetition's prompt in vLLM's prefix cache, left there by vLLM batched at the same version).
vLLM's CPU time is its worker processes', so only wall-clock rates are compared with it.

Fair timing: every contestant first runs one untimed warm-up round (all turns of a workload of
its own, the weight update included), so one-time costs are left out: in one run without it,
vLLM's first turn ran at 41 tok/s and its later ones at ~136 and ~320 (set-up on first use in
its CPU kernels and KV blocks, or the neighbours' load: a single run cannot tell), and torch
allocates its caches on first use too. Then ``--reps`` timed repetitions (3 by
default), each on a fresh workload (other code in the prompt and tool outputs: no contestant
reuses KV an earlier repetition computed), the contestants interleaved turn by turn, the order
rotated each repetition, so that they see the same load on a shared machine. Every rate is
reported as the median over repetitions with its min-max spread, and every ratio as the median
of the per-repetition ratios (the same repetition's load in numerator and denominator).

Peak fraction: before the contest, a quiet phase measures the machine's matmul peak in fp32 and
bf16 (best of several windows of square matmuls) per CPU-second of this process; the engine's
FLOPs per CPU-second are divided by it. The numerator counts every FLOP the engine had to do:
the linear layers on each token it prefilled or generated (the embedding lookup is no matmul;
the LM head is) and attention (QK^T and AV over the context, 4 x layers x width x position a
token). Per CPU-second, because wall time on a shared machine measures the neighbours.

tok/s per CPU-second is printed too (steadier than wall time on a shared machine). The last line
is machine-readable and leads with ``speedup_vs_hf_reuse=``; with ``--vllm`` it ends with
``speedup_vs_vllm_per_rollout=`` and ``speedup_vs_vllm_batched=``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from looprl.inference.torch_engine import TorchEngine
from looprl.models.loading import load_model
from looprl.models.tiny import default_model_dir, python_sources
from looprl.types import SamplingParams

console = Console()


def matmul_peak(dtype: torch.dtype, n: int = 1024, windows: int = 5, seconds: float = 0.6
                ) -> tuple[float, float]:
    """(GFLOP/s of wall time, GFLOP per CPU-second), each the best of ``windows`` windows of
    back-to-back n x n matmuls: the best window is the one least disturbed by other load."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best_wall = best_cpu = 0.0
    for _ in range(windows):
        reps, w0, c0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - w0 < seconds:
            a @ b
            reps += 1
        flops = 2 * n**3 * reps / 1e9
        best_wall = max(best_wall, flops / (time.perf_counter() - w0))
        best_cpu = max(best_cpu, flops / max(time.process_time() - c0, 1e-9))
    return best_wall, best_cpu


def flops_per_token(model) -> tuple[float, float]:
    """(linear-layer FLOPs a token, attention FLOPs a token per context position)."""
    cfg = model.config
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    width = cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    return 2.0 * linear, 4.0 * cfg.num_hidden_layers * width


def attention_positions(prompt: int, tools: list[int], G: int, N: int, turns: int) -> int:
    """Sum of the context positions of every token the engine prefills or generates: the prompt
    once (shared by the group), then per rollout each turn's N new tokens and its tool output."""
    total = prompt * (prompt - 1) // 2
    for _ in range(G):
        pos = prompt
        for t in range(turns):
            for count in (N, tools[t] if t < len(tools) else 0):
                total += count * pos + count * (count - 1) // 2
                pos += count
    return total


def build_workload(tok, prompt_tokens: int, tool_tokens: int, turns: int, seed: int = 1
                   ) -> tuple[list[int], list[list[int]]]:
    """A chat-rendered prompt of ~prompt_tokens and the tool outputs inserted after each turn;
    another ``seed`` draws other code (a fresh workload for each repetition)."""
    code = iter(python_sources(max_chars=400_000, seed=seed))
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
    """One contestant's generated tokens, wall and CPU seconds in each timed repetition."""

    name: str
    reps: list[list[float]] = field(default_factory=list)
    """[tokens, wall_s, cpu_s] per repetition."""

    def timed(self, rep: int, fn) -> None:
        while len(self.reps) <= rep:
            self.reps.append([0, 0.0, 0.0])
        w, c = time.perf_counter(), time.process_time()
        tokens = fn()
        self.reps[rep][0] += tokens
        self.reps[rep][1] += time.perf_counter() - w
        self.reps[rep][2] += time.process_time() - c

    @property
    def tokens(self) -> int:
        return int(sum(r[0] for r in self.reps))

    @property
    def cpu_s(self) -> float:
        return sum(r[2] for r in self.reps)

    @property
    def wall_s(self) -> float:
        return sum(r[1] for r in self.reps)

    def tok_s(self) -> list[float]:
        return [r[0] / r[1] for r in self.reps]

    def tok_cpu_s(self) -> list[float]:
        return [r[0] / r[2] for r in self.reps]


def spread(xs: list[float], fmt: str = ".0f") -> str:
    """``median (min-max)`` of per-repetition values."""
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def span(xs: list[float]) -> str:
    """``min-max`` of per-repetition ratios (no space: one key=value of the last line)."""
    return f"{min(xs):.2f}-{max(xs):.2f}"


def ratios(a: list[float], b: list[float]) -> list[float]:
    """Per-repetition ratios a / b: each under that repetition's load."""
    return [x / y for x, y in zip(a, b, strict=True)]


class EngineRun:
    """G concurrent trajectories through the Engine protocol, one turn at a time."""

    def __init__(self, engine, prompt: list[int], tools: list[list[int]], G: int, N: int,
                 tag: str, update=None):
        """``tag`` names this run's group and sessions; ``update`` = (state_dict, version) is
        applied mid-decoding in the first turn."""
        self.engine, self.tools, self.G, self.N, self.tag = engine, tools, G, N, tag
        self.ctx_G = [list(prompt) for _ in range(G)]
        self.update = update
        self.update_ms: list[float] = []

    def turn(self, t: int) -> int:
        return asyncio.run(self._turn(t, self.update if t == 0 else None))

    async def _turn(self, t: int, update) -> int:
        async def one(i: int) -> int:
            g = await self.engine.generate(self.ctx_G[i], SamplingParams(max_new_tokens=self.N, seed=100 * i + t),
                                           session_id=f"{self.tag}t{i}", group_id=f"{self.tag}g")
            self.ctx_G[i] += list(g.token_ids) + (self.tools[t] if t < len(self.tools) else [])
            if t == len(self.tools):
                await self.engine.release(f"{self.tag}t{i}")
            return len(g.token_ids)

        async def updater(state_dict, version: int) -> None:  # a full weight update mid-decoding
            target = self.engine.stats.generated_tokens + self.G * self.N // 2
            while self.engine.stats.generated_tokens < target:
                await asyncio.sleep(0.02)  # coarse: polling must not steal the decode thread's GIL
            t0 = time.perf_counter()
            await self.engine.update_weights(state_dict, version=version)
            self.update_ms.append((time.perf_counter() - t0) * 1e3)

        up = asyncio.create_task(updater(*update)) if update is not None else None
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


class HFReuseRun:
    """HF ``generate`` over the group with the engine's reuse: the prompt prefilled once and its
    cache expanded to the G rollouts; each turn continues from the rollouts' cache, so only the
    tokens the cache lacks (the last sampled token and the tool output) are prefilled."""

    def __init__(self, model, prompt: list[int], tools: list[list[int]], G: int, N: int):
        from transformers import DynamicCache

        self.model, self.tools, self.N, self.G = model, tools, N, G
        self.prompt = torch.tensor([prompt])
        self.cache = DynamicCache(config=model.config)
        self.ctx: torch.Tensor | None = None

    def turn(self, t: int) -> int:
        if self.ctx is None:  # the shared prefill, once, as the engine's group sharing does
            with torch.no_grad():
                self.model(self.prompt[:, :-1], past_key_values=self.cache, use_cache=True)
            self.cache.batch_repeat_interleave(self.G)
            self.ctx = self.prompt.repeat(self.G, 1)
        out = self.model.generate(self.ctx, attention_mask=torch.ones_like(self.ctx),
                                  past_key_values=self.cache, do_sample=True, top_p=1.0,
                                  temperature=1.0, max_new_tokens=self.N, min_new_tokens=self.N,
                                  pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        new = out.sequences.shape[1] - self.ctx.shape[1]
        self.cache = out.past_key_values
        self.ctx = out.sequences
        if t < len(self.tools):
            self.ctx = torch.cat([self.ctx, torch.tensor([self.tools[t]] * self.G)], dim=1)
        return new * self.G


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
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (after one warm-up round)")
    ap.add_argument("--vllm", action="store_true", help="add VLLMEngine (needs `make vllm`)")
    ap.add_argument("--engine-only", action="store_true",
                    help="skip the baselines (compare model sizes: --size tiny|small|medium)")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error(f"--reps must be at least 1, got {args.reps}")
    if args.vllm and args.engine_only:
        ap.error("--vllm adds baselines and --engine-only skips them: choose one")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = args.model or default_model_dir(args.size)
    lm = load_model(path, dtype=args.dtype)
    model, tok = lm.model, lm.tokenizer
    model.generation_config.eos_token_id = None  # equal lengths: ignore end-of-turn everywhere
    params = lm.num_params
    # workload 0 is the warm-up round's; 1..reps the timed repetitions'
    loads = [build_workload(tok, args.prompt_tokens, args.tool_tokens, args.turns, seed=1 + r)
             for r in range(args.reps + 1)]
    G, N = args.group, args.new_tokens
    console.print(f"model {path.name if hasattr(path, 'name') else path}: {params / 1e6:.2f}M params, "
                  f"{args.dtype}, {args.threads} threads; prompt {len(loads[1][0])} tokens, G={G}, "
                  f"{args.turns} turns x {N} new tokens, tool outputs {[len(t) for t in loads[1][1]]} "
                  f"tokens; 1 warm-up round + {args.reps} timed repetitions")

    # quiet phase first: nothing else of this process runs while the peaks are measured
    peaks = {d: matmul_peak(d) for d in (torch.float32, torch.bfloat16)}
    for d, (wall, cpu) in peaks.items():
        console.print(f"matmul peak {d}: {wall:.0f} GFLOP/s wall, {cpu:.0f} GFLOP per CPU-second")

    engine = TorchEngine(model, tok, stop_on_eos=False, max_len=4096, num_threads=args.threads)
    state_dict = {k: v.clone() for k, v in model.state_dict().items()}
    vllm = None
    if args.vllm:
        from looprl.inference.vllm_engine import VLLMEngine

        vllm = VLLMEngine(str(path), stop_on_eos=False, max_model_len=4096, threads=args.threads)
    versions = itertools.count(1)

    def runs(load: tuple[list[int], list[list[int]]], tag: str) -> dict[str, Any]:
        """Every contestant's run of one workload."""
        prompt, tools = load
        out: dict[str, Any] = {"TorchEngine": EngineRun(engine, prompt, tools, G, N, tag,
                                                        (state_dict, next(versions)))}
        if not args.engine_only:
            out |= {"HF with reuse": HFReuseRun(model, prompt, tools, G, N),
                    "HF per rollout": HFRun(model, prompt, tools, 1, N),
                    "HF batched": HFRun(model, prompt, tools, G, N)}
        if vllm is not None:
            out |= {"vLLM batched": EngineRun(vllm, prompt, tools, G, N, tag,
                                              (state_dict, next(versions))),
                    "vLLM per rollout": EngineRun(vllm, prompt, tools, 1, N, tag + "p")}
        return out

    warm = runs(loads[0], "w")
    w0 = time.perf_counter()
    for t in range(args.turns):  # untimed: one-time set-up costs stay out of every figure
        for run in warm.values():
            run.turn(t)
    console.print(f"warm-up round: {time.perf_counter() - w0:.0f} s")
    prefilled_before = engine.stats.prefilled_tokens
    contestants: dict[str, Contestant] = {name: Contestant(name) for name in warm}
    update_ms: dict[str, list[float]] = {"TorchEngine": [], "vLLM batched": []}
    positions = 0  # attention's context positions over the timed repetitions (FLOPs below)
    for r in range(args.reps):
        prompt, tools = loads[r + 1]
        positions += attention_positions(len(prompt), [len(x) for x in tools], G, N, args.turns)
        rep = runs(loads[r + 1], f"r{r}")
        names = list(rep)
        order = names[r % len(names):] + names[:r % len(names)]  # who goes first rotates
        for t in range(args.turns):  # interleaved turn by turn: the same load for everyone
            for name in order:
                contestants[name].timed(r, lambda run=rep[name], t=t: run.turn(t))
        for name, ms in update_ms.items():
            if name in rep:
                ms += rep[name].update_ms
        console.print(f"repetition {r + 1}/{args.reps} (order {', '.join(order)}): " + ", ".join(
            f"{c.name} {c.tok_s()[r]:.0f} tok/s" for c in contestants.values()))
    st = engine.stats
    engine.close()
    eng = contestants["TorchEngine"]
    linear, attn = flops_per_token(model)
    flops = linear * (st.prefilled_tokens - prefilled_before + eng.tokens) + attn * positions
    peak_wall = peaks[model.dtype][0]
    frac = {d: flops / eng.cpu_s / (p[1] * 1e9) for d, p in peaks.items()}
    console.print(f"engine: {flops / 1e9:.0f} GFLOP ({attn * positions / flops:.0%} attention) in "
                  f"{eng.cpu_s:.1f} CPU-s = {flops / eng.cpu_s / 1e9:.1f} GFLOP per CPU-second: "
                  f"{frac[torch.float32]:.2%} of the fp32 peak, {frac[torch.bfloat16]:.2%} of bf16's "
                  f"(wall: {flops / eng.wall_s / (peak_wall * 1e9):.2%} of the {model.dtype} peak)")
    console.print("tok/s, median (min-max) over the repetitions: " + ", ".join(
        f"{c.name} {spread(c.tok_s())}" for c in contestants.values()))
    upd = statistics.median(update_ms["TorchEngine"])
    if args.engine_only:
        print(f"size={args.size} params={params} tok_s={statistics.median(eng.tok_s()):.0f} "
              f"tok_cpu_s={statistics.median(eng.tok_cpu_s()):.0f} "
              f"peak_fraction_fp32={frac[torch.float32]:.4f} "
              f"peak_fraction_bf16={frac[torch.bfloat16]:.4f} weight_update_ms={upd:.1f} "
              f"reps={args.reps}")
        return
    console.print(f"prefilled {st.prefilled_tokens} of {st.prompt_tokens} prompt tokens: group sharing "
                  f"saved {st.reused_group_tokens}, session KV reuse saved {st.reused_session_tokens}; "
                  f"weight update during decoding {spread(update_ms['TorchEngine'], '.1f')} ms")

    def vs(name: str) -> list[float]:
        return ratios(eng.tok_s(), contestants[name].tok_s())

    reuse = contestants["HF with reuse"]
    hf = [contestants[n] for n in ("HF with reuse", "HF per rollout", "HF batched")]
    console.print("per CPU-second (robust to other load), median: " + ", ".join(
        f"{c.name} {statistics.median(c.tok_cpu_s()):.0f}" for c in (eng, *hf))
        + " -> " + " / ".join(f"{statistics.median(ratios(eng.tok_cpu_s(), c.tok_cpu_s())):.2f}x"
                              for c in hf))
    vs_vllm = ""
    if vllm is not None:
        vst = vllm.stats
        console.print(f"vLLM: its prefix cache served {vst.cached_prompt_tokens} of "
                      f"{vst.prompt_tokens} prompt tokens (warm-up included); weight update "
                      f"{spread(update_ms['vLLM batched'], '.1f')} ms")
        vllm.close()
        vs_vllm = (f" vllm_tok_s={statistics.median(contestants['vLLM batched'].tok_s()):.0f}"
                   " vllm_per_rollout_tok_s="
                   f"{statistics.median(contestants['vLLM per rollout'].tok_s()):.0f}"
                   f" vllm_weight_update_ms={statistics.median(update_ms['vLLM batched']):.1f}"
                   f" speedup_vs_vllm_batched_spread={span(vs('vLLM batched'))}"
                   f" speedup_vs_vllm_per_rollout={statistics.median(vs('vLLM per rollout')):.2f}"
                   f" speedup_vs_vllm_batched={statistics.median(vs('vLLM batched')):.2f}")
    print(f"speedup_vs_hf_reuse={statistics.median(vs('HF with reuse')):.2f} "
          f"speedup_vs_hf_reuse_spread={span(vs('HF with reuse'))} "
          f"speedup_vs_hf_reuse_cpu={statistics.median(ratios(eng.tok_cpu_s(), reuse.tok_cpu_s())):.2f} "
          f"peak_fraction_fp32={frac[torch.float32]:.4f} peak_fraction_bf16={frac[torch.bfloat16]:.4f} "
          f"tok_s={statistics.median(eng.tok_s()):.0f} "
          f"hf_reuse_tok_s={statistics.median(reuse.tok_s()):.0f} "
          f"flattering: speedup_vs_hf_batched={statistics.median(vs('HF batched')):.2f} "
          f"speedup_vs_hf_per_rollout={statistics.median(vs('HF per rollout')):.2f} "
          f"weight_update_ms={upd:.1f} reps={args.reps}{vs_vllm}")


if __name__ == "__main__":
    main()
