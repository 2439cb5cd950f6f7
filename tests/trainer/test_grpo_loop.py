"""The whole loop, thin and end to end: task -> sandbox -> harness -> engine -> reward -> async GRPO
step -> weight store -> engine picks up the new version. A tiny random Llama is the policy."""

import asyncio
import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.chat import ChatFormat
from looprl.harness.agent import AgentConfig
from looprl.harness.oracle import OracleAgent, oracle_turns
from looprl.harness.scripted import ScriptedPolicy
from looprl.inference import TorchEngine
from looprl.models.tokenizer import build_tokenizer
from looprl.rewards.composite import reward_metrics
from looprl.rewards.tests import pytest_command
from looprl.rollout.config import RolloutConfig, RolloutExperimental
from looprl.rollout.runner import RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.sandbox import SandboxPool
from looprl.trainer.config import GRPOConfig, GRPOExperimental, LoopConfig, LoopExperimental
from looprl.trainer.grpo import GRPOLoop
from looprl.trainer.losses import LossParams
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOStep
from looprl.types import Grader, Task
from looprl.weights.store import LocalWeightStore

GRPO_CFG = GRPOConfig(lr=1e-3, experimental=GRPOExperimental(objective=LossParams(norm_tokens=48)))

pytestmark = [pytest.mark.needs_bwrap, pytest.mark.slow]
VENV = str(Path(sys.executable).parent.parent)


