"""Teacher-forced accuracy per tool: which kind of turn a policy gets right, before it has to act.

    acc = turn_accuracy(model, tok, held_out_demos)
    acc.by_tool       # {"grep": TurnStats(turns=40, exact=3, tokens=812, correct=655), ...}
    acc.exact_rate("edit_file")

Every assistant turn of a demonstration (a maximal run of ``loss_mask_T == 1`` tokens) is scored
with the model's greedy prediction at each position, given the demo's own context (teacher
forcing). A turn is *exact* when every token is the argmax, i.e. greedy decoding from that context
would reproduce it. Turns are keyed by the first tool they call (``text`` when they call none).

This separates "the model cannot produce the format" from "it cannot copy a name or a snippet from
its context": a policy at 90% token accuracy but 0% exact ``edit_file`` turns hallucinates the
``old_string`` it should copy from what it read, and RL will see no passing rollout to learn from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from looprl.chat import TOOL_OPEN
from looprl.types import Trajectory

_NAME = re.compile(r'"name"\s*:\s*"([A-Za-z_][\w]*)"')


@dataclass
class TurnStats:
    turns: int = 0
    exact: int = 0
    tokens: int = 0
    correct: int = 0

    @property
    def exact_rate(self) -> float:
        return self.exact / self.turns if self.turns else 0.0

    @property
    def token_accuracy(self) -> float:
        return self.correct / self.tokens if self.tokens else 0.0


@dataclass
class TurnAccuracy:
    by_tool: dict[str, TurnStats] = field(default_factory=dict)

    @property
    def total(self) -> TurnStats:
        t = TurnStats()
        for s in self.by_tool.values():
            t.turns, t.exact = t.turns + s.turns, t.exact + s.exact
            t.tokens, t.correct = t.tokens + s.tokens, t.correct + s.correct
        return t

    def exact_rate(self, tool: str) -> float:
        return self.by_tool.get(tool, TurnStats()).exact_rate

    def markdown(self, label: str = "") -> list[str]:
        rows = [f"| turn {label} | turns | exact (greedy reproduces it) | token accuracy |",
                "|---|---|---|---|"]
        for name, s in [*sorted(self.by_tool.items()), ("all", self.total)]:
            rows.append(f"| {name} | {s.turns} | {s.exact_rate:.3f} | {s.token_accuracy:.3f} |")
        return rows

    def to_json(self) -> dict[str, dict[str, int]]:
        return {k: {"turns": s.turns, "exact": s.exact, "tokens": s.tokens, "correct": s.correct}
                for k, s in self.by_tool.items()}

    @classmethod
    def from_json(cls, d: dict[str, dict[str, int]]) -> TurnAccuracy:
        """The inverse of ``to_json``.

        >>> acc = TurnAccuracy({"grep": TurnStats(2, 1, 10, 9)})
        >>> TurnAccuracy.from_json(acc.to_json()) == acc
        True
        """
        return cls({k: TurnStats(**v) for k, v in d.items()})


def _turn_tool(text: str) -> str:
    if TOOL_OPEN not in text:
        return "text"
    m = _NAME.search(text.split(TOOL_OPEN, 1)[1])
    return m.group(1) if m else "malformed"


@torch.no_grad()
def turn_accuracy(model: nn.Module, tokenizer, trajectories: Sequence[Trajectory], *,
                  max_segments: int | None = None) -> TurnAccuracy:
    """Greedy teacher-forced accuracy of ``model`` on every assistant turn of ``trajectories``."""
    was_training = model.training
    model.eval()
    acc = TurnAccuracy()
    segs = [s for t in trajectories if not t.is_infra_error for s in t.segments
            if s.num_model_tokens > 0]
    try:
        for seg in segs[:max_segments]:
            ids = torch.tensor([seg.token_ids_T])
            pred = model(input_ids=ids).logits[0].argmax(-1)  # pred[i] is the guess for token i+1
            for a, b in seg.model_turns():
                if a == 0:
                    a = 1  # a model token with no context cannot be predicted; score the rest
                    if b <= a:
                        continue
                target = ids[0, a:b]
                hit = pred[a - 1:b - 1] == target
                name = _turn_tool(tokenizer.decode(seg.token_ids_T[a:b], skip_special_tokens=False))
                s = acc.by_tool.setdefault(name, TurnStats())
                s.turns += 1
                s.exact += int(bool(hit.all()))
                s.tokens += int(hit.numel())
                s.correct += int(hit.sum())
    finally:
        model.train(was_training)
    return acc
