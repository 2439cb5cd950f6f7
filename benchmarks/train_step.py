"""The GRPO trainer's step time on a run's own RL batches: looprl's forward (a group's prompt run
once, a repeated row run once) against the plain one (every row its own full forward).

    .venv/bin/python benchmarks/train_step.py                  # runs/quickstart, ~4 min, 1 thread
    .venv/bin/python benchmarks/train_step.py runs/quickstart --steps 20 --threads 2

The batches are the run's own: its ``trajectories/train.jsonl`` read in order,
``loop.groups_per_step`` groups a step, turned into a batch by ``GRPOStep`` with the run's
``grpo`` config (the quickstart's leaves a failure's rows out, and a group's passing rollouts are
often token for token the same). Both sides train a fresh copy of the run's ``model_start`` on the
same batches, alternating step by step so load on the machine hits both alike; the plain side
packs rows by length (``share_prefix=False``, as under DDP) and runs every row, repeats included.

The last line is ``speedup_vs_plain=… step_s=… plain_step_s=… forward_tokens=… plain_forward_tokens=…``
(mean seconds a step; tokens a step's forwards run).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from looprl.config import from_dict
from looprl.models.loading import load_model
from looprl.rundir import RunDir
from looprl.train.config import TrainConfig
from looprl.trainer import step as step_mod
from looprl.trainer.batch import TrainBatch, _cost
from looprl.trainer.step import GRPOStep, distinct_rows, shared_prefix_len
from looprl.types import Group, Trajectory


def run_groups(run: Path, n: int) -> list[Group]:
    """The first ``n`` groups of the run's RL, in the order they were trained."""
    groups: dict[str, list[Trajectory]] = {}
    with open(RunDir(run).train_trajectories, encoding="utf-8") as f:
        for line in f:
            t = Trajectory.from_dict(json.loads(line))
            if t.group_id not in groups and len(groups) == n:
                break
            groups.setdefault(t.group_id, []).append(t)
    return [Group(ts[0].task_id, gid, tuple(ts)) for gid, ts in groups.items()]


@contextmanager
def every_row_runs() -> Iterator[None]:
    """The step as a plain trainer runs it: no row shares a prefix or a repeat's forward (rows
    packed by length, each run in full)."""
    real = step_mod.distinct_rows, step_mod.shares_prefixes
    step_mod.distinct_rows = lambda tokens, _mask: (torch.arange(tokens.shape[0]),
                                                      torch.arange(tokens.shape[0]))
    step_mod.shares_prefixes = lambda _model: False
    try:
        yield
    finally:
        step_mod.distinct_rows, step_mod.shares_prefixes = real


def forward_tokens(batch: TrainBatch, plain: bool) -> int:
    """Tokens the batch's forwards run (what ``token_logprobs`` computes over)."""
    n = 0
    for mb in batch.micro_batches:
        t, m = mb.tokens_B_T, mb.attention_mask_B_T
        if not plain:
            keep, _ = distinct_rows(t, m)
            t, m = t[keep], m[keep]
        n += _cost(t.shape[0], t.shape[1], 0 if plain else shared_prefix_len(t, m))
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, nargs="?", default=Path("runs/quickstart"),
                    help="a run directory with RL trajectories (trajectories/train.jsonl, "
                    "model_start/, config.json); default runs/quickstart")
    ap.add_argument("--steps", type=int, default=12, help="steps with something to train")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the quickstart's "
                    "trainer runs on model.rl_threads = 1)")
    args = ap.parse_args()
    rd = RunDir(args.run)
    for need in (rd.train_trajectories, rd.model_start / "config.json", rd.config):
        if not need.is_file():
            raise SystemExit(f"{args.run} has no {need.relative_to(rd.root)}: give a run "
                             "directory `looprl train` wrote once its RL has trained some steps")
    torch.set_num_threads(args.threads)
    cfg = from_dict(TrainConfig, json.loads(rd.config.read_text()))
    per_step = cfg.loop.groups_per_step
    groups = run_groups(args.run, per_step * args.steps * 4)
    base = load_model(rd.model_start).model
    fast = GRPOStep(copy.deepcopy(base), cfg.grpo)
    plain = GRPOStep(copy.deepcopy(base), cfg.grpo)
    times = {"fast": 0.0, "plain": 0.0}
    tokens = {"fast": 0, "plain": 0}
    done = 0
    for k in range(0, len(groups), per_step):
        if done == args.steps:
            break
        batch = fast.batch(groups[k:k + per_step])
        if batch.empty:
            continue
        t = time.perf_counter()
        fast.on_batch(batch)
        times["fast"] += time.perf_counter() - t
        with every_row_runs():
            plain_batch = plain.batch(groups[k:k + per_step])
            t = time.perf_counter()
            plain.on_batch(plain_batch)
            times["plain"] += time.perf_counter() - t
        tokens["fast"] += forward_tokens(batch, plain=False)
        tokens["plain"] += forward_tokens(plain_batch, plain=True)
        done += 1
        print(f"step {done}/{args.steps}: {batch.num_sequences} rows ({batch.silent_rows} silent), "
              f"looprl {times['fast'] / done:.2f} s, plain {times['plain'] / done:.2f} s a step",
              flush=True)
    if not done:
        raise SystemExit(f"{args.run}'s first groups left nothing to train (every group silent)")
    print(f"speedup_vs_plain={times['plain'] / times['fast']:.2f} step_s={times['fast'] / done:.3f} "
          f"plain_step_s={times['plain'] / done:.3f} forward_tokens={tokens['fast'] // done} "
          f"plain_forward_tokens={tokens['plain'] // done}")


if __name__ == "__main__":
    main()
