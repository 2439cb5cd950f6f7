"""The GPU check: the trainer and the rollout engines on a CUDA device, measured.

    .venv/bin/python benchmarks/gpu.py                 # a CUDA machine: a few minutes
    .venv/bin/python benchmarks/gpu.py --steps 5 --params 1.5e9

Without a CUDA device it says so and exits 0. On one:

1. **CPU vs CUDA, one step.** A Qwen2-shaped model of ``--params`` parameters (Qwen2.5-0.5B's
   width, layers added or removed to reach the size; random init, nothing downloaded; the
   tokenizer of the default model, ``default_model_dir("tiny")``, the embedding sized to it)
   copied to the CPU and to CUDA, one batch of groups (fixed random tokens): the logprobs of the
   batch's tokens on each device (max |difference|), then one GRPO step on each from the same
   weights (loss difference, and the cosine between the two weight updates). CUDA runs it twice:
   in fp32, and in bf16 autocast over fp32 master weights (``grpo.experimental.autocast_bf16``, the GPU
   setting).
2. **A short GRPO run** of ``--steps`` synchronous steps on that model: ``--prompts`` prompts x
   ``--group-size`` completions a step, sampled by the engine at temperature 1, rewarded by a toy
   text reward (the share of lower-case letters: rewards must differ within a group; this check
   measures speed and memory, not learning), one GRPO step on CUDA (bf16 autocast, fp32 master
   weights), the new weights handed to the engine. Once with the torch engine (a copy of the
   model in bf16 on the same device) and, when vLLM is installed, once with it (in this
   process's GPU, ``--vllm-memory`` of it). Printed per engine: step time (rollout, train,
   weight sync), rollout and train tokens/s, the trainer process's peak CUDA memory and the
   device's memory in use (vLLM's engine process included).

A part that fails prints its error and the check goes on; the exit status is 1 if any failed.
The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import math
import os
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from looprl.trainer.config import GRPOConfig, GRPOExperimental
from looprl.trainer.losses import LossParams
from looprl.trainer.step import GRPOStep, token_logprobs
from looprl.types import (
    Counters,
    Group,
    RewardBreakdown,
    SamplingParams,
    Segment,
    StopReason,
    Trajectory,
)

QWEN2_05B_WIDTH = {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
                   "num_key_value_heads": 2}
"""Qwen2.5-0.5B's layer shape (its 24 layers and 151k vocabulary make its 0.49B)."""


def qwen2_config(vocab_size: int, params: float, max_len: int,
                 width: dict[str, int] = QWEN2_05B_WIDTH) -> object:
    """A Qwen2 config of ``width`` (Qwen2.5-0.5B's) with as many layers as bring the model
    nearest ``params`` (tied embeddings of ``vocab_size`` rows)."""
    from transformers import Qwen2Config

    def config(layers: int) -> Qwen2Config:
        return Qwen2Config(vocab_size=vocab_size, num_hidden_layers=layers,
                           max_position_embeddings=max_len, tie_word_embeddings=True,
                           rope_theta=1e6, **width)

    one, two = count_params(config(1)), count_params(config(2))
    layers = max(1, round((params - one) / (two - one)) + 1)
    return config(layers)


def count_params(config: object) -> int:
    """Parameters of the model ``config`` describes (built on the meta device: no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def build_model(tokenizer_dir: Path, params: float, max_len: int, seed: int,
                width: dict[str, int] = QWEN2_05B_WIDTH) -> tuple[nn.Module, object]:
    """The random-init Qwen2-shaped model (fp32, CPU) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(qwen2_config(len(tok), params, max_len, width),
                                             dtype=torch.float32)
    model.config.pad_token_id = tok.pad_token_id
    model.config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    return model.eval(), tok


def fixed_groups(vocab: int, groups: int, group_size: int, prompt_len: int, new_tokens: int,
                 seed: int) -> list[Group]:
    """Groups of random-token trajectories: each group one prompt, completions of different
    lengths and rewards, engine logprobs of a uniform sampler."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(groups):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
        trajs = []
        for k in range(group_size):
            n = new_tokens - k * new_tokens // (2 * group_size)
            done = torch.randint(3, vocab, (n,), generator=g).tolist()
            lp = -math.log(vocab)
            seg = Segment(tuple(prompt + done), (0.0,) * prompt_len + (lp,) * n,
                          (0,) * prompt_len + (1,) * n, (-1,) * prompt_len + (0,) * n)
            trajs.append(Trajectory(f"t{i}", f"g{i}", (seg,), (), Counters(output_tokens=n),
                                    StopReason.FINISHED,
                                    reward=RewardBreakdown.of({"r": float(k) / group_size})))
        out.append(Group(f"t{i}", f"g{i}", tuple(trajs)))
    return out


@dataclass(frozen=True)
class StepDiff:
    """One step from the same weights and batch on two devices."""

    label: str
    logprob_max_abs: float
    """max |logprob_a - logprob_b| over the batch's model tokens (before the step)."""
    loss_a: float
    loss_b: float
    update_cosine: float
    """Cosine between the two steps' weight updates (all parameters as one vector)."""
    update_rel_diff: float
    """|update_a - update_b| / |update_a|."""


