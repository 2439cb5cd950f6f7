"""Targeted feedback in the rollout runner: a complete group's failed trajectories are continued
from their first wrong turn with the hint, scored, and kept apart from the group's advantages."""

import asyncio
import json

import pytest

from looprl.chat import ChatFormat
from looprl.harness.agent import AgentConfig
from looprl.harness.scripted import ScriptedPolicy
from looprl.rollout.config import RolloutConfig
from looprl.rollout.runner import RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.sandbox import SandboxPool

from .test_runner import task, tok  # noqa: F401  (fixtures)

pytestmark = pytest.mark.needs_bwrap


def _call(name: str, **args: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


FIX = _call("edit_file", path="calc.py", old_string="return a - b", new_string="return a + b")


class ByHint:
    """The student's script for rollouts, another for hinted continuations (``+hint`` sessions)."""

    def __init__(self, tokenizer, plain: list[str], hinted: list[str]) -> None:
        self.plain = ScriptedPolicy(tokenizer, plain)
        self.hinted = ScriptedPolicy(tokenizer, hinted)
        self.policy_version = 0

    def _of(self, session_id):
        return self.hinted if session_id and session_id.endswith("+hint") else self.plain

    async def generate(self, prompt_ids, params, *, session_id=None, group_id=None):
        return await self._of(session_id).generate(prompt_ids, params, session_id=session_id,
                                                   group_id=group_id)

    async def release(self, session_id):
        await self._of(session_id).release(session_id)


@pytest.mark.parametrize("hints", [0, 1])
def test_a_broken_call_gets_a_hinted_continuation_that_is_scored(task, tok, hints):  # noqa: F811
    policy = ByHint(tok, ["<tool_call>{oops</tool_call>", _call("finish")], [FIX, _call("finish")])

    async def main():
        pool = SandboxPool(max_running=4)
        try:
            cfg = RolloutConfig(group_size=2, max_in_flight=4, agent=AgentConfig(max_turns=4))
            runner = RolloutRunner(policy, ChatFormat(tok), pool, make_scorer(), cfg,
                                   hints_per_group=hints)
            return [r async for r in runner.run([task])]
        finally:
            await pool.close()

    (r,) = asyncio.run(main())
    assert r.group is not None and not any(t.passed for t in r.group.trajectories)
    assert len(r.group.hinted) == hints
    if not hints:
        return
    (h,) = r.group.hinted
    assert h.hint is not None and (h.hint.turn, h.hint.kind) == (1, "broken_call")
    assert "malformed" in h.hint.text and h.id == r.group.trajectories[0].id + "+hint"
    assert h.passed and h.reward is not None  # the continuation fixed it, and was graded
    assert {"role": "user", "content": h.hint.text} in h.messages
    assert all(m == 0 for m in h.segments[0].loss_mask_T[:h.hint.end])
