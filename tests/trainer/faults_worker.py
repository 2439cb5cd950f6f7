"""One life of a training run under injected faults, for ``test_faults_resume``: the real RL
stage of ``looprl train`` (``train.stages.train_rl``: the injector from the config's ``faults``
section, the run's ledger, the retrying weight store, rollouts through an HTTP env server in a
thread) on a tiny random Llama, resuming whatever an earlier life left.

    python -m tests.trainer.faults_worker RUN_DIR    # exit 0: RL finished; -9: the injector killed it
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from looprl.faults import FaultsConfig
from looprl.fleet.config import FleetConfig, FleetExperimental
from looprl.harness.agent import AgentConfig
from looprl.models.tokenizer import build_tokenizer
from looprl.rollout.config import RolloutConfig, RolloutExperimental
from looprl.rundir import RunDir
from looprl.train.config import ModelExperimental, ModelSection, TasksSection, TrainConfig
from looprl.train.stages import train_rl
from looprl.trainer.config import GRPOConfig, GRPOExperimental, LoopConfig, LoopExperimental
from looprl.trainer.losses import LossParams
from tests.trainer.test_grpo_loop import _model, _tasks

N_TASKS = 8
RATES = {"sandbox_create": 0.05, "grader_crash": 0.05, "engine_error": 0.05,
         "weight_write": 0.05, "env_server_5xx": 0.05, "connection_dropped": 0.05,
         "process_killed": 0.3}
SEED = 2
"""A seed whose first life is killed (the kill's draws are their own stream, ``faults``)."""


def config() -> TrainConfig:
    return TrainConfig(
        name="faults", tasks=TasksSection(train_file="unused.jsonl"),
        model=ModelSection(device="cpu", experimental=ModelExperimental(rl_threads=1)),
        grpo=GRPOConfig(lr=1e-3, experimental=GRPOExperimental(
            objective=LossParams(norm_tokens=48))),
        loop=LoopConfig(groups_per_step=2, loggers=(), experimental=LoopExperimental(
            queue_size=2, checkpoint_every=1, max_staleness=10**6)),
        rollout=RolloutConfig(group_size=2, max_in_flight=4,
                              experimental=RolloutExperimental(max_infra_retries=4),
                              tools=("read_file", "finish"),
                              agent=AgentConfig(max_turns=2, max_new_tokens=16,
                                                context_window=16384)),
        fleet=FleetConfig(experimental=FleetExperimental(sandboxes="http")), faults=FaultsConfig(RATES, seed=SEED))


def main(run_dir: Path) -> None:
    torch.set_num_threads(1)
    tok = build_tokenizer(None)
    resume = RunDir(run_dir).infra_ledger.is_file()
    train_rl(config(), _model(tok), tok, run_dir / "start", _tasks(run_dir / "tasks", N_TASKS),
             run_dir, resume=resume)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
