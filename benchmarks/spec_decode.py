"""Speculative decoding benchmark: TorchEngine drafting with MTP heads and/or prompt lookup vs
the plain engine, same weights, same rollout workload, in one run.

    nice -n 15 .venv/bin/python benchmarks/spec_decode.py              # default model, heads + lookup
    .venv/bin/python benchmarks/spec_decode.py --drafter lookup        # no heads: nothing to distill
    .venv/bin/python benchmarks/spec_decode.py --agent-run runs/quickstart --drafter lookup

Model: ``--model`` if given, else the newest ``runs/*/model_sft`` (read only), else the default
model of ``--size``. Heads (``--drafter heads`` or ``both``): those saved beside the model
(``mtp_heads.safetensors``); without them, k fresh heads are distilled here
(``looprl.models.mtp.train_heads``, the model frozen) on the model's own samples — rollouts
from other source files than the workload's, in the same chat format, sampled by the plain
engine — and on source text windows; ``--save-heads DIR`` keeps them. Prompt lookup
(``--drafter lookup`` or ``both``): up to ``--lookup`` tokens copied from the row's own context
(``looprl.inference.spec.NgramIndex``); it needs no training.

Workloads:
- default (``benchmarks/engine.py``): one ~1,000-token prompt, 3 turns of 256 new tokens
  (end-of-turn ignored), ~200 tool-output tokens between turns, a full weight update (the
  heads' included) mid-decoding of turn 1; sampled at temperature 1. Run for a group of 8
  (one group, session_id per trajectory, group_id shared) and for a single rollout.
- ``--agent-run RUN``: a finished ``looprl train`` run's RL model (``RUN/model_rl``, else
  ``model_start``) on its own agent prompts: the first-turn contexts of its held-out
  evaluation trajectories (``RUN/trajectories/eval_rl.jsonl``), one prompt per turn, the
  model's first turn as RL samples it (temperature 1, ending at end-of-turn, at most
  ``--agent-tokens`` tokens): a group of 8 per prompt, and a single rollout per prompt; a full
  weight update in the first turn.
Three engines on the same weights take turns (the order rotates), so they see the same machine
load: plain (speculative="off"), speculative ("on": always k drafts) and adaptive ("auto": the
draft length 0..k that measures fastest per batch size). speedup = tokens/s over the plain
engine's (wall); per-CPU-second ratios too. ``greedy_identical``: the default workload at
temperature 0 (4 rollouts, 2 turns) gives the same tokens with and without speculation.
``verify_cost_g8``/``_g1``: a forward of k+1 tokens a row as a multiple of a plain step's, at the
workload's context: the tokens a verify step must yield for speculation to pay (drafting aside).
The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from pathlib import Path

import torch
from engine import Contestant, EngineRun, build_workload
from rich.console import Console

from looprl.inference.kv_forward import CachedForward
from looprl.inference.torch_engine import TorchEngine
from looprl.models.loading import load_model
from looprl.models.mtp import HEADS_ATTR, attach_heads, heads_of, new_heads, save_heads, train_heads
from looprl.models.tiny import default_model_dir, python_sources
from looprl.rundir import RunDir
from looprl.types import SamplingParams

console = Console()


def pick_model(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    if args.agent_run:
        run = RunDir(Path(args.agent_run))
        return next((d for d in (run.model_rl, run.model_start) if (d / "config.json").is_file()),
                    run.model_rl)
    runs = sorted((m for r in Path("runs").glob("*") if (m := RunDir(r).model_sft / "config.json").is_file()),
                  key=lambda p: p.stat().st_mtime)
    return runs[-1].parent if runs else default_model_dir(args.size)


def own_samples(model, tok, n: int, prompt_tokens: int, new_tokens: int, threads: int) -> list[list[int]]:
    """``n`` rollouts of the plain engine from chat prompts over other source files than the
    workload's: what the heads will be asked to draft."""
    code = iter(python_sources(max_chars=4_000_000, seed=2))
    prompts = []
    while len(prompts) < n:
        ids = tok.encode(next(code))
        if len(ids) < prompt_tokens // 2:
            continue
        msgs = [{"role": "user", "content": "Fix the failing test in this file:\n"
                 + tok.decode(ids[:prompt_tokens])}]
        prompts.append(list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False)))
    engine = TorchEngine(model, tok, stop_on_eos=False, speculative="off", max_len=4096)

    async def run() -> list[list[int]]:
        gens = await asyncio.gather(*[engine.generate(p, SamplingParams(max_new_tokens=new_tokens, seed=i))
                                      for i, p in enumerate(prompts)])
        return [p + list(g.token_ids) for p, g in zip(prompts, gens, strict=True)]

    try:
        return asyncio.run(run())
    finally:
        engine.close()


