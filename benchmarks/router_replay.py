"""Router replay (R3) on the tiny MoE: the engine's rollouts scored by the trainer with and without
the engine's recorded experts.

    .venv/bin/python benchmarks/router_replay.py                  # default MoE, ~3 minutes on an idle 2-core machine
    .venv/bin/python benchmarks/router_replay.py --model DIR --pretrain-steps 0  # a trained MoE
    .venv/bin/python benchmarks/router_replay.py --vllm           # and VLLMEngine (fp32 and bf16, CPU build), ~8 more minutes

The default MoE is pretrained briefly first (``--pretrain-steps``, into a temporary copy): at
initialisation its experts' output projections are zero (``tiny.plant_copy_circuit``), so which
expert a token goes to cannot change a logprob yet. For each engine dtype (bf16, fp32): TorchEngine samples G rollouts (temperature 1) of one
code prompt from the model in that dtype and records each sampled token's experts; the
trainer's fp32 forward (HF's, as in the GRPO step: ``trainer.step.moe_logprobs``) then scores the
same tokens twice: routers free (no replay) and routed to the recorded experts (replay).
- disagree: share of (sampled token, MoE layer) decisions whose expert set differs from the
  engine's;
- kl: mean over sampled tokens of (engine logprob - trainer logprob), the k1 estimate of
  KL(engine || trainer) (what the step logs as ``engine_kl``): unbiased but signed, so at
  differences this small its mean is mostly noise; kl3: the k3 estimate of the same KL
  (r - 1 - log r with r = trainer / engine probability), unbiased and never negative;
  absdiff: mean |difference|.
The last lines are machine-readable, one per engine in bf16 (the engine dtype of a real run;
vLLM's fp32 routes as the trainer's already), each with the ratio of the replayed absdiff to
the free one measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch

from looprl.inference.torch_engine import TorchEngine
from looprl.models.loading import load_model
from looprl.models.moe import NO_ROUTE
from looprl.models.pretrain import pretrain
from looprl.models.tiny import default_model_dir, python_sources
from looprl.trainer.step import moe_logprobs
from looprl.types import Generation, SamplingParams


def rollouts(model_dir, dtype: str, prompt: list[int], G: int, new_tokens: int,
             seed: int) -> list[Generation]:
    lm = load_model(model_dir, dtype=dtype)
    engine = TorchEngine(lm.model, lm.tokenizer, stop_on_eos=False, seed=seed)

    async def main() -> list[Generation]:
        return list(await asyncio.gather(*[
            engine.generate(prompt, SamplingParams(max_new_tokens=new_tokens, temperature=1.0,
                                                   seed=seed + i), group_id="g")
            for i in range(G)]))
    try:
        return asyncio.run(main())
    finally:
        engine.close()


def vllm_rollouts(model_dir, dtype: str, prompt: list[int], G: int, new_tokens: int,
                  seed: int) -> list[Generation]:
    """The same workload on VLLMEngine in ``dtype`` (routes from hooks on vLLM's routers)."""
    from looprl.inference.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(model_dir), dtype=dtype, stop_on_eos=False, seed=seed,
                        max_model_len=len(prompt) + new_tokens + 8)

    async def main() -> list[Generation]:
        return list(await asyncio.gather(*[
            engine.generate(prompt, SamplingParams(max_new_tokens=new_tokens, temperature=1.0), group_id="g")
            for _ in range(G)]))
    try:
        return asyncio.run(main())
    finally:
        engine.close()


def _line(free: dict[str, float], rep: dict[str, float]) -> str:
    """One arm's figures, without and with replay, and the replayed |difference|'s ratio."""
    return (f"disagree_no_replay={free['disagree']:.4f} disagree_replay={rep['disagree']:.4f} "
            f"kl_no_replay={free['kl']:.3e} kl_replay={rep['kl']:.3e} "
            f"kl3_no_replay={free['kl3']:.3e} kl3_replay={rep['kl3']:.3e} "
            f"absdiff_no_replay={free['absdiff']:.3e} absdiff_replay={rep['absdiff']:.3e} "
            f"absdiff_ratio_replay_vs_no_replay={rep['absdiff'] / max(free['absdiff'], 1e-30):.3f}")


def score(trainer, prompt: list[int], gens: list[Generation], replay: bool) -> dict[str, float]:
    P, N = len(prompt), len(gens[0].token_ids)
    tokens = torch.tensor([prompt + list(g.token_ids) for g in gens])
    routes = gens[0].routes
    assert routes is not None, "the engine recorded no routes: is the model a MoE?"
    R = torch.full((len(gens), P + N, routes.layers, routes.top_k), NO_ROUTE, dtype=torch.uint8)
    for b, g in enumerate(gens):
        assert g.routes is not None, "every rollout of a MoE records routes"
        R[b, P:] = torch.from_numpy(g.routes.array().copy())
    with torch.no_grad():
        lp, tap = moe_logprobs(trainer, tokens, torch.ones_like(tokens), R, replay=replay)
    d = torch.tensor([g.logprobs for g in gens]) - lp[:, P:]
    return {"disagree": sum(tap.disagree_L) / max(tap.decisions * len(tap.disagree_L), 1),
            "kl": float(d.mean()), "kl3": float((torch.expm1(-d) + d).mean()),
            "absdiff": float(d.abs().mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a MoE model directory (default: the 'moe' size)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm", action="store_true", help="also the vLLM engine (its CPU build: `make vllm`)")
    ap.add_argument("--pretrain-steps", type=int, default=20,
                    help="next-token steps on the source corpus first (0: the model as it is)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model_dir = Path(a.model) if a.model else default_model_dir("moe")
    if a.pretrain_steps:
        t0 = time.perf_counter()
        r = pretrain(model_dir, steps=a.pretrain_steps, batch=4, seq_len=128, corpus_chars=300_000,
                     out_dir=Path(tempfile.mkdtemp(prefix="looprl-r3-")) / "model", show_progress=False,
                     seed=a.seed)
        model_dir = r.model_dir
        print(f"pretrained {a.pretrain_steps} steps: loss {r.losses_S[0]:.2f} -> {r.final_loss:.2f} "
              f"({time.perf_counter() - t0:.0f}s)")
    trainer = load_model(model_dir, dtype="float32")
    tok = trainer.tokenizer
    text = "".join(s[:3000] for s, _ in zip(python_sources(max_chars=200_000, seed=1), range(4), strict=False))
    prompt = tok.encode(text)[:a.prompt_tokens]
    print(f"model={model_dir} params={trainer.num_params / 1e6:.2f}M G={a.group} "
          f"prompt={len(prompt)} new_tokens={a.new_tokens}")
    lines = {}
    arms = [("torch", rollouts)] + ([("vllm", vllm_rollouts)] if a.vllm else [])
    for engine, sample in arms:
        for dtype in ("float32", "bfloat16"):
            t0 = time.perf_counter()
            gens = sample(model_dir, dtype, prompt, a.group, a.new_tokens, a.seed)
            free, rep = (score(trainer.model, prompt, gens, r) for r in (False, True))
            name = f"{engine} dtype={'bf16' if dtype == 'bfloat16' else 'fp32'}"
            lines[name] = _line(free, rep)
            print(f"engine={name} ({time.perf_counter() - t0:.0f}s) {lines[name]}")
    for engine, _ in arms:
        print(f"engine={engine} dtype=bf16 {lines[f'{engine} dtype=bf16']}")

if __name__ == "__main__":
    main()
