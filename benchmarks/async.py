"""Async vs sync GRPO: how long the trainer waits for rollouts, same model, tasks and settings.

    .venv/bin/python benchmarks/async.py                     # ~3 min on 2 cores
    .venv/bin/python benchmarks/async.py --steps 4 --engine-threads 1 --trainer-threads 1

Runs ``GRPOLoop`` twice on the real pieces — the default model (random init, cached under
LOOPRL_HOME), real inflection tasks in bubblewrap sandboxes, the harness, ``TorchEngine``,
``make_scorer`` (hidden tests + shaped reward) — once with ``LoopConfig(sync=False)`` and once
with ``sync=True``, for the same number of optimizer steps. Both start from the same weights.

Measured: the trainer's idle fraction (``LoopStats.idle_fraction``: time waiting for groups over
waiting + training), wall time, rollout tokens/s (sampled tokens of trained groups over wall) and
train tokens/s (model tokens over trainer busy time).

Honesty notes: a random model rarely passes tests, so most groups have equal rewards; the step is
run with ``skip_zero_variance=False`` so every step does its full forward/backward work (advantages
are then zero — the compute, which is what is measured here, is the same). The single-epoch sampler
needs more tasks than the 14 cached ones, so task copies get distinct ids (``<id>~k``).
The last line is ``trainer_idle_async=… trainer_idle_sync=… …``.

What it showed on the shared 2-vCPU machine (load average 5-8 from other jobs), 4 steps: async
idle 0.14 vs sync 0.59, but async wall time 92 s vs 70 s. Rollouts (the decode thread plus the
pytest grading subprocesses) and the trainer compete for the same two cores, so overlapping them
turns the trainer's idle time into contention (a train step ~20 s async vs ~7 s sync), and the
producer's run-ahead samples tokens a short run never trains on (``engine_tok_s`` vs
``rollout_tok_s``). A small queue and ``max_in_flight`` (the defaults, 2 and 4) helped most:
with 4 and 8 async idle was 0.11 but wall 156 s vs 79 s sync. Async pays off when rollouts and
the trainer have their own hardware (engine on other hosts/GPUs), which this machine cannot show.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import sys
import time
from dataclasses import dataclass

import torch

from looprl.chat import ChatFormat
from looprl.harness.agent import AgentConfig
from looprl.inference import TorchEngine
from looprl.models.loading import load_model
from looprl.models.tiny import default_model_dir
from looprl.rollout.runner import RolloutConfig, RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.sandbox import SandboxPool
from looprl.trainer.grpo import GRPOLoop, LoopConfig, LoopStats
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOConfig, GRPOStep, StepMetrics
from looprl.types import Group, Task


def real_tasks(spec: str, max_tasks: int) -> list[Task]:
    """Cached real tasks of one package (fetched and built on first use)."""
    from looprl.tasks.build import BuildConfig, build_package_tasks
    from looprl.tasks.sources import fetch_package

    return build_package_tasks(fetch_package(spec), BuildConfig(max_tasks=max_tasks))


def repeat_tasks(tasks: list[Task], n: int) -> list[Task]:
    """``n`` tasks cycling over ``tasks``; copies get distinct ids so the single-epoch sampler
    treats them as different tasks."""
    return [dataclasses.replace(tasks[i % len(tasks)], id=f"{tasks[i % len(tasks)].id}~{i // len(tasks)}")
            for i in range(n)]


class ThreadedStep(GRPOStep):
    """``GRPOStep`` whose worker thread uses its own torch thread count (the engine keeps its own):
    on a 2-core machine the decode thread and the trainer otherwise oversubscribe the cores."""

    def __init__(self, *args, threads: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.threads = threads

    def on_groups(self, groups: list[Group], *, current_version: int | None = None) -> StepMetrics:
        if self.threads:
            torch.set_num_threads(self.threads)  # per OS thread: only this worker is affected
        return super().on_groups(groups, current_version=current_version)


@dataclass(frozen=True)
class ModeResult:
    mode: str
    stats: LoopStats
    wall_s: float
    generated_tokens: int
    """Every token the engine sampled (also of groups dropped or unfinished at the end)."""

    @property
    def rollout_tok_s(self) -> float:
        return self.stats.rollout_tokens / max(self.wall_s, 1e-9)

    @property
    def train_tok_s(self) -> float:
        return self.stats.train_tokens / max(self.stats.trainer_busy_s, 1e-9)


async def run_mode(args: argparse.Namespace, sync: bool, tasks: list[Task]) -> ModeResult:
    lm = load_model(default_model_dir(args.size))
    tok = lm.tokenizer
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.engine_threads)  # the decode thread inherits this count
    engine = TorchEngine(copy.deepcopy(lm.model), tok, max_len=args.context, seed=args.seed)
    torch.set_num_threads(args.trainer_threads)
    agent = AgentConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                        max_total_new_tokens=args.max_new_tokens * args.max_turns,
                        context_window=args.context)
    step = ThreadedStep(lm.model.train(), GRPOConfig(
        lr=1e-5, norm_tokens=args.max_new_tokens * args.max_turns, skip_zero_variance=False,
        micro_batch_tokens=args.micro_batch_tokens), pad_id=tok.pad_token_id,
        threads=args.trainer_threads)
    pool = SandboxPool(max_running=args.max_in_flight)
    try:
        runner = RolloutRunner(engine, ChatFormat(tok), pool, make_scorer(), RolloutConfig(
            group_size=args.group_size, max_in_flight=args.max_in_flight, agent=agent,
            tools=tuple(args.tools.split(","))))
        loop = GRPOLoop(step, engine, runner, TaskSampler(tasks, seed=args.seed), LoopConfig(
            groups_per_step=args.groups_per_step, max_staleness=args.max_staleness,
            queue_size=args.queue_size, max_steps=args.steps, sync=sync, max_minutes=10.0))
        t0 = time.monotonic()
        stats = await loop.run(progress=lambda s: print(
            f"  [{'sync' if sync else 'async'}] step {s.steps} t={time.monotonic() - t0:.1f}s "
            f"idle={s.idle_fraction:.2f}", flush=True))
        wall = time.monotonic() - t0
    finally:
        await pool.close()
        engine.close()
    return ModeResult("sync" if sync else "async", stats, wall, engine.stats.generated_tokens)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--size", default="small", help="default model size (looprl.models.tiny.SIZES)")
    p.add_argument("--package", default="inflection==0.5.1")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--queue-size", type=int, default=2)
    p.add_argument("--max-in-flight", type=int, default=4)
    p.add_argument("--max-staleness", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--engine-threads", type=int, default=1)
    p.add_argument("--trainer-threads", type=int, default=1)
    p.add_argument("--tools", default="read_file,grep,edit_file,run_tests,finish",
                   help="harness tools offered (all 11 make a ~1.8k-token prompt, these ~0.6k)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    try:
        base = real_tasks(args.package, 20)
    except Exception as e:  # noqa: BLE001 — no network / no bwrap: say so, don't fake a number
        print(f"could not build real tasks from {args.package}: {e}\n(needs the package cached "
              f"under LOOPRL_HOME or PyPI access, and bubblewrap)", file=sys.stderr)
        return 2
    # Enough tasks for the steps plus what the async producer has in flight when it stops.
    need = (args.steps + 2) * args.groups_per_step + args.queue_size + args.max_in_flight
    tasks = repeat_tasks(base, need)
    print(f"{len(base)} real tasks ({args.package}) -> {len(tasks)} with copies; model {args.size}; "
          f"threads engine={args.engine_threads} trainer={args.trainer_threads}", flush=True)
    results = {}
    for sync in (False, True):
        r = asyncio.run(run_mode(args, sync, tasks))
        results[r.mode] = r
        s = r.stats
        print(f"{r.mode:>5}: steps={s.steps} wall={r.wall_s:.1f}s idle={s.idle_fraction:.3f} "
              f"(idle {s.trainer_idle_s:.1f}s busy {s.trainer_busy_s:.1f}s) "
              f"rollout_tok/s={r.rollout_tok_s:.0f} engine_tok/s={r.generated_tokens / r.wall_s:.0f} "
              f"train_tok/s={r.train_tok_s:.0f} stale={s.groups_stale} dropped={s.groups_dropped}",
              flush=True)
    a, s = results["async"], results["sync"]
    print(f"trainer_idle_async={a.stats.idle_fraction:.3f} trainer_idle_sync={s.stats.idle_fraction:.3f} "
          f"wall_async_s={a.wall_s:.1f} wall_sync_s={s.wall_s:.1f} "
          f"speedup={s.wall_s / max(a.wall_s, 1e-9):.2f} "
          f"rollout_tok_s_async={a.rollout_tok_s:.0f} rollout_tok_s_sync={s.rollout_tok_s:.0f} "
          f"train_tok_s_async={a.train_tok_s:.0f} train_tok_s_sync={s.train_tok_s:.0f} "
          f"engine_tok_s_async={a.generated_tokens / a.wall_s:.0f} "
          f"engine_tok_s_sync={s.generated_tokens / s.wall_s:.0f} steps={args.steps} target_idle=0.15")
    return 0


if __name__ == "__main__":
    sys.exit(main())