def windows(seqs: list[list[int]], length: int) -> list[list[int]]:
    return [s[i:i + length] for s in seqs for i in range(0, len(s) - length + 1, length)]


def distill(model, tok, args: argparse.Namespace) -> float:
    """Fresh heads distilled on the model's samples and source text; returns the wall seconds."""
    t0 = time.perf_counter()
    attach_heads(model, new_heads(model, args.heads, int(args.head_width * model.config.hidden_size)))
    samples = own_samples(model, tok, args.samples, 512, args.sample_tokens, args.threads)
    text = [tok.encode(s) for s in python_sources(max_chars=args.text_chars, seed=3)]
    text = windows(text, 512)
    console.print(f"distilling {args.heads} heads on {len(samples)} own rollouts (whole: prompt and "
                  f"sample) + {len(text)} source windows of 512 tokens, {args.head_steps} steps")
    data = samples + text
    outs = train_heads(model, data, steps=args.head_steps, positions=args.head_positions, lr=args.head_lr)
    tail = outs[-20:]
    est = [sum(o.accept_K[j] for o in tail) / len(tail) for j in range(args.heads)]
    console.print(f"heads trained in {time.perf_counter() - t0:.0f} s; acceptance estimate per head "
                  f"(training windows, temperature 1): {[round(a, 3) for a in est]}")
    if args.save_heads:
        save_heads(heads_of(model), args.save_heads)
    return time.perf_counter() - t0


MODES = ("off", "on", "auto")


def agent_prompts(run: Path, n: int) -> list[list[int]]:
    """The first-turn contexts (everything before the first sampled token) of ``n`` distinct
    tasks' held-out evaluation trajectories of a finished run."""
    path = RunDir(run).eval_trajectories("rl")
    if not path.is_file():
        raise SystemExit(f"{path} not found: --agent-run takes a finished `looprl train` run's directory")
    prompts, seen = [], set()
    with path.open() as f:
        for line in f:
            r = json.loads(line)
            if r["task_id"] in seen or not r["segments"]:
                continue
            seg = r["segments"][0]
            if 1 not in seg["loss_mask_T"]:
                continue
            seen.add(r["task_id"])
            prompts.append(seg["token_ids_T"][:seg["loss_mask_T"].index(1)])
            if len(prompts) == n:
                break
    return prompts


class AgentRun:
    """Turn t: G rollouts of agent prompt t (one group), each the model's first turn, ending at
    end-of-turn or after N tokens; a full weight update while the first turn decodes."""

    def __init__(self, engine: TorchEngine, prompts: list[list[int]], G: int, N: int):
        self.engine, self.prompts, self.G, self.N = engine, prompts, G, N
        self.update_ms: list[float] = []

    def turn(self, t: int, state_dict=None) -> int:
        return asyncio.run(self._turn(t, state_dict))

    async def _turn(self, t: int, state_dict) -> int:
        prompt = self.prompts[t % len(self.prompts)]
        gens = [asyncio.create_task(self.engine.generate(
            prompt, SamplingParams(max_new_tokens=self.N, seed=100 * i + t), group_id=f"g{t}"))
            for i in range(self.G)]
        if state_dict is not None:  # once the group is decoding
            start = self.engine.stats.generated_tokens
            while self.engine.stats.generated_tokens < start + 8 * self.G and not all(g.done() for g in gens):
                await asyncio.sleep(0.005)
            t0 = time.perf_counter()
            await self.engine.update_weights(state_dict, version=1)
            self.update_ms.append((time.perf_counter() - t0) * 1e3)
        return sum(len(g.token_ids) for g in await asyncio.gather(*gens))


