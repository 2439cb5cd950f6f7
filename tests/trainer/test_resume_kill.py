"""kill -9 a real training run again and again — at random moments and at named points inside
rollouts, training, publishes, metrics writes, checkpoint writes and the resume itself — resuming
it each time. At the end no task is lost, none is trained twice into the final weights, and the
checkpoint, the weight store and ``metrics.jsonl`` all describe one model.

    pytest -s tests/trainer/test_resume_kill.py     # prints the kills and the counts

The runs come from ``grpo_resume_worker`` (a zygote that forks a real GRPOLoop per run); its
journal, written outside the code under test, says which tasks each run trained at which step,
from which step it resumed, and where it killed itself.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import safetensors.torch
import torch

from looprl.trainer.checkpoint import latest_checkpoint
from looprl.weights.store import LocalWeightStore
from tests.bwrap_support import needs_bwrap
from tests.trainer.grpo_resume_worker import POINTS

pytestmark = [*needs_bwrap, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TIMED_KILLS = 20
RUNS = TIMED_KILLS + len(POINTS) + 5
"""Kill rounds at most: the plan, the ``SETUP`` kills, and timed rounds run again when the run
froze (``max_train``) before its random moment came."""
SETUP = {"rollback": "publish.done", "checkpoint.prune": "checkpoint.done"}
"""A kill that makes a point reachable when only unreachable ones are left: a run's first
publish is never checkpointed (every 2 steps), so the store gets ahead of the checkpoint; a kill
after a checkpoint leaves one more of them."""
N_TASKS = 2 * RUNS + 4
"""A run to be killed keeps at most 2 steps (``max_train=3``, checkpoints every 2 steps), so the
task set outlasts every kill and the last run still has tasks to train."""
MAX_COUNT = {"rollout": 4, "train": 3, "publish.blob": 2, "publish.manifest": 2, "publish.done": 2,
             "metrics.torn": 2}
"""The latest occurrence of each point a run frozen after 3 steps still reaches (the others: 1)."""


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.trainer.grpo_resume_worker"], cwd=ROOT, text=True,
            # the caller's path too: the worker imports the looprl the test does
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(ROOT), os.environ.get("PYTHONPATH", "")])},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def start(self, run_dir: Path, run: int, kill_at: str | None, max_train: int | None = 3) -> int:
        req = {"run_dir": str(run_dir), "tasks": N_TASKS, "run": run, "kill_at": kill_at,
               "max_train": max_train}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return int(self._line("pid"))

    def exit_code(self) -> int:
        return int(self._line("exit"))

    def _line(self, key: str) -> str:
        line = self.proc.stdout.readline()
        assert line.startswith(key + " "), f"zygote said {line!r}"
        return line.split()[1]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def journal(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]


def ready(point: str, run_dir: Path) -> bool:
    """Whether the next run can reach ``point``: a rollback needs the store ahead of the newest
    checkpoint, pruning needs three checkpoints already (``keep=3``)."""
    if point == "rollback":
        ckpt = latest_checkpoint(run_dir / "ckpt")
        saved = json.loads((ckpt / "meta.json").read_text())["weight_version"] if ckpt else 0
        return (LocalWeightStore(run_dir / "weights").latest() or 0) > saved
    if point == "checkpoint.prune":
        return len(list((run_dir / "ckpt").glob("step_*"))) >= 3
    return True


def frozen(run_dir: Path, run: int) -> bool:
    """The run reached ``max_train`` and waits to be killed."""
    path = run_dir / "journal.jsonl"
    return path.exists() and f'"run": {run}, "event": "frozen"' in path.read_text()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # the zygote reaps its child at once: gone means dead
    except ProcessLookupError:
        return False
    return True


def lineage(events: list[dict], run: int, upto: int) -> dict[int, list[str]]:
    """Step -> tasks trained into the weights ``run`` had at step ``upto``: its own steps after
    the step it resumed from, before that the steps of the run whose checkpoint it resumed (the
    last earlier run that trained that step: a later one would have checkpointed further)."""
    start = next(e["step"] for e in events if e["run"] == run and e["event"] == "start")
    steps = {e["step"]: e["tasks"] for e in events
             if e["run"] == run and e["event"] == "train" and start < e["step"] <= upto}
    if start > 0:
        parent = max(e["run"] for e in events
                     if e["run"] < run and e["event"] == "train" and e["step"] == start)
        steps.update(lineage(events, parent, start))
    return steps


def test_kill_9_anywhere_then_resume_loses_no_task_and_trains_none_twice(tmp_path):
    rng = random.Random(23)
    run_dir = tmp_path / "run"
    named = list(POINTS)
    rng.shuffle(named)
    plan: list[str | None] = [None] * TIMED_KILLS + named  # None: killed after a random delay
    rng.shuffle(plan)
    zygote = Zygote()
    kills: Counter[str] = Counter()
    t0 = time.monotonic()
    run = 0
    window = 2.0  # s: random kills fall in [0.2, window] after the run's fork
    ahead = 0
    landed: Counter[str] = Counter()
    """Random kills by the run's last journal entry: init (resume included), start (first
    rollout and step), train (the step's publish, metrics, checkpoint, the next rollout)."""
    try:
        while plan and run < RUNS:
            i = next((i for i, p in enumerate(plan) if p is None or ready(p, run_dir)), None)
            point = plan.pop(i) if i is not None else SETUP[plan[0]]
            count = rng.randint(1, MAX_COUNT.get(point, 1)) if i is not None else 1
            pid = zygote.start(run_dir, run, f"{point}:{count}" if point else None)
            started = time.monotonic()
            deadline = started + (rng.uniform(0.2, window) if point is None else 20)
            while alive(pid) and time.monotonic() < deadline and not frozen(run_dir, run):
                time.sleep(0.01)
            timed_out, was_frozen = alive(pid), frozen(run_dir, run)
            if timed_out:
                os.kill(pid, signal.SIGKILL)
            code = zygote.exit_code()
            log = (run_dir / f"run-{run}.log").read_text()[-3000:]
            assert code == -signal.SIGKILL, f"run {run} ({point}) ended with {code} before its kill:\n{log}"
            fired = [e["point"] for e in journal(run_dir) if e["run"] == run and e["event"] == "kill"]
            if point is not None:
                assert fired == [point] and not timed_out, f"run {run} never reached {point}:\n{log}"
            if point is None and was_frozen:  # killed where it waited, not at a random moment
                plan.append(None)
                window = 0.9 * (time.monotonic() - started)  # this machine runs 3 steps faster
            kills[point or ("frozen" if was_frozen else "random time")] += 1
            if point is None and not was_frozen:
                last = [e for e in journal(run_dir) if e["run"] == run]
                landed[last[-1]["event"] if last else "init"] += 1
            ahead += ready("rollback", run_dir)  # the case that used to make resume fail
            run += 1
        pid = zygote.start(run_dir, run, None, max_train=None)  # the last run finishes
        code = zygote.exit_code()
        assert code == 0, (run_dir / f"run-{run}.log").read_text()[-3000:]
    finally:
        zygote.close()
    wall = time.monotonic() - t0

    events = journal(run_dir)
    done = next(e for e in events if e["run"] == run and e["event"] == "done")
    final = done["step"]
    steps = lineage(events, run, final)
    assert sorted(steps) == list(range(1, final + 1))
    trained = Counter(t for tasks in steps.values() for t in tasks)
    lost = {f"calc-{i}" for i in range(N_TASKS)} - set(trained)
    twice = {t: n for t, n in trained.items() if n > 1}
    starts = {e["run"]: e for e in events if e["event"] == "start"}
    discarded = sum(len(s["discarded"]) for s in starts.values())
    print(f"\n{sum(kills.values())} kills ({dict(kills)}; random ones after {dict(landed)}), "
          f"{run} resumes, {ahead} kills left "
          f"the store ahead of the checkpoint, {discarded} versions rolled back by journaled "
          f"resumes, {final} steps in the final model, tasks lost {len(lost)}, tasks trained twice "
          f"{len(twice)}, {wall:.1f} s")
    assert sum(kills.values()) - kills["frozen"] >= 20 and not plan and set(kills) >= set(POINTS)
    assert not lost and not twice, (lost, twice)
    assert ahead > 0

    # every resumed run sampled from the checkpoint's weights, never from older ones
    for e in events:
        if e["event"] == "train":
            assert min(e["oldest"]) >= starts[e["run"]]["version"], e

    # the log describes the final model: one row per step, the tasks of its lineage
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, final + 1))
    assert all(r["tasks"] == steps[r["step"]] for r in rows)
    trajs = [json.loads(line) for line in
             (run_dir / "trajectories" / "train.jsonl").read_text().splitlines()]
    by_step: dict[int, set[str]] = {}
    for t in trajs:  # the saved trajectories are those of the kept steps, each step's tasks
        by_step.setdefault(t["metadata"]["train_step"], set()).add(t["task_id"])
    assert by_step == {r["step"]: set(r["tasks"]) for r in rows}

    # checkpoint, store and weights agree
    ckpt = latest_checkpoint(run_dir / "ckpt")
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["step"] == final and meta["weight_version"] == final == done["version"]
    assert sorted(meta["sampler_state"]["trained"]) == sorted(trained)
    store = LocalWeightStore(run_dir / "weights")
    assert store.versions() == list(range(1, final + 1))
    for v in store.versions():  # every version readable (what `looprl weights verify` checks)
        store.fetch(v)
    got = store.load()
    assert got.version == final and got.fallback is None
    weights = safetensors.torch.load_file(str(ckpt / "model.safetensors"))
    for name, w in weights.items():
        assert torch.equal(got.state_dict[name], w.to(torch.bfloat16)), name