GOLD = """--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


def _tasks(root: Path, n: int) -> list[Task]:
    repo = root / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    grader = Grader(pytest_command(), ("test_calc.py::test_add",), (), ("test_calc.py",), timeout_s=60)
    return [Task(f"calc-{i}", str(repo), "add(2, 3) should be 5", grader, VENV, GOLD)
            for i in range(n)]


def _model(tok):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384))


def _run(tmp_path, tok, policy, model, engine, store, schedule, tasks=4, max_new_tokens=24,
         push_start=False):
    async def main():
        pool = SandboxPool(max_running=4)
        try:
            runner = RolloutRunner(policy, ChatFormat(tok), pool, make_scorer(), RolloutConfig(
                group_size=2, max_in_flight=4,
                agent=AgentConfig(max_turns=4, max_new_tokens=max_new_tokens, context_window=16384)))
            step = GRPOStep(model, GRPO_CFG, pad_id=tok.pad_token_id)
            loop = GRPOLoop(step, engine, runner, TaskSampler(_tasks(tmp_path, tasks)),
                            LoopConfig(groups_per_step=2, max_steps=2,
                                       experimental=LoopExperimental(schedule=schedule)),
                            store=store, run_dir=tmp_path / "run", batch_metrics=reward_metrics,
                            push_start=push_start)
            return await loop.run()
        finally:
            await pool.close()

    return asyncio.run(main())


def test_loop_on_the_torch_engine_publishes_and_swaps_weights(tmp_path):
    tok = build_tokenizer(None)
    model = _model(tok)
    engine = TorchEngine(copy.deepcopy(model), tok, max_len=16384, speculative="on", lookup=4)
    store = LocalWeightStore(str(tmp_path / "weights"))
    stats = _run(tmp_path, tok, engine, model, engine, store, schedule="async")
    assert stats.steps == 2 and stats.groups_trained == 4
    assert engine.policy_version == 2 and store.latest() == 2
    fetched = store.fetch(2)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(fetched[k].float(), v.float(), atol=1e-2, rtol=1e-2)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert {"reward/total_mean", "train/kl_mean", "loop/trainer_idle_fraction"} <= set(rows[0])
    # the engine's own figures: prompt lookup drafted in the steps where it found a match
    assert rows[-1]["engine/spec/on_fraction"] > 0 and rows[-1]["engine/generated_tokens"] > 0
    assert "engine/spec/acceptance" in rows[-1] and "engine/spec/tokens_per_verify" in rows[-1]


@pytest.mark.parametrize("push_start", [True, False])
def test_an_engine_started_apart_samples_the_first_rollout_from_the_loops_start(tmp_path,
                                                                                push_start):
    """A server started apart from the run (``model.engine=openai``: ``looprl model serve``)
    holds what it was started with or last given, here another model's weights; with
    ``push_start`` the loop sends it its start (version 0) before the first rollout."""
    tok = build_tokenizer(None)
    model = _model(tok)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    engine = TorchEngine(LlamaForCausalLM(model.config), tok, max_len=16384)
    first: list[dict[str, torch.Tensor]] = []

    def policy_for(task):  # what the engine holds when the first rollout starts
        if not first:
            first.append({k: v.clone() for k, v in engine.model.state_dict().items()})
        return engine

    try:
        stats = _run(tmp_path, tok, policy_for, model, engine, None, schedule="async",
                     push_start=push_start)
    finally:
        engine.close()
    assert stats.steps == 2 and engine.policy_version == 2
    same = all(torch.equal(first[0][k], start[k]) for k in start)
    assert same == push_start


def test_lora_loop_syncs_merged_weights_to_the_engine(tmp_path):
    """The loop with a LoRA adapter (``models.lora``): each step publishes the merged weights
    under the base model's names and the torch engine takes them; after two steps (groups of an
    oracle and a null trajectory: every group trains) the engine holds exactly the trainer's
    merged weights, which differ from the start's in the adapted layers alone."""
    from looprl.models.config import LoraSettings
    from looprl.models.lora import merged_state_dict, with_lora

    tok = build_tokenizer(None)
    model = _model(tok)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    engine = TorchEngine(copy.deepcopy(model), tok, max_len=16384)
    policy = with_lora(model, LoraSettings(rank=4))
    calls = iter(range(10_000))

    def policy_for(task):  # alternate oracle / null per trajectory attempt
        if next(calls) % 2 == 0:
            return OracleAgent(task, tok)
        return ScriptedPolicy(tok, ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>'])

    store = LocalWeightStore(str(tmp_path / "weights"), dtype="float32")
    try:
        stats = _run(tmp_path, tok, policy_for, policy, engine, store, schedule="async",
                     max_new_tokens=1024)
    finally:
        engine.close()
    assert stats.steps == 2 and stats.zero_variance_groups == 0
    assert engine.policy_version == 2 and store.latest() == 2
    merged, served = merged_state_dict(policy), engine.model.state_dict()
    assert merged.keys() == served.keys() == start.keys()
    assert all(torch.equal(served[k], merged[k]) for k in merged)
    assert any(not torch.equal(merged[k], start[k]) for k in merged), "the adapter trained"
    assert all(torch.equal(merged[k], start[k]) for k in merged if "proj" not in k)


@pytest.mark.parametrize("schedule", ["async", "sync"])
def test_loop_moves_the_policy_toward_the_rewarded_trajectory(tmp_path, schedule):
    """Each group holds one oracle (tests pass) and one null (finishes at once) trajectory: after
    two steps the trained model gives the oracle's tokens a higher likelihood."""
    tok = build_tokenizer(None)
    model = _model(tok)
    calls = iter(range(10_000))

    def policy_for(task):  # alternate oracle / null per trajectory attempt
        if next(calls) % 2 == 0:
            return OracleAgent(task, tok)
        return ScriptedPolicy(tok, ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>'])

    oracle = ScriptedPolicy(tok, oracle_turns(_tasks(tmp_path / "probe", 1)[0]))
    probe_tokens = _oracle_tokens(tmp_path, tok, oracle)

    def oracle_logprob() -> float:
        with torch.no_grad():
            ids = torch.tensor([probe_tokens.token_ids_T])
            lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            lp = lp.gather(-1, ids[0, 1:, None])[:, 0]
            mask = torch.tensor(probe_tokens.loss_mask_T[1:], dtype=torch.bool)
            return float(lp[mask].sum())

    before = oracle_logprob()
    store = LocalWeightStore(str(tmp_path / "weights"))
    recorder = ScriptedPolicy(tok, [])
    stats = _run(tmp_path, tok, policy_for, model, recorder, store, schedule=schedule,
                 max_new_tokens=1024)
    assert stats.steps == 2 and stats.zero_variance_groups == 0
    assert recorder.policy_version == 2
    assert oracle_logprob() > before + 1.0


def _oracle_tokens(tmp_path, tok, policy):
    from looprl.harness.agent import run_agent
    from looprl.harness.tools import make_tools
    from looprl.sandbox import create_sandbox

    task = _tasks(tmp_path / "probe2", 1)[0]

    async def main():
        sb = await create_sandbox(task.repo, venv=task.venv)
        try:
            t = await run_agent(task, sb, policy, ChatFormat(tok), make_tools(test_command=task.grader.test_command),
                                AgentConfig(max_turns=6, context_window=16384), group_id="p", trajectory_id="p/0")
        finally:
            await sb.close()
        return t.segments[0]

    return asyncio.run(main())


def test_screened_out_tasks_are_tried_again_then_given_up(tmp_path):
    """Half the tasks are solvable (the oracle), half never (the policy finishes at once). With
    ``screen=1`` each unsolvable task costs one rollout a try, is handed out again once the fresh
    tasks have run out, and is given up after ``max_screens = 2`` tries; the solvable ones are
    trained, each once."""
    tok = build_tokenizer(None)
    tasks = _tasks(tmp_path, 6)
    solvable = {t.id for t in tasks[::2]}

    def policy_for(task):
        if task.id in solvable:
            return OracleAgent(task, tok)
        return ScriptedPolicy(tok, ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>'])

    async def main():
        pool = SandboxPool(max_running=4)
        try:
            runner = RolloutRunner(policy_for, ChatFormat(tok), pool, make_scorer(), RolloutConfig(
                group_size=3, max_in_flight=4, experimental=RolloutExperimental(screen=1),
                agent=AgentConfig(max_turns=4, context_window=16384)))
            model = _model(tok)
            step = GRPOStep(model, GRPO_CFG, pad_id=tok.pad_token_id)
            loop = GRPOLoop(step, ScriptedPolicy(tok, []), runner,
                            TaskSampler(tasks, max_screens=2),
                            LoopConfig(groups_per_step=2, max_steps=10), run_dir=tmp_path / "run")
            return await loop.run(), runner
        finally:
            await pool.close()

    stats, runner = asyncio.run(main())
    assert stats.groups_screened_out == 6 and stats.screen_rollouts == 6
    assert stats.groups_trained == 3 and stats.steps == 2
    assert runner.stats.trajectories == 3 * 3 + 6
    trained = [json.loads(line)["task_id"] for line in
               (tmp_path / "run" / "trajectories" / "train.jsonl").read_text().splitlines()]
    assert sorted(set(trained)) == sorted(solvable) and len(trained) == 9