def compare(model, tok, prompt, tools, G: int, args: argparse.Namespace, state_dict) -> dict:
    """Plain, always-speculative and adaptive engines on one workload, interleaved turn by
    turn (the order rotates); tokens/s (wall and per CPU-second) and each engine's metrics."""
    agent = args.agent_run is not None
    lookup = args.lookup if args.drafter in ("lookup", "both") else 0
    engines = {m: TorchEngine(model, tok, stop_on_eos=agent, max_len=4096, speculative=m,
                              lookup=lookup if m != "off" else 0) for m in MODES}
    try:
        cs = {m: Contestant(m) for m in MODES}
        if agent:
            runs = {m: AgentRun(e, prompt, G, args.agent_tokens) for m, e in engines.items()}
        else:
            runs = {m: EngineRun(e, prompt, tools, G, args.new_tokens) for m, e in engines.items()}
        for t in range(args.turns):
            sd = state_dict if t == 0 else None
            for m in MODES[t % 3:] + MODES[:t % 3]:
                cs[m].timed(lambda m=m, t=t, sd=sd: runs[m].turn(t, sd))
            console.print(f"G={G} turn {t + 1}/{args.turns}: " + ", ".join(
                f"{m} {c.tok_s:.0f} tok/s" for m, c in cs.items()))
        return {"c": cs, "metrics": {m: e.metrics() for m, e in engines.items()},
                "update_ms": runs["on"].update_ms[0] if runs["on"].update_ms else math.nan}
    finally:
        for e in engines.values():
            e.close()


def verify_cost(model, ctx_len: int, T: int, B: int, reps: int = 30) -> float:
    """Seconds of one forward of ``T`` tokens per row over ``B`` rows at ``ctx_len`` context,
    as a multiple of a plain decoding step's (T = 1): what a verify step must earn back in
    tokens per verify to pay."""
    fwd = CachedForward(model, B, ctx_len + T + 1)
    ids = [(i * 7919) % 1000 + 100 for i in range(ctx_len)]
    for b in range(B):
        fwd.prefill(ids, b, 0)

    def timed(t: int) -> float:
        for _ in range(5):
            fwd.decode([[5] * t] * B, [ctx_len] * B)
        t0 = time.perf_counter()
        for _ in range(reps):
            fwd.decode([[5] * t] * B, [ctx_len] * B)
        return time.perf_counter() - t0

    return timed(T) / timed(1)


