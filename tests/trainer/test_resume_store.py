"""``GRPOLoop.resume`` makes the checkpoint, the weight store and ``metrics.jsonl`` agree — the
states a kill leaves, built by hand (the real kills are in ``test_resume_kill.py``)."""

import asyncio
import itertools
import json

import pytest
import torch

from looprl.errors import WeightStoreError
from looprl.trainer.config import GRPOConfig, LoopConfig
from looprl.trainer.grpo import GRPOLoop
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOStep
from looprl.types import Grader, Task
from looprl.weights.store import LocalWeightStore

from .helpers import tiny_llama


def loop_at(tmp_path, seed: int) -> GRPOLoop:
    """A loop over a fresh tiny model (``seed``), its store and run dir under ``tmp_path``."""
    tasks = [Task(f"t{i}", "/r", "p", Grader("pytest")) for i in range(6)]
    step = GRPOStep(tiny_llama(seed), GRPOConfig(lr=1e-2))
    return GRPOLoop(step, None, None, TaskSampler(tasks), LoopConfig(),  # type: ignore[arg-type]
                    store=LocalWeightStore(str(tmp_path / "weights")), run_dir=tmp_path / "run")


def publish_step(loop: GRPOLoop, tasks: list[str]) -> None:
    """What a step leaves behind: moved weights, the next version published, a metrics row."""
    with torch.no_grad():
        for p in loop.step.model.parameters():
            p.add_(0.01)
    loop.version += 1
    loop.stats.steps += 1
    loop.store.publish(loop._weights(), loop.version)
    loop.sampler.mark_trained(tasks)
    with open(loop.run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": loop.stats.steps, "tasks": tasks}) + "\n")


def bf16(sd):
    return {k: v.to(torch.bfloat16) for k, v in sd.items()}


def test_versions_published_after_the_checkpoint_are_rolled_back(tmp_path):
    old = loop_at(tmp_path, seed=0)
    publish_step(old, ["t0"])
    publish_step(old, ["t1"])
    old.checkpoint()
    saved = bf16(old._weights())
    publish_step(old, ["t2"])  # then killed: checkpoint_every > 1, or before the checkpoint
    publish_step(old, ["t3"])
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "tas')  # a row cut short by the kill

    new = loop_at(tmp_path, seed=1)
    resumed = new.resume()
    assert resumed.step == 2 and resumed.weight_version == 2 and resumed.discarded_versions == (3, 4)
    assert new.version == 2 and new.store.versions() == [1, 2]
    got = LocalWeightStore(str(tmp_path / "weights")).load()
    assert got.version == 2 and all(torch.equal(got.state_dict[k], w) for k, w in saved.items())
    assert all(torch.equal(w, saved[k]) for k, w in bf16(new._weights()).items())
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["tasks"] for r in rows] == [["t0"], ["t1"]]
    # lost steps' tasks come back (then the walk waits for those out: None)
    back = itertools.takewhile(lambda t: t is not None, new.sampler)
    assert {t.id for t in back} == {"t2", "t3", "t4", "t5"}
    publish_step(new, ["t2"])  # the next publish is version 3 again
    assert new.store.latest() == 3


def test_a_checkpoint_version_the_store_lost_is_republished(tmp_path):
    old = loop_at(tmp_path, seed=0)
    publish_step(old, ["t0"])
    old.checkpoint()
    saved = bf16(old._weights())
    (tmp_path / "weights" / "v0000000001" / "data.zst").write_bytes(b"")
    new = loop_at(tmp_path, seed=1)
    assert new.resume().discarded_versions == ()
    got = LocalWeightStore(str(tmp_path / "weights")).load()
    assert got.version == 1 and got.fallback is None
    assert all(torch.equal(got.state_dict[k], w) for k, w in saved.items())


def test_a_run_killed_before_its_first_checkpoint_starts_over_cleanly(tmp_path):
    old = loop_at(tmp_path, seed=0)
    publish_step(old, ["t0"])
    publish_step(old, ["t1"])
    new = loop_at(tmp_path, seed=0)
    assert new.resume() is None
    assert new.store.versions() == [] and new.version == 0
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""


def test_a_fresh_run_into_a_store_that_is_ahead_is_refused_before_training(tmp_path):
    old = loop_at(tmp_path, seed=0)
    publish_step(old, ["t0"])
    with pytest.raises(WeightStoreError, match="resume the run"):
        asyncio.run(loop_at(tmp_path, seed=0).run())


def test_a_resumed_loop_counts_the_groups_of_its_kept_steps(tmp_path):
    old = loop_at(tmp_path, seed=0)
    publish_step(old, ["t0", "t1"])
    publish_step(old, ["t2"])
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    rows[-1].update({"loop/groups_stale": 3, "train/zero_variance_groups": 1})
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    old.checkpoint()
    new = loop_at(tmp_path, seed=1)
    assert new.resume() is not None
    assert new.stats.steps == 2 and new.stats.groups_trained == 3
    assert new.stats.groups_stale == 3 and new.stats.zero_variance_groups == 1
