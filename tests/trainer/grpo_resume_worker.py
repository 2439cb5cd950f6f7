"""A real GRPOLoop run (tiny random Llama on the torch engine, calc tasks in bubblewrap sandboxes,
hidden-test rewards) that checkpoints every step and resumes from the newest checkpoint.

    python grpo_resume_worker.py RUN_DIR N_TASKS

Each step trains one group; ``metrics.jsonl`` rows name the task each step trained.
"""

import asyncio
import copy
import sys
from pathlib import Path

import torch

from looprl.harness.agent import AgentConfig
from looprl.harness.format import ChatFormat
from looprl.inference import TorchEngine
from looprl.models.tokenizer import build_tokenizer
from looprl.rollout.runner import RolloutConfig, RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.sandbox import SandboxPool
from looprl.trainer.grpo import GRPOLoop, LoopConfig, TaskSampler
from looprl.trainer.step import GRPOConfig, GRPOStep
from tests.trainer.test_grpo_loop import _model, _tasks


def main() -> None:
    run_dir, n = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    tok = build_tokenizer(None)
    model = _model(tok)
    engine = TorchEngine(copy.deepcopy(model), tok, max_len=16384, num_threads=1)

    async def run() -> None:
        pool = SandboxPool(max_running=2)
        try:
            runner = RolloutRunner(engine, ChatFormat(tok), pool, make_scorer(), RolloutConfig(
                group_size=2, max_in_flight=2,
                agent=AgentConfig(max_turns=2, max_new_tokens=16, context_window=16384)))
            step = GRPOStep(model, GRPOConfig(lr=1e-3, norm_tokens=32), pad_id=tok.pad_token_id)
            loop = GRPOLoop(step, engine, runner, TaskSampler(_tasks(run_dir / "tasks", n)),
                            LoopConfig(groups_per_step=1, queue_size=2, checkpoint_every=1),
                            run_dir=run_dir)
            resumed = loop.resume()
            print(f"resumed at step {resumed.step}" if resumed else "fresh start", flush=True)
            stats = await loop.run()
            print(f"done: {stats.steps} steps", flush=True)
        finally:
            await pool.close()
            engine.close()

    asyncio.run(run())


if __name__ == "__main__":
    main()
