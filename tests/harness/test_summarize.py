"""Self-summarization driven by ScriptedPolicy over the DirSandbox double: segments, loss masks,
fresh contexts, counters, the cap, a summary that does not fit, and the trainer's chain credit."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from looprl.errors import ConfigError
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.policies import ScriptedPolicy
from looprl.harness.summarize import SUMMARIZE_INSTRUCTION, SUMMARY_FRAME
from looprl.harness.tools import make_tools, tool_schemas
from looprl.trainer.batch import build_batch
from looprl.types import Group, RewardBreakdown, StopReason, Trajectory

from .conftest import WindowedPolicy, call

READ = call("read_file", path="notes.txt")
SUM1 = "S1: notes.txt read twice; calc.add subtracts. Next: fix add."
SUM2 = "S2: read notes.txt again. Next: finish."
FINISH = call("finish", summary="done")


@pytest.fixture
def long_task(task, repo):
    """The calc task with a file whose reads fill the context fast (~370 tokens each)."""
    (repo / "notes.txt").write_text("".join(f"note {i:02d}: " + "x" * 20 + "\n" for i in range(10)))
    return task


def prompt_len(task, fmt):
    return len(fmt.prompt_ids([{"role": "user", "content": task.prompt}], tool_schemas(make_tools())))


def run(task, sandbox, fmt, tok, turns, **cfg):
    policy = ScriptedPolicy(tok, turns)
    p = prompt_len(task, fmt)
    cfg = {"summarize_at_tokens": p + 700, "context_window": p + 1600, "max_summaries": 3} | cfg
    traj = asyncio.run(run_agent(task, sandbox, policy, fmt, make_tools(), AgentConfig(**cfg),
                                 group_id="g", trajectory_id="g/0"))
    return traj, policy


def sampled(seg):
    return [t for t, m in zip(seg.token_ids_T, seg.loss_mask_T, strict=True) if m]


def enc(fmt, *texts):
    return [t for text in texts for t in fmt.encode(text) + [fmt.eot_id]]


def find(ids, sub):
    """Start of the last occurrence of ``sub`` in ``ids`` (-1 if absent)."""
    for i in range(len(ids) - len(sub), -1, -1):
        if ids[i:i + len(sub)] == sub:
            return i
    return -1


def test_two_summaries_make_a_three_segment_chain(long_task, dsandbox, fmt, tok):
    traj, policy = run(long_task, dsandbox, fmt, tok, [READ, READ, SUM1, READ, SUM2, FINISH])
    assert traj.stop_reason == StopReason.FINISHED and traj.error is None
    s0, s1, s2 = traj.segments
    # loss mask 1 exactly on what the policy sampled, summaries included, in segment order
    assert sampled(s0) == enc(fmt, READ, READ, SUM1)
    assert sampled(s1) == enc(fmt, READ, SUM2)
    assert sampled(s2) == enc(fmt, FINISH)
    assert all(s.loss_mask_T[-1] == 1 for s in traj.segments)  # each segment ends with its last turn
    # the instruction closes the first two segments, with loss mask 0, right before the summary
    instr = fmt.encode(SUMMARIZE_INSTRUCTION)
    for seg, summary in ((s0, SUM1), (s1, SUM2)):
        ids, i = list(seg.token_ids_T), find(list(seg.token_ids_T), instr)
        assert i > 0 and not any(seg.loss_mask_T[i:i + len(instr)])
        assert ids[-len(enc(fmt, summary)):] == enc(fmt, summary)
        assert tok.decode(ids[i:]) == (SUMMARIZE_INSTRUCTION + "<|im_end|>\n<|im_start|>assistant\n"
                                       + summary + "<|im_end|>")
    # loss mask 0 on prompt and tool output: everything unmasked is context the policy was shown
    assert sum(s.num_model_tokens for s in traj.segments) == traj.counters.output_tokens
    # new segments start with system + task + framed summary + the latest turn, via prompt_ids
    msgs = list(traj.messages)
    reads = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and m.get("tool_calls")]
    for seg, summary, last in ((s1, SUM1, reads[1]), (s2, SUM2, reads[2])):
        framed = {"role": "user", "content": SUMMARY_FRAME.format(summary=summary)}
        want = fmt.prompt_ids([{"role": "user", "content": long_task.prompt}, framed]
                              + msgs[last:last + 2], tool_schemas(make_tools()))
        assert list(seg.token_ids_T[:len(want)]) == want and not any(seg.loss_mask_T[:len(want)])
        text = tok.decode(want)
        assert text.index(long_task.prompt) < text.index(summary) < text.index("note 09")
        assert want in policy.prompts  # the policy's next prompt is exactly the fresh context
    # token exact: every prompt the policy got is a prefix of one segment
    for p in policy.prompts:
        assert sum(list(s.token_ids_T[:len(p)]) == p for s in traj.segments) == 1
    c = traj.counters
    assert (c.summaries, c.turns, c.tool_calls) == (2, 4, 4)
    assert c.summary_tokens == len(enc(fmt, SUM1, SUM2))
    records = traj.summaries
    assert [r.segment for r in records] == [0, 1]
    assert [r.summary_tokens for r in records] == [len(enc(fmt, SUM1)), len(enc(fmt, SUM2))]
    assert [r.tokens_after for r in records] == [len(policy.prompts[3]), len(policy.prompts[5])]
    assert all(r.tokens_before >= prompt_len(long_task, fmt) + 700 > r.tokens_after
               for r in records)
    assert Trajectory.from_json(traj.to_json()).summaries == records  # saved as it was
    # readable messages: instruction, summary, new-context marker, twice
    names = [m.get("name") for m in msgs if m["role"] != "tool"]
    assert names.count("summarize") == names.count("summary") == names.count("new_context") == 2
    i = names.index("summarize")
    assert names[i:i + 3] == ["summarize", "summary", "new_context"]
    assert [m["content"] for m in msgs if m.get("name") == "summary"] == [SUM1, SUM2]


def test_tokens_before_is_the_context_at_the_trigger(long_task, dsandbox, fmt, tok):
    traj, policy = run(long_task, dsandbox, fmt, tok, [READ, READ, SUM1, FINISH])
    (rec,) = traj.summaries
    p = prompt_len(long_task, fmt)
    # the trigger fired on the context after the second read's observation
    obs = [m for m in traj.messages if m["role"] == "tool"]
    after_two = len(policy.prompts[1]) + len(enc(fmt, READ)) + len(fmt.observation_ids(obs[1:2]))
    assert rec.tokens_before == after_two >= p + 700 > len(policy.prompts[1])
    assert rec.tokens_after < p + 700


def test_cap_then_context_full(long_task, dsandbox, fmt, tok):
    traj, policy = run(long_task, dsandbox, fmt, tok, [READ, READ, SUM1] + [READ] * 8, max_summaries=1)
    assert traj.stop_reason == StopReason.CONTEXT_FULL
    assert traj.counters.summaries == 1 and len(traj.segments) == 2
    # past the cap the run went on until the window was full, never asking for a second summary
    assert sampled(traj.segments[1]) == enc(fmt, *[READ] * (traj.counters.turns - 2))
    assert traj.counters.turns > 3 and len(traj.segments[1].token_ids_T) <= prompt_len(long_task, fmt) + 1600
    assert sum(m.get("name") == "summarize" for m in traj.messages) == 1


def test_a_summary_that_does_not_fit_ends_the_run(long_task, dsandbox, fmt, tok):
    traj, _ = run(long_task, dsandbox, fmt, tok, [READ, READ, SUM1, FINISH], summary_max_tokens=8)
    assert traj.stop_reason == StopReason.CONTEXT_FULL
    assert traj.counters.summaries == 0 and traj.counters.summary_tokens == 8
    (seg,) = traj.segments
    assert sampled(seg) == enc(fmt, READ, READ) + fmt.encode(SUM1)[:8]
    assert traj.summaries == ()
    # the instruction itself does not fit: the window is too small past the trigger
    p = prompt_len(long_task, fmt)
    traj, _ = run(long_task, dsandbox, fmt, tok, [READ, READ, SUM1, FINISH], context_window=p + 1100)
    assert traj.stop_reason == StopReason.CONTEXT_FULL and traj.counters.summary_tokens == 0
    assert sampled(traj.segments[0]) == enc(fmt, READ, READ)  # the unread observation is dropped


def test_the_engines_window_filling_during_a_summary_is_context_full(long_task, dsandbox, fmt, tok):
    """The summary prompt (context + instruction) outgrows the engine's window: the run ends
    as CONTEXT_FULL (the trajectory's own doing, scored), never as an error out of the loop."""
    p = prompt_len(long_task, fmt)
    policy = WindowedPolicy(tok, [READ, READ, SUM1, FINISH], window=p + 780)
    cfg = AgentConfig(summarize_at_tokens=p + 700, context_window=p + 1600, max_summaries=3)
    traj = asyncio.run(run_agent(long_task, dsandbox, policy, fmt, make_tools(), cfg,
                                 group_id="g", trajectory_id="g/0"))
    assert traj.stop_reason == StopReason.CONTEXT_FULL and traj.error is None
    assert traj.counters.turns == 2 and traj.counters.summaries == 0
    assert len(policy.prompts) == 2  # the summary prompt never reached the engine
    assert sampled(traj.segments[0]) == enc(fmt, READ, READ)
    assert traj.messages[-1]["name"] == "summarize"  # the instruction it was asked to answer


def test_default_trigger_and_off_switch(long_task, dsandbox, fmt, tok):
    p = prompt_len(long_task, fmt)
    cfg = AgentConfig(context_window=4 * (p + 700) // 3, max_summaries=1)
    from looprl.harness.agent import summarize_at

    assert summarize_at(cfg) == cfg.context_window * 3 // 4
    assert summarize_at(dataclasses.replace(cfg, max_summaries=0)) == cfg.context_window - 31
    traj, _ = run(long_task, dsandbox, fmt, tok, [READ, READ, READ, READ, FINISH], max_summaries=0)
    assert traj.counters.summaries == 0 and len(traj.segments) == 1
    with pytest.raises(ConfigError, match="max_summaries"):
        AgentConfig(max_summaries=-1)


def test_every_segment_of_the_chain_gets_the_chain_advantage(long_task, dsandbox, fmt, tok):
    chain, _ = run(long_task, dsandbox, fmt, tok, [READ, READ, SUM1, READ, SUM2, FINISH])
    single, _ = run(long_task, dsandbox, fmt, tok, [FINISH])
    assert len(chain.segments) == 3 and len(single.segments) == 1
    group = Group("calc-1", "g", (
        dataclasses.replace(chain, reward=RewardBreakdown.of({"tests": 1.0})),
        dataclasses.replace(single, id="g/1", reward=RewardBreakdown.of({"tests": 0.0}))))
    batch = build_batch([group], micro_batch_tokens=10**7)
    assert batch.num_sequences == 4 and batch.zero_variance_groups == 0
    (mb,) = batch.micro_batches
    adv_by_tokens = {}
    for b in range(mb.num_rows):
        n = int(mb.attention_mask_B_T[b].sum())
        adv_by_tokens[tuple(mb.tokens_B_T[b, :n].tolist())] = float(mb.advantages_B[b])
    assert [adv_by_tokens[s.token_ids_T] for s in chain.segments] == [0.5, 0.5, 0.5]
    assert adv_by_tokens[single.segments[0].token_ids_T] == -0.5
    # every sampled token of the chain is trained (the first position of a row has no prediction)
    assert batch.num_model_tokens == chain.counters.output_tokens + single.counters.output_tokens


def test_a_cut_turn_is_closed_before_the_instruction(long_task, dsandbox, fmt, tok):
    n = len(fmt.encode(READ)) + 20
    cut = READ + "<tool_call>" + "x" * 200
    traj, policy = run(long_task, dsandbox, fmt, tok, [READ, cut, SUM1, FINISH], max_new_tokens=n)
    assert traj.stop_reason == StopReason.FINISHED and traj.counters.summaries == 1
    s0 = traj.segments[0]
    end_of_cut = len(policy.prompts[1]) + n  # the cut turn has no end-of-turn token of its own
    assert s0.token_ids_T[end_of_cut] == fmt.eot_id and s0.loss_mask_T[end_of_cut] == 0
    assert tok.decode(list(s0.token_ids_T[end_of_cut:])).count(SUMMARIZE_INSTRUCTION) == 1
    assert list(s0.token_ids_T[:len(policy.prompts[2])]) == policy.prompts[2]


def test_an_engine_failure_while_summarizing_is_infra(long_task, dsandbox, fmt, tok):
    traj, _ = run(long_task, dsandbox, fmt, tok, [READ, READ])  # the script has no summary turn
    assert traj.stop_reason == StopReason.INFRA_ERROR and "PolicyError" in traj.error
