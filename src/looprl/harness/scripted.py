"""A scripted ``Engine``: returns fixed turns in order, whatever the prompt. It is the tests'
model double and what the oracle agent (``looprl.harness.oracle``) plays its script through.

    policy = ScriptedPolicy(tok, ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>'])

Each turn comes back tokenized, ending with the end-of-turn token, logprob 0.0, so a trajectory it
drives is in the exact harness format a model would produce.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch

from looprl.errors import PolicyError
from looprl.types import Generation, SamplingParams


class ScriptedPolicy:
    """An ``Engine`` test double: returns ``turns`` in order (per session), whatever the prompt.

    ``prompts`` records every prompt it was given, so tests can check token exactness.
    Running out of turns raises ``PolicyError`` (an engine failure, like a crashed server).
    """

    def __init__(self, tokenizer: Any, turns: list[str], end_of_turn: str = "<|im_end|>") -> None:
        self.tokenizer = tokenizer
        self.turns = list(turns)
        eot = tokenizer.encode(end_of_turn, add_special_tokens=False)
        assert len(eot) == 1, f"{end_of_turn!r} is not one token of this tokenizer"
        self.eot_id = eot[0]
        self.prompts: list[list[int]] = []
        self.released: list[str] = []
        self._next: dict[str | None, int] = {}
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation:
        k = self._next.get(session_id, 0)
        if k >= len(self.turns):
            raise PolicyError(f"scripted policy has no turn {k + 1} (script has {len(self.turns)}); "
                              "add turns or end the script with a finish call")
        self._next[session_id] = k + 1
        self.prompts.append(list(prompt_ids))
        ids = list(self.tokenizer.encode(self.turns[k], add_special_tokens=False)) + [self.eot_id]
        finish: Literal["stop", "length"] = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        return Generation(tuple(ids), (0.0,) * len(ids), (self._version,) * len(ids), finish,
                          self.tokenizer.decode(ids))

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self._version = version

    async def release(self, session_id: str) -> None:
        self.released.append(session_id)
