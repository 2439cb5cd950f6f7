"""Shared builders for dashboard tests: a run directory whose ``metrics.jsonl`` and
``trajectories/train.jsonl`` the real ``GRPOLoop`` wrote (real GRPO steps on a tiny random Llama,
one of them skipped for lack of reward variance), a trajectory the real agent loop made and the
real scorer graded, a feedback store, a real-time loop run directory (real ``CycleRow``s, A/B
reports and result line), a uvicorn helper."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import uvicorn

from looprl.chat import ChatFormat
from looprl.config import load_config, save_config
from looprl.faults import InfraLedger
from looprl.feedback.ab import ABReport, compare_arms
from looprl.feedback.gate import ab_decision
from looprl.feedback.loop import LoopResult
from looprl.feedback.loop_cycle import CycleRow
from looprl.feedback.realtime_config import RealtimeConfig
from looprl.feedback.store import FeedbackStore
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.hinted import continue_with_hint
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import make_tools
from looprl.models.tokenizer import build_tokenizer
from looprl.rewards.composite import reward_metrics
from looprl.rollout.runner import RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.train.config import TrainConfig
from looprl.train.plots import plot_curves
from looprl.trainer.config import GRPOConfig, GRPOExperimental, LoopConfig
from looprl.trainer.grpo import GRPOLoop
from looprl.trainer.losses import LossParams
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOStep
from looprl.types import Grader, Task, Trajectory
from tests.feedback.conftest import make_traj
from tests.harness.conftest import calc_repo, call
from tests.harness.dir_sandbox import DirSandbox
from tests.trainer.helpers import group, segment, tiny_llama, trajectory

STEPS = 3
SKIPPED_STEP = 2
"""Its groups have no reward variance: the step trains on no token."""


class RecordingEngine:
    """Engine test double: the loop hands it each new version (nothing is generated here)."""

    policy_version = 0

    async def update_weights(self, state_dict, version: int) -> None:
        self.policy_version = version


def _groups(step: int) -> list:
    """Two groups per step; one trajectory of each passes (reward variance), except at
    ``SKIPPED_STEP`` where both fail alike (nothing to learn: the step trains on no token)."""
    out = []
    for g in range(2):
        gid = f"s{step}g{g}"
        good = -0.5 if step + 1 == SKIPPED_STEP else 1.0
        out.append(group([trajectory([segment([1, 2, 3], [4 + step, 5, 6], version=step)], good, gid),
                          trajectory([segment([1, 2, 3], [7, 8 + g], version=step)], -0.5, gid)],
                         gid))
    return out


def write_grpo_run(run_dir: Path, steps: int = STEPS, cfg: LoopConfig | None = None,
                   infra: InfraLedger | None = None,
                   before_step: Callable[[int], None] | None = None) -> Path:
    """Train ``steps`` real GRPO steps through ``GRPOLoop._train`` -> ``_log`` (the exact code that
    writes ``metrics.jsonl`` and the trained trajectories in a run); the rollout side is skipped:
    groups are hand-made. ``infra``: the run's ledger (rows log it); ``before_step(i)`` runs
    before step i (a test records what the rollouts of the step met)."""
    tok = build_tokenizer(None)
    model = tiny_llama()
    step = GRPOStep(model, GRPOConfig(lr=1e-3, experimental=GRPOExperimental(
        objective=LossParams(norm_tokens=8))), pad_id=0)
    runner = RolloutRunner(RecordingEngine(), ChatFormat(tok), None, make_scorer())
    loop = GRPOLoop(step, RecordingEngine(), runner, TaskSampler([]),
                    cfg or LoopConfig(groups_per_step=2), run_dir=run_dir,
                    batch_metrics=reward_metrics, infra=infra)
    loop._t0 = time.monotonic()  # run() sets this; we drive the trainer side directly

    async def train() -> None:
        for i in range(steps):
            if before_step is not None:
                before_step(i)
            await loop._train(_groups(i), None)

    asyncio.run(train())
    loop._finish()
    plot_curves(loop.stats.history, run_dir / "reward_curve.png")  # as ``looprl train`` does
    return run_dir


class UpdatedMidRollout(ScriptedPolicy):
    """The scripted engine double, given new weights (v1 -> v2) after its third turn, as the
    async loop does to a trajectory in flight."""

    async def generate(self, prompt_ids, params, **kw):
        gen = await super().generate(prompt_ids, params, **kw)
        if len(self.prompts) == 3:
            await self.update_weights({}, self.policy_version + 1)
        return gen


def agent_trajectory(root: Path) -> Trajectory:
    """The real agent loop fixing a real repo (a broken call on the way), graded by the real
    scorer (hidden tests in a bubblewrap sandbox)."""
    repo = calc_repo(root / "calc")
    task = Task(id="calc-1", repo=str(repo), prompt="add() subtracts; make it add.", venv=sys.prefix,
                grader=Grader("python -m pytest", fail_to_pass=("tests/test_calc.py::test_add",),
                              pass_to_pass=("tests/test_calc.py::test_sub",),
                              test_files=("tests/test_calc.py",)))
    tok = build_tokenizer(None)
    turns = ["Let me find add. " + call("grep", pattern="def add"),
             call("read_file", path="pkg/calc.py"),
             '<tool_call>{"name": "edit_file", "arguments": "oops"}</tool_call>',
             "It subtracts. <script>alert(1)</script> " + call(
                 "edit_file", path="pkg/calc.py", old_string="def add(a, b):\n    return a - b",
                 new_string="def add(a, b):\n    return a + b"),
             call("finish", summary="add() now adds")]
    policy = UpdatedMidRollout(tok, turns)
    policy._version = 1

    async def go() -> Trajectory:
        sb = DirSandbox(repo)
        try:
            t = await run_agent(task, sb, policy, ChatFormat(tok), make_tools(),
                                AgentConfig(max_turns=8), group_id="calc-1@g", trajectory_id="calc-1@g/0")
        finally:
            await sb.close()
        return dataclasses.replace(t, reward=await make_scorer()(task, t))

    return asyncio.run(go())


HINT = "Turn 3: this call is malformed: arguments are not a JSON object"


def hinted_trajectory(prefix: Trajectory, repo: Path) -> Trajectory:
    """``prefix`` (``agent_trajectory``'s) continued after its broken turn 3 with ``HINT``
    through the real ``harness.hinted``, as targeted feedback records it in ``hinted.jsonl``."""
    tok = build_tokenizer(None)
    turns = [call("edit_file", path="pkg/calc.py", old_string="def add(a, b):\n    return a - b",
                  new_string="def add(a, b):\n    return a + b"), call("finish", summary="fixed")]
    task = Task(id=prefix.task_id, repo=str(repo), prompt="add() subtracts; make it add.",
                grader=Grader("python -m pytest"))

    async def go() -> Trajectory:
        sb = DirSandbox(repo)
        try:
            return await continue_with_hint(
                task, sb, ScriptedPolicy(tok, turns), ChatFormat(tok), make_tools(),
                AgentConfig(max_turns=8), prefix, turn=3, text=HINT, kind="broken_call",
                group_id=prefix.group_id, trajectory_id=f"{prefix.id}+hint")
        finally:
            await sb.close()

    with ThreadPoolExecutor(1) as pool:  # its own event loop: Playwright's runs in this thread
        return pool.submit(asyncio.run, go()).result()


@pytest.fixture
def hinted_run(grpo_run: Path, run_copy: Path) -> Path:
    """The run with ``trajectories/hinted.jsonl`` (one hinted continuation of its evaluated
    trajectory) and hint metrics on its steps after the first."""
    from looprl.dashboard.data import TrajectoryIndex

    prefix = TrajectoryIndex(run_copy / "trajectories" / "eval_rl.jsonl").read(0)
    t = hinted_trajectory(prefix, grpo_run.parent / "calc")
    (run_copy / "trajectories" / "hinted.jsonl").write_text(t.to_json() + "\n")
    metrics = rows(run_copy)
    for r in metrics:
        on = r["step"] > 1
        r |= {"train/hints": 2.0 * on, "train/hint_kl": 0.05 * on, "train/hint_pass_rate": 0.5 * on}
    (run_copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    return run_copy


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory) -> Path:
    """A run directory as ``looprl train`` leaves it: config, metrics, trained trajectories,
    evaluations with their trajectories, report.md with its chart."""
    root = tmp_path_factory.mktemp("runs")
    run = write_grpo_run(root / "alpha")
    save_config(load_config(TrainConfig, None, ["name=alpha", "tasks.train_file=tasks.jsonl"]),
                run / "config.json")
    traj = agent_trajectory(root)
    build_tokenizer(None).save_pretrained(run / "model_rl")  # what the viewer decodes tokens with
    (run / "trajectories" / "eval_rl.jsonl").write_text(traj.to_json() + "\n")
    (run / "report.md").write_text(
        "# looprl train — alpha\n\nTasks: **1** held-out.\n\n| metric | start | RL |\n"
        "|---|---|---|\n| pass@1 | 0.200 | 0.400 |\n\n![reward curve](reward_curve.png)\n\n"
        "heldout_pass1_sft=0.2 heldout_pass1_rl=0.4\n")
    for name, p in (("eval_start.json", 0.2), ("eval_rl.json", 0.4)):
        (run / name).write_text(json.dumps({"policy": name[5:-5], "n_tasks": 1, "metrics": {
            "pass@1": p, "mean_output_tokens": 120.0, "mean_tool_calls": 3.0},
            "per_task": {"calc-1": {"n": 5, "correct": round(5 * p), "pass@1": p}}}))
    return run


@pytest.fixture
def run_copy(grpo_run: Path, tmp_path: Path) -> Path:
    """A private copy of the run (tests that damage it)."""
    dst = tmp_path / "runs" / grpo_run.name
    shutil.copytree(grpo_run, dst, ignore=shutil.ignore_patterns("tb", "ckpt"))
    return dst


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def feedback_db(tmp_path: Path) -> Path:
    """A real store: arm A's edits mostly reverted, arm B's kept, plus one infra failure."""
    path = tmp_path / "fb.db"
    store = FeedbackStore(path)
    for i in range(6):
        for arm, kept in (("A", i < 2), ("B", i < 5)):
            sid = store.add_session(user=f"u{arm}{i}", arm=arm, policy_version=1 if arm == "A" else 2,
                                    prompt="fix it", repo="/srv/repo", trajectory=make_traj(),
                                    latency_s=3.0)
            store.add_event(sid, "kept" if kept else "reverted")
    store.add_session(user="x", arm="B", policy_version=2, prompt="p", repo="/r", trajectory=None,
                      latency_s=1.0)
    store.close()
    return path


def ab(kept_a: float, kept_b: float, n: int = 40) -> ABReport:
    """A real A/B report (``compare_arms``: bootstrap intervals of B - A) over ``n`` scored
    sessions per arm; a kept edit earns reward 1, a reverted one -1, and is a dissatisfied user."""
    def values(kept: float, latency: float) -> list[dict[str, float]]:
        out = []
        for i in range(n):
            k = float(i < round(kept * n))
            out.append({"reward": 2 * k - 1, "resolved": k, "edited": 1.0, "kept": k,
                        "reverted": 1 - k,
                        "dissatisfied": 1 - k,
                        "latency": latency + i % 3})
        return out

    return compare_arms({"A": values(kept_a, 2.0), "B": values(kept_b, 2.5)}, {"A": n + 2, "B": n},
                        min_sessions=n)


def loop_config() -> RealtimeConfig:
    return load_config(RealtimeConfig, None, ["name=rt-test", f"cycles={LOOP_CYCLES}",
                                              "model=runs/quickstart/model_rl",
                                              "users.tasks=tasks.jsonl"])


LOOP_CYCLES = 3
"""Cycle 1 is promoted (v0 -> v1), cycle 2's noised candidate rolled back by the A/B, cycle 3's
rejected by the gate."""


def loop_cycles() -> tuple[list[CycleRow], ABReport]:
    """What ``Loop.cycle`` records, cycle by cycle, and the final A/B's report."""
    cfg = loop_config()
    rows = []
    for n, (cur, kept_b, gate_cand) in enumerate(((0, 0.8, 0.40), (1, 0.2, 0.35), (1, None, 0.10)),
                                                 1):
        gate = {"passed": gate_cand > 0.2, "reason": f"pass@1 diff {gate_cand - 0.35:+.3f}",
                "n_tasks": 20, "pass1_current": 0.35, "pass1_candidate": gate_cand,
                "ci_low": gate_cand - 0.35 - 0.05, "ci_high": gate_cand - 0.35 + 0.05}
        row = CycleRow(n, cur, n, injected=n == 2, gate=gate,
                       window={"sessions": 48, "mean_reward": -0.25 + 0.1 * n, "groups": 12,
                               "singletons": 4})
        if kept_b is None:
            row.status, row.reason = "rejected", "gate: " + gate["reason"]
        else:
            rep = ab(0.5, kept_b)
            action, why = ab_decision(rep, cfg.ab.margin, cfg.ab.max_revert_rise)
            row.ab = rep.to_dict()
            row.status = {"promote": "promoted", "rollback": "rolled_back"}[action]
            row.reason = f"A/B: {why}"
        rows.append(row)
    return rows, ab(0.45, 0.7, n=60)


@pytest.fixture
def loop_run(tmp_path: Path) -> Path:
    """A run directory as ``looprl feedback loop`` leaves it (``run_loop``'s files; the store,
    policies and plots left out)."""
    run = tmp_path / "runs" / "rt-test"
    run.mkdir(parents=True)
    save_config(loop_config(), run / "config.json")
    (run / "feedback.db").touch()
    rows, final = loop_cycles()
    with (run / "cycles.jsonl").open("w") as fh:
        for row in rows:
            fh.write(json.dumps(dataclasses.asdict(row)) + "\n")
    final_ab = {**final.to_dict(), "final": True, "a": 0, "b": 1}
    (run / "final_ab.json").write_text(json.dumps(final_ab, indent=1))
    res = LoopResult(run, rows, final_ab, {"stored": 300, "lost": 0, "trained_twice": 0}, 1)
    (run / "result.txt").write_text(res.line() + "\n")
    (run / "report.md").write_text("# Real-time RL loop `rt-test`\n\n" + res.line() + "\n")
    return run


def serve(app) -> Iterator[str]:
    """Run ``app`` on a free loopback port in a thread; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline and t.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        t.join(timeout=10)
