"""A zygote for the kill -9 resume test: imports the heavy libraries once, then forks one real
training run per request, so a test can kill and resume a run dozens of times in seconds.

    python -m tests.trainer.grpo_resume_worker          # then, one JSON request a line on stdin:
    {"run_dir": "...", "tasks": 12, "run": 3, "kill_at": "publish.blob:1", "max_train": 3}
    -> "pid 4242"  when the run started, then  "exit -9"  when it ended (by signal: minus it)

Each run is a real ``GRPOLoop``: a tiny random Llama on the real ``TorchEngine``, a real
``RolloutRunner`` over real bubblewrap sandboxes, a real ``LocalWeightStore`` in ``run_dir/weights``
and checkpoints every 2 steps in ``run_dir/ckpt``. It resumes (``loop.resume()``) from whatever the
previous run left. The scorer is the test double: a reward drawn from the sampled tokens, so
groups have variance (and the model moves) without running a grader.

``kill_at = "POINT:N"`` (or null) makes the run SIGKILL itself at the N-th time it reaches POINT
(the points are in ``POINTS``). ``max_train = M`` (or null) freezes the run after its M-th
optimizer step, before that step's publish, until it is killed: with checkpoints every 2 steps a
run to be killed then keeps at most 2 steps, so a test knows how many tasks outlast its kills. The run appends to ``run_dir/journal.jsonl`` — outside the code under
test — what it resumed from, each group it trained (task, step, oldest token version) and where it
killed itself, so the test can rebuild which tasks went into the surviving weights.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import matplotlib
import safetensors.torch
import torch

from looprl.chat import ChatFormat
from looprl.harness.agent import AgentConfig
from looprl.inference import TorchEngine
from looprl.models.tokenizer import build_tokenizer
from looprl.rewards.composite import reward_metrics
from looprl.rollout.config import RolloutConfig
from looprl.rollout.runner import RolloutRunner
from looprl.sandbox import SandboxPool
from looprl.trainer.config import GRPOConfig, GRPOExperimental, LoopConfig, LoopExperimental
from looprl.trainer.grpo import GRPOLoop
from looprl.trainer.losses import LossParams
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOStep
from looprl.types import RewardBreakdown, Task, Trajectory
from looprl.weights.store import LocalWeightStore
from tests.trainer.test_grpo_loop import _model, _tasks

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402,F401  (imported once here, not in every forked run)

POINTS = ("rollout", "train", "publish.blob", "publish.manifest", "publish.done", "metrics.torn",
          "checkpoint.files", "checkpoint.rename", "checkpoint.done", "checkpoint.prune", "rollback")
"""Where a run can be told to kill itself: mid-rollout (an engine call), after an optimizer step
(weights changed in memory only), after a version's blob / its temporary manifest / the whole
publish, half-way through a metrics row, after the checkpoint's files / before its rename / after
it, in the middle of pruning old checkpoints, and in the middle of the store's rollback on resume."""


