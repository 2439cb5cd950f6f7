"""GRPO on a coding agent, in one file you can read top to bottom.

    .venv/bin/python recipes/grpo_minimal.py                         # real inflection tasks
    .venv/bin/python recipes/grpo_minimal.py --tasks fixture --steps 2   # offline, built-in task

Every piece is the real one the full trainer uses: tasks from a real PyPI package (bug injected,
hidden tests), a bubblewrap sandbox per trajectory, the agent harness and its tools, the in-process
``TorchEngine`` (sampling with logprobs), the hidden-test + shaped reward (``make_scorer``), and the
trainer's ``build_batch`` and Dr. GRPO loss. Only the orchestration is plain: one synchronous loop.

    for step in range(steps):
        groups = roll out G trajectories for each of a few tasks     # policy acts in sandboxes
        batch  = advantages within each group, pack into tensors     # reward - group mean
        loss   = policy-gradient loss on the model's tokens          # backward, clip, AdamW step
        engine <- new weights                                        # next rollouts are on-policy

Left out here (see ``looprl.trainer.grpo.GRPOLoop`` and friends for each):
- asynchrony: rollouts and training overlap there; here the trainer waits for every rollout;
- staleness bounds and per-token policy versions (here every token is on-policy);
- the weight store (delta-compressed publishing) — weights go straight to the engine;
- checkpoints, resume, metrics files, TensorBoard, the reward-curve plot;
- self-summarization of long contexts, a KL reference model, mini-batch PPO clipping;
- load balancing across groups, sandbox pooling, infra-failure retries (failed ones are dropped);
- DDP / multi-process training, bf16, evaluation on held-out tasks and checkpoint gating.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import math
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from looprl.chat import ChatFormat
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.tools import make_tools
from looprl.inference import TorchEngine
from looprl.models.loading import load_model
from looprl.rewards.tests import pytest_command
from looprl.rollout.score import make_scorer
from looprl.sandbox import create_sandbox
from looprl.trainer.batch import build_batch
from looprl.trainer.losses import LossInputs, LossParams, get_loss
from looprl.trainer.step import token_logprobs
from looprl.types import Grader, Group, Task, Trajectory


@dataclass(frozen=True)
class Config:
    tasks: str = "inflection==0.5.1"
    """A NAME==VERSION package to build tasks from, or "fixture" for the built-in offline task."""
    model: str = ""
    """HF model directory; empty = the default small model (random init, cached)."""
    steps: int = 10
    tasks_per_step: int = 2
    group_size: int = 4
    """G: trajectories per task. Advantages compare trajectories of the same task."""
    max_turns: int = 3
    max_new_tokens: int = 128
    """Per turn; also Dr. GRPO's normalizer per sequence (with max_turns)."""
    context: int = 4096
    tools: tuple[str, ...] = ("read_file", "grep", "edit_file", "run_tests", "finish")
    """A small tool set keeps the prompt short for a tiny model; the harness offers 11."""
    lr: float = 1e-5
    """AdamW; RL on a pretrained policy uses 1e-6..1e-5."""
    max_grad_norm: float = 1.0
    threads: int = 2
    seed: int = 0


# ----------------------------------------------------------------------------- tasks and model

FIXTURE_SRC = "def add(a, b):\n    return a - b\n"
FIXTURE_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def fixture_task(root: Path) -> Task:
    """A one-bug package with a hidden test, written to ``root`` (for offline runs and tests)."""
    repo = root / "calc"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "calc.py").write_text(FIXTURE_SRC)
    (repo / "test_calc.py").write_text(FIXTURE_TEST)
    grader = Grader(pytest_command(), ("test_calc.py::test_add",), (), ("test_calc.py",), timeout_s=60)
    venv = str(Path(sys.executable).parent.parent)  # this venv has pytest
    return Task("calc-add", str(repo), "add(2, 3) should be 5", grader, venv)


def load_tasks(cfg: Config, scratch: Path) -> list[Task]:
    """Real tasks of one package (fetched from PyPI once, then cached), or the fixture task."""
    if cfg.tasks == "fixture":
        return [fixture_task(scratch)]
    from looprl.tasks.build import BuildConfig, build_package_tasks
    from looprl.tasks.sources import fetch_package

    return build_package_tasks(fetch_package(cfg.tasks), BuildConfig(max_tasks=20, seed=cfg.seed))


def load_policy(cfg: Config):
    """The model and tokenizer (the default small model is created on first use)."""
    from looprl.models.tiny import default_model_dir

    path = Path(cfg.model) if cfg.model else default_model_dir("small", 0)
    lm = load_model(path)
    return lm.model, lm.tokenizer


# ----------------------------------------------------------------------------- rollouts

SCORE = make_scorer()

async def rollout_one(task: Task, engine: TorchEngine, fmt: ChatFormat, cfg: Config,
                      group_id: str, index: int) -> Trajectory:
    """One trajectory: a fresh sandbox, the agent loop until it stops, then the hidden tests."""
    agent = AgentConfig(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                        max_total_new_tokens=cfg.max_turns * cfg.max_new_tokens,
                        context_window=cfg.context)  # sampled at temperature 1: on-policy logprobs
    tools = make_tools(list(cfg.tools), test_command=task.grader.test_command)
    sandbox = await create_sandbox(task.repo, venv=task.venv)
    try:
        traj = await run_agent(task, sandbox, engine, fmt, tools, agent,
                               group_id=group_id, trajectory_id=f"{group_id}/{index}")
    finally:
        await sandbox.close()
    if traj.is_infra_error:  # a broken sandbox is not the model's fault: never scored
        return traj
    reward = await SCORE(task, traj)  # hidden tests in a fresh sandbox + shaped length/style terms
    return dataclasses.replace(traj, reward=reward)