def compare_step(model: nn.Module, groups: Sequence[Group], cfg_a: GRPOConfig, cfg_b: GRPOConfig,
                 device_a: torch.device, device_b: torch.device, label: str, pad_id: int
                 ) -> StepDiff:
    """Logprobs and one GRPO step of copies of ``model`` on ``device_a`` and ``device_b``."""
    a, b = copy.deepcopy(model).to(device_a), copy.deepcopy(model).to(device_b)
    step_a = GRPOStep(a, cfg_a, pad_id=pad_id)
    step_b = GRPOStep(b, cfg_b, pad_id=pad_id)
    batch = step_a.batch(groups)
    worst = 0.0
    with torch.no_grad():
        for mb in batch.micro_batches:
            lps = [token_logprobs(m, mb.tokens_B_T.to(d), mb.attention_mask_B_T.to(d),
                                 autocast_bf16=c.experimental.autocast_bf16).float().cpu()
                   for m, d, c in ((a, device_a, cfg_a), (b, device_b, cfg_b))]
            mask = mb.loss_mask_B_T > 0
            worst = max(worst, float((lps[0] - lps[1])[mask].abs().max()))
    before = {k: v.detach().cpu().double() for k, v in model.state_dict().items()}
    ma, mb_ = step_a.on_batch(batch), step_b.on_batch(batch)
    # float64: a float32 cosine of ~1e8 terms is off by more than the differences it measures
    da = torch.cat([(v.detach().cpu().double() - before[k]).flatten()
                    for k, v in a.state_dict().items()])
    db = torch.cat([(v.detach().cpu().double() - before[k]).flatten()
                    for k, v in b.state_dict().items()])
    cos = float(torch.nn.functional.cosine_similarity(da, db, dim=0))
    rel = float((da - db).norm() / da.norm().clamp(min=1e-30))
    return StepDiff(label, worst, ma.loss, mb_.loss, cos, rel)


@dataclass(frozen=True)
class RunResult:
    """A short GRPO run with one engine."""

    engine: str
    steps: int
    step_s: float
    """Mean wall time of a step (rollout + train + weight sync)."""
    rollout_s: float
    train_s: float
    sync_s: float
    rollout_tok_s: float
    train_tok_s: float
    peak_mb: float
    """The trainer process's peak memory: CUDA allocated on a GPU, max RSS on the CPU."""
    device_used_mb: float
    """Memory in use on the device at the end (every process's; the CPU: this one's RSS)."""
    mean_reward: float
    engine_version: int
    """The policy version the engine samples from at the end (= steps: it took every update)."""