def greedy_identical(model, tok, prompt, tools, G: int, N: int, turns: int, lookup: int) -> bool:
    """The workload at temperature 0 (G rollouts, ``turns`` turns): the same tokens with and
    without speculation."""
    outs = []
    for mode in ("off", "on"):
        engine = TorchEngine(model, tok, stop_on_eos=False, max_len=4096, speculative=mode,
                             lookup=lookup if mode == "on" else 0)
        ctx_G = [list(prompt) for _ in range(G)]
        tokens_G: list[list[int]] = [[] for _ in range(G)]

        async def one(i: int, t: int, engine=engine, ctx_G=ctx_G, tokens_G=tokens_G) -> None:
            g = await engine.generate(ctx_G[i], SamplingParams(max_new_tokens=N, temperature=0.0),
                                      session_id=f"t{i}", group_id="g0")
            tokens_G[i] += list(g.token_ids)
            ctx_G[i] += list(g.token_ids) + (tools[t] if t < len(tools) else [])

        async def all_turns(one=one) -> None:
            for t in range(turns):
                await asyncio.gather(*[one(i, t) for i in range(G)])

        try:
            asyncio.run(all_turns())
        finally:
            engine.close()
        outs.append(tokens_G)
    return outs[0] == outs[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--model", default=None, help="an HF model dir (default: runs/*/model_sft, else build one)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--tool-tokens", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--heads", type=int, default=3, help="k, when heads are distilled here")
    ap.add_argument("--head-steps", type=int, default=600)
    ap.add_argument("--head-width", type=float, default=0.5, help="heads' MLP width / hidden size")
    ap.add_argument("--head-positions", type=int, default=512, help="chains per distillation step")
    ap.add_argument("--head-lr", type=float, default=3e-3)
    ap.add_argument("--samples", type=int, default=96, help="own rollouts to distill on")
    ap.add_argument("--sample-tokens", type=int, default=384)
    ap.add_argument("--text-chars", type=int, default=300_000)
    ap.add_argument("--save-heads", default=None)
    ap.add_argument("--drafter", choices=("heads", "lookup", "both"), default="both",
                    help="what drafts: MTP heads, prompt lookup, or lookup first and heads after")
    ap.add_argument("--lookup", type=int, default=6, help="most tokens a step looks up per row")
    ap.add_argument("--agent-run", type=Path, default=None,
                    help="a finished `looprl train` run: its RL model on its own agent prompts")
    ap.add_argument("--agent-tokens", type=int, default=128, help="a first turn's token budget (--agent-run)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = pick_model(args)
    lm = load_model(path)
    model, tok = lm.model, lm.tokenizer
    console.print(f"model {path}: {lm.num_params / 1e6:.2f}M params, {args.threads} threads")
    heads_s = 0.0
    if args.drafter == "lookup":
        if heads_of(model) is not None:
            delattr(model, HEADS_ATTR)  # lookup alone: the engine finds no heads to draft with
        console.print(f"drafter: prompt lookup alone, up to {args.lookup} tokens a step")
    else:
        heads_s = 0.0 if heads_of(model) is not None else distill(model, tok, args)
        heads = heads_of(model)
        console.print(f"MTP heads: k={heads.num_heads}, {sum(p.numel() for p in heads.parameters()) / 1e6:.2f}M "
                      f"params" + (f"; prompt lookup first, up to {args.lookup} tokens" if args.drafter == "both" else ""))
    lookup = args.lookup if args.drafter in ("lookup", "both") else 0
    prompt, tools = build_workload(tok, args.prompt_tokens, args.tool_tokens, args.turns)
    state_dict = {k: v.clone() for k, v in model.state_dict().items()}  # weights and heads
    if args.agent_run is not None:
        prompts = agent_prompts(args.agent_run, args.turns)
        console.print(f"agent workload: {len(prompts)} first-turn prompts of {args.agent_run} "
                      f"({min(map(len, prompts))}-{max(map(len, prompts))} tokens), at most "
                      f"{args.agent_tokens} new tokens each")
        res = {G: compare(model, tok, prompts, None, G, args, state_dict) for G in (8, 1)}
    else:
        res = {G: compare(model, tok, prompt, tools, G, args, state_dict) for G in (8, 1)}
    same = greedy_identical(model, tok, prompt, tools, G=4, N=96, turns=2, lookup=lookup)
    for G, r in res.items():
        c, on, auto = r["c"], r["metrics"]["on"], r["metrics"]["auto"]
        console.print(
            f"G={G}: plain {c['off'].tok_s:.0f} tok/s ({c['off'].tok_cpu_s:.0f} per CPU-s); speculative "
            f"{c['on'].tok_s:.0f} ({c['on'].tok_cpu_s:.0f}) = {c['on'].tok_s / c['off'].tok_s:.2f}x wall, "
            f"{c['on'].tok_cpu_s / c['off'].tok_cpu_s:.2f}x per CPU-s, acceptance "
            f"{on['engine/spec/acceptance']:.3f}, tokens per verify {on['engine/spec/tokens_per_verify']:.2f}, "
            f"looked up {on['engine/spec/looked_up_fraction']:.0%} of drafts; "
            f"auto {c['auto'].tok_s:.0f} ({c['auto'].tok_s / c['off'].tok_s:.2f}x, drafted in "
            f"{auto['engine/spec/on_fraction']:.0%} of steps); weight+heads update {r['update_ms']:.1f} ms")
    k = max(args.lookup if lookup else 0, heads_of(model).num_heads if heads_of(model) is not None else 0)
    ctx = len(prompt) if args.agent_run is None else max(map(len, prompts))
    cost = {G: verify_cost(model, ctx, k + 1, G) for G in (8, 1)}
    console.print("a verify forward of " + f"{k + 1} tokens a row costs " + ", ".join(
        f"{cost[G]:.2f}x a plain step at G={G}" for G in (8, 1))
        + f" (context {ctx}): speculation pays only above that many tokens per verify step")
    weights = {G: r["c"]["on"].tokens for G, r in res.items()}
    acc = sum(res[G]["metrics"]["on"]["engine/spec/acceptance"] * w for G, w in weights.items()) / sum(weights.values())
    tpv = sum(res[G]["metrics"]["on"]["engine/spec/tokens_per_verify"] * w for G, w in weights.items()) \
        / sum(weights.values())

    def ratio(G: int, mode: str, per: str = "tok_s") -> float:
        return getattr(res[G]["c"][mode], per) / getattr(res[G]["c"]["off"], per)

    print(f"speedup_spec_vs_plain_g8={ratio(8, 'on'):.2f} speedup_spec_vs_plain_g1={ratio(1, 'on'):.2f} "
          f"acceptance={acc:.3f} tokens_per_verify={tpv:.2f} greedy_identical={same} "
          f"speedup_auto_vs_plain_g8={ratio(8, 'auto'):.2f} speedup_auto_vs_plain_g1={ratio(1, 'auto'):.2f} "
          f"cpu_speedup_g8={ratio(8, 'on', 'tok_cpu_s'):.2f} cpu_speedup_g1={ratio(1, 'on', 'tok_cpu_s'):.2f} "
          f"verify_cost_g8={cost[8]:.2f} verify_cost_g1={cost[1]:.2f} "
          f"heads_train_s={heads_s:.0f} drafter={args.drafter} "
          f"workload={'agent' if args.agent_run else 'engine'}")


if __name__ == "__main__":
    main()