async def rollout_group(task: Task, engine: TorchEngine, fmt: ChatFormat, cfg: Config,
                        step: int) -> Group:
    """G trajectories of one task, concurrently, so the engine decodes them in one batch."""
    group_id = f"{task.id}@{step}"
    trajs = await asyncio.gather(*(rollout_one(task, engine, fmt, cfg, group_id, i)
                                   for i in range(cfg.group_size)))
    return Group(task.id, group_id, tuple(trajs))


# ----------------------------------------------------------------------------- the GRPO update

def grpo_update(model, optimizer, groups: list[Group], cfg: Config, pad_id: int) -> dict[str, float]:
    """Advantages within each group (reward - group mean, Dr. GRPO: no std scaling), then one
    optimizer step of the policy-gradient loss over every model-sampled token."""
    batch = build_batch(groups, pad_id=pad_id)  # Dr. GRPO; zero-variance groups skipped
    if batch.empty:  # every group had equal rewards: nothing to learn from this step
        return {"loss": 0.0, "tokens": 0, "grad_norm": 0.0,
                "zero_variance_groups": batch.zero_variance_groups}
    loss_fn = get_loss("dr_grpo")
    params = LossParams(norm_tokens=cfg.max_turns * cfg.max_new_tokens)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total_loss, tokens = 0.0, 0
    for mb in batch.micro_batches:  # gradients accumulate across micro-batches
        logprobs_B_T = token_logprobs(model, mb.tokens_B_T, mb.attention_mask_B_T)
        out = loss_fn(LossInputs(logprobs_B_T, mb.old_logprobs_B_T, mb.loss_mask_B_T,
                                 mb.advantages_B, batch.num_sequences), params)
        out.loss.backward()
        total_loss += float(out.loss.detach())
        tokens += out.tokens
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
    if math.isfinite(grad_norm):  # a NaN/inf gradient skips the update instead of ruining weights
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": total_loss, "tokens": tokens, "grad_norm": grad_norm,
            "zero_variance_groups": batch.zero_variance_groups}


# ----------------------------------------------------------------------------- the loop

def summarize(groups: list[Group]) -> dict[str, float]:
    trajs = [t for g in groups for t in g.trajectories if t.reward is not None]
    n = max(len(trajs), 1)
    return {"reward": sum(t.reward.total for t in trajs) / n,
            "pass_rate": sum(t.reward.components.get("tests", 0.0) >= 1.0 for t in trajs) / n,
            "output_tokens": sum(t.counters.output_tokens for t in trajs) / n,
            "infra_errors": sum(t.is_infra_error for g in groups for t in g.trajectories)}


async def train(cfg: Config, scratch: Path) -> list[dict[str, float]]:
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tasks = load_tasks(cfg, scratch)
    model, tok = load_policy(cfg)
    fmt = ChatFormat(tok)
    # The engine samples from its own copy; the trainer updates `model` and pushes the weights.
    engine = TorchEngine(copy.deepcopy(model), tok, max_len=cfg.context, seed=cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    order = random.sample(tasks, len(tasks))
    history = []
    try:
        for step in range(1, cfg.steps + 1):
            t0 = time.monotonic()
            batch_tasks = [order[((step - 1) * cfg.tasks_per_step + i) % len(order)]
                           for i in range(cfg.tasks_per_step)]
            groups = [await rollout_group(t, engine, fmt, cfg, step) for t in batch_tasks]
            t_roll = time.monotonic() - t0
            update = grpo_update(model, optimizer, groups, cfg, tok.pad_token_id)
            await engine.update_weights({k: v.detach().clone() for k, v in model.state_dict().items()},
                                        version=step)
            row = {"step": step, **summarize(groups), **update,
                   "rollout_s": t_roll, "step_s": time.monotonic() - t0}
            history.append(row)
            print(f"step {step:3d} | reward {row['reward']:+.3f} | pass {row['pass_rate']:.2f} | "
                  f"loss {row['loss']:+.4f} | tokens {row['tokens']:5d} | "
                  f"zero-var {row['zero_variance_groups']} | {row['rollout_s']:.1f}s rollout, "
                  f"{row['step_s']:.1f}s step", flush=True)
    finally:
        engine.close()
    return history


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(description="Minimal synchronous GRPO on a coding agent.")
    for name, field in Config.__dataclass_fields__.items():
        if name == "tools":
            p.add_argument("--tools", default=",".join(field.default),
                           help="comma-separated harness tool names")
        else:
            p.add_argument(f"--{name.replace('_', '-')}", type=type(field.default),
                           default=field.default)
    ns = vars(p.parse_args(argv))
    ns["tools"] = tuple(t for t in ns["tools"].split(",") if t)
    return Config(**ns)


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    cfg = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpo-minimal-") as scratch:
        return asyncio.run(train(cfg, Path(scratch)))


if __name__ == "__main__":
    main()