def lower_share(text: str) -> float:
    """The toy reward: share of the text's characters that are lower-case letters.

    >>> lower_share("ab C1")
    0.4
    """
    return sum(c.islower() for c in text) / len(text) if text else 0.0


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def device_used_mb(device: torch.device) -> float:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return (total - free) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def grpo_run(model: nn.Module, tok: object, engine: object, device: torch.device, name: str,
             args: argparse.Namespace) -> RunResult:
    """``args.steps`` synchronous GRPO steps of ``model`` (moved to ``device``) with ``engine``
    sampling; see the module docstring."""
    cfg = GRPOConfig(lr=args.lr, experimental=GRPOExperimental(
        autocast_bf16=device.type == "cuda", micro_batch_tokens=args.micro_batch_tokens,
        objective=LossParams(norm_tokens=args.max_new_tokens)))
    step = GRPOStep(model.to(device).train(), cfg, pad_id=tok.pad_token_id)
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, len(tok), (args.prompt_tokens,), generator=g).tolist()
               for _ in range(args.prompts)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    times = {"rollout": 0.0, "train": 0.0, "sync": 0.0}
    tokens = {"rollout": 0, "train": 0}
    rewards: list[float] = []

    async def sample(ids: list[int], gid: str) -> Trajectory:
        out = await engine.generate(ids, params, group_id=gid)
        n = len(ids)
        seg = Segment(tuple(ids) + out.token_ids, (0.0,) * n + out.logprobs,
                      (0,) * n + (1,) * len(out.token_ids), (-1,) * n + out.policy_versions)
        text = tok.decode(list(out.token_ids), skip_special_tokens=True)
        return Trajectory(gid, gid, (seg,), (), Counters(output_tokens=len(out.token_ids)),
                          StopReason.FINISHED, reward=RewardBreakdown.of({"lower": lower_share(text)}))

    async def main() -> None:
        for s in range(args.steps):
            t0 = time.perf_counter()
            groups = []
            for i, ids in enumerate(prompts):
                gid = f"s{s}p{i}"
                groups.append(asyncio.gather(*(sample(ids, gid) for _ in range(args.group_size))))
            done = [Group(f"s{s}p{i}", f"s{s}p{i}", tuple(trajs))
                    for i, trajs in enumerate(await asyncio.gather(*groups))]
            t1 = time.perf_counter()
            await asyncio.to_thread(step.on_groups, done, current_version=s)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t2 = time.perf_counter()
            await engine.update_weights({k: v.detach() for k, v in step.model.state_dict().items()},
                                        s + 1)
            t3 = time.perf_counter()
            trajs = [t for grp in done for t in grp.trajectories]
            times["rollout"] += t1 - t0
            times["train"] += t2 - t1
            times["sync"] += t3 - t2
            tokens["rollout"] += sum(t.counters.output_tokens for t in trajs)
            tokens["train"] += sum(len(t.segments[0].token_ids_T) for t in trajs)
            rewards.append(sum(t.reward.total for t in trajs) / len(trajs))
            print(f"  [{name}] step {s + 1}: rollout {t1 - t0:.2f} s, train {t2 - t1:.2f} s, "
                  f"sync {t3 - t2:.2f} s, reward {rewards[-1]:.3f}", flush=True)

    asyncio.run(main())
    n = args.steps
    return RunResult(name, n, sum(times.values()) / n, times["rollout"] / n, times["train"] / n,
                     times["sync"] / n, tokens["rollout"] / max(times["rollout"], 1e-9),
                     tokens["train"] / max(times["train"], 1e-9), peak_memory_mb(device),
                     device_used_mb(device), sum(rewards) / n, engine.policy_version)


def torch_engine(model: nn.Module, tok: object, device: torch.device, args: argparse.Namespace,
                 ) -> object:
    """The torch engine over a copy of ``model`` on ``device`` (bf16 there on a GPU)."""
    from looprl.inference import TorchEngine

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    copy_ = copy.deepcopy(model).to(device=device, dtype=dtype).eval()
    return TorchEngine(copy_, tok, max_len=args.prompt_tokens + args.max_new_tokens + 8,
                       kv_budget_mb=args.kv_budget_mb, seed=args.seed)


def vllm_engine(model: nn.Module, tok: object, args: argparse.Namespace, workdir: Path) -> object:
    """vLLM over ``model`` saved to ``workdir`` (it loads a checkpoint from disk)."""
    from looprl.inference.vllm_engine import VLLMEngine

    # VLLMEngine.update_weights sends a function to vLLM's workers (collective_rpc); vLLM's V1
    # engine process pickles one only when this is set
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    model.save_pretrained(workdir, safe_serialization=True)
    tok.save_pretrained(workdir)
    return VLLMEngine(str(workdir), dtype="bfloat16", seed=args.seed,
                      max_model_len=args.prompt_tokens + args.max_new_tokens + 8,
                      gpu_memory_utilization=args.vllm_memory)


def engine_run(name: str, model: nn.Module, tok: object, device: torch.device,
               args: argparse.Namespace) -> RunResult:
    """``grpo_run`` of a copy of ``model`` with engine ``name`` (torch or vllm)."""
    trainee = copy.deepcopy(model)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory() as tmp:
        engine = torch_engine(trainee, tok, device, args) if name == "torch" \
            else vllm_engine(trainee, tok, args, Path(tmp))
        try:
            return grpo_run(trainee, tok, engine, device, name, args)
        finally:
            close(engine)


def vllm_installed() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def attempt(failures: list[str], label: str, fn: Callable[[], object]) -> object | None:
    """``fn()``; on an exception, print it, note ``label`` as failed and return None."""
    try:
        return fn()
    except Exception as e:  # a failed part is reported, the check goes on
        traceback.print_exc(limit=3)
        print(f"{label}: FAILED: {type(e).__name__}: {e}", flush=True)
        failures.append(label)
        return None


def close(engine: object) -> None:
    fn = getattr(engine, "close", None)
    if callable(fn):
        fn()