class Run:
    """One training run inside a forked child: journal, kill point, the loop."""

    def __init__(self, req: dict) -> None:
        self.dir = Path(req["run_dir"])
        self.n, self.id, self.max_train = int(req["tasks"]), int(req["run"]), req.get("max_train")
        self.trained = 0
        point, _, count = (req.get("kill_at") or ":0").partition(":")
        self.kill_point, self.kill_count = point, int(count)
        self.hits = 0
        self.journal_fd = os.open(self.dir / "journal.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def note(self, event: str, **fields: object) -> None:
        row = {"run": self.id, "event": event, "t": round(time.time(), 3), **fields}
        os.write(self.journal_fd, (json.dumps(row) + "\n").encode())

    def at(self, point: str) -> None:
        """Kill this process here if told to (the n-th time it reaches ``point``)."""
        if point == self.kill_point:
            self.hits += 1
            if self.hits == self.kill_count:
                self.note("kill", point=point)
                os.kill(os.getpid(), signal.SIGKILL)

    def install(self, loop: GRPOLoop, engine: TorchEngine, store: LocalWeightStore) -> None:
        """Wrap the seams where the kill points sit (this child process only)."""
        generate, on_groups, log = engine.generate, loop.step.on_groups, loop._log

        async def gen(*a, **k):
            self.at("rollout")
            return await generate(*a, **k)

        def train(groups, **k):
            metrics = on_groups(groups, **k)
            self.note("train", step=loop.stats.steps + 1, tasks=[g.task_id for g in groups],
                      oldest=[int(g.metadata["min_policy_version"]) for g in groups])
            self.at("train")
            self.trained += 1
            if self.trained == self.max_train:
                self.note("frozen")
                time.sleep(3600)  # until the test kills this run
            return metrics

        def log_row(*a, **k):
            if self.kill_point == "metrics.torn" and self.hits + 1 == self.kill_count:
                with open(self.dir / "metrics.jsonl", "a") as f:
                    f.write(f'{{"step": {loop.stats.steps + 1}, "tasks": ["cut sh')
            self.at("metrics.torn")
            return log(*a, **k)

        engine.generate, loop.step.on_groups, loop._log = gen, train, log_row
        pipe, publish = store.fs.pipe_file, store.publish

        def pipe_file(path, data, **k):
            pipe(path, data, **k)
            self.at("publish.blob" if path.endswith("data.zst") else "publish.manifest")

        def published(*a, **k):
            publish(*a, **k)
            self.at("publish.done")

        store.fs.pipe_file, store.publish = pipe_file, published
        remove, replace, save_model, rmtree = (store._remove, os.replace,
                                               safetensors.torch.save_model, shutil.rmtree)

        def store_remove(v):
            remove(v)
            self.at("rollback")

        def os_replace(src, dst):
            if Path(src).name.startswith(".tmp-step_"):
                self.at("checkpoint.rename")
            return replace(src, dst)

        def save(model, path, *a, **k):
            save_model(model, path, *a, **k)
            self.at("checkpoint.files")

        def remove_tree(path, *a, **k):
            if Path(path).parent.name == "ckpt" and Path(path).name.startswith("step_"):
                self.at("checkpoint.prune")  # the library has removed its meta.json already
            return rmtree(path, *a, **k)

        ckpt = loop.checkpoint

        def checkpointed():
            out = ckpt()
            self.at("checkpoint.done")
            return out

        store._remove, os.replace, safetensors.torch.save_model = store_remove, os_replace, save
        shutil.rmtree, loop.checkpoint = remove_tree, checkpointed

    async def main(self) -> None:
        torch.set_num_threads(1)
        tok = build_tokenizer(None)
        model = _model(tok)
        engine = TorchEngine(copy.deepcopy(model), tok, max_len=2048, num_threads=1, max_slots=8,
                             kv_budget_mb=64)
        pool = SandboxPool(max_running=2)
        try:
            runner = RolloutRunner(engine, ChatFormat(tok), pool, score, RolloutConfig(
                group_size=2, max_in_flight=2, tools=("finish",),  # one tool: a short prompt
                agent=AgentConfig(max_turns=1, max_new_tokens=8, context_window=2048)))
            step = GRPOStep(model, GRPOConfig(lr=1e-2, experimental=GRPOExperimental(
                objective=LossParams(norm_tokens=16))), pad_id=tok.pad_token_id)
            store = LocalWeightStore(str(self.dir / "weights"))
            loop = GRPOLoop(step, engine, runner, TaskSampler(_tasks(self.dir / "tasks", self.n)),
                            LoopConfig(groups_per_step=1, experimental=LoopExperimental(
                                queue_size=2, checkpoint_every=2, max_staleness=10**6)),
                            store=store, run_dir=self.dir,
                            batch_metrics=reward_metrics)
            self.install(loop, engine, store)
            before = store.versions()
            loop.resume()
            self.note("start", step=loop.stats.steps, version=loop.version,
                      discarded=sorted(set(before) - set(store.versions())))
            stats = await loop.run()
            loop.checkpoint()
            self.note("done", step=stats.steps, version=loop.version, dropped=stats.groups_dropped,
                      infra=runner.stats.infra_errors)
        finally:
            await pool.close()
            engine.close()


async def score(task: Task, trajectory: Trajectory) -> RewardBreakdown:
    """Test double of the grader: 1 or 0 from the parity of the sampled tokens."""
    ids = [t for s in trajectory.segments for t, m in zip(s.token_ids_T, s.loss_mask_T, strict=True) if m]
    return RewardBreakdown.of({"tests": float(sum(ids) % 2)})


def child(req: dict) -> None:
    log = os.open(Path(req["run_dir"]) / f"run-{req['run']}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        asyncio.run(Run(req).main())
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        Path(req["run_dir"]).mkdir(parents=True, exist_ok=True)
        pid = os.fork()
        if pid == 0:
            child(req)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    main()