def print_diff(d: StepDiff) -> None:
    print(f"  {d.label}: logprob max|diff| {d.logprob_max_abs:.2e}, loss {d.loss_a:+.6e} vs "
          f"{d.loss_b:+.6e} (|diff| {abs(d.loss_a - d.loss_b):.2e}), update cosine "
          f"{d.update_cosine:.6f}, update rel diff {d.update_rel_diff:.2e}", flush=True)


def print_run(r: RunResult) -> None:
    print(f"  {r.engine}: {r.steps} steps, step {r.step_s:.2f} s (rollout {r.rollout_s:.2f} + "
          f"train {r.train_s:.2f} + sync {r.sync_s:.2f}), rollout {r.rollout_tok_s:,.0f} tok/s, "
          f"train {r.train_tok_s:,.0f} tok/s, trainer peak {r.peak_mb:,.0f} MiB, device in use "
          f"{r.device_used_mb:,.0f} MiB", flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=float, default=0.5e9, help="model size to aim at")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8, help="groups per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--kv-budget-mb", type=float, default=8192.0, help="torch engine's KV cache")
    ap.add_argument("--vllm-memory", type=float, default=0.3,
                    help="share of the GPU's memory vLLM may take")
    ap.add_argument("--check-groups", type=int, default=2,
                    help="groups of the CPU-vs-CUDA step (of --group-size trajectories)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}, cuda build: "
              f"{torch.version.cuda or 'none'}): the GPU check runs on a machine with one; "
              "nothing to do here")
        return 0
    from looprl.models.tiny import default_model_dir

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    print(f"device: {torch.cuda.get_device_name(cuda)}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}", flush=True)
    model, tok = build_model(default_model_dir("tiny"), args.params,
                             args.prompt_tokens + args.max_new_tokens + 64, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: Qwen2-shaped, {model.config.num_hidden_layers} layers, "
          f"{n_params / 1e9:.3f}B parameters, vocabulary {model.config.vocab_size}", flush=True)
    failures: list[str] = []

    print("1. one GRPO step, same weights and batch, CPU vs CUDA", flush=True)
    groups = fixed_groups(len(tok), args.check_groups, args.group_size, args.prompt_tokens // 2,
                          args.max_new_tokens // 2, args.seed)
    def cfg(bf16: bool) -> GRPOConfig:
        return GRPOConfig(lr=1e-5, experimental=GRPOExperimental(
            autocast_bf16=bf16, micro_batch_tokens=args.micro_batch_tokens,
            objective=LossParams(norm_tokens=args.max_new_tokens)))

    diffs: list[StepDiff] = []
    for label, bf16 in (("cuda fp32", False), ("cuda bf16 autocast", True)):
        d = attempt(failures, f"cpu vs {label}", lambda bf16=bf16, label=label: compare_step(
            model, groups, cfg(False), cfg(bf16), cpu, cuda,
            f"cpu fp32 vs {label}", tok.pad_token_id))
        if d is not None:
            print_diff(d)
            diffs.append(d)
    torch.cuda.empty_cache()

    print(f"2. GRPO, {args.steps} steps of {args.prompts} x {args.group_size} rollouts "
          f"({args.prompt_tokens}-token prompts, {args.max_new_tokens} new tokens)", flush=True)
    runs: list[RunResult] = []
    engines = ["torch"] + (["vllm"] if vllm_installed() else [])
    if "vllm" not in engines:
        print("  vllm: not installed (pip install -e .[vllm]); skipped", flush=True)
    for name in engines:
        r = attempt(failures, f"{name} engine", lambda name=name: engine_run(name, model, tok, cuda, args))
        if r is not None:
            print_run(r)
            runs.append(r)
        torch.cuda.empty_cache()

    fp32 = next((d for d in diffs if d.label.endswith("fp32")), None)
    by_engine = {r.engine: r for r in runs}
    fields = [f"failures={','.join(failures) or 'none'}"]
    if fp32 is not None:
        fields += [f"cpu_cuda_logprob_max_abs={fp32.logprob_max_abs:.2e}",
                   f"cpu_cuda_loss_abs_diff={abs(fp32.loss_a - fp32.loss_b):.2e}",
                   f"cpu_cuda_update_cosine={fp32.update_cosine:.6f}"]
    for name, r in by_engine.items():
        fields += [f"{name}_step_s={r.step_s:.2f}", f"{name}_rollout_tok_s={r.rollout_tok_s:.0f}",
                   f"{name}_train_tok_s={r.train_tok_s:.0f}", f"{name}_peak_mb={r.peak_mb:.0f}"]
    print("gpu_check: " + " ".join(fields))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
