"""Teacher-forced per-tool turn accuracy: turns are found, keyed by tool, and scored by argmax."""

from __future__ import annotations

from looprl.bench.turns import turn_accuracy
from looprl.models.tokenizer import build_tokenizer
from looprl.trainer.config import SFTConfig, SFTExperimental
from looprl.trainer.sft import sft
from looprl.types import Segment
from tests.trainer.helpers import tiny_llama, trajectory

GREP = '<tool_call>{"name": "grep", "arguments": {"pattern": "def f"}}</tool_call>'
FINISH = '<tool_call>{"name": "finish", "arguments": {"summary": "ok"}}</tool_call>'


def demo(tok, prompt: str = "fix f please\n") -> Segment:
    parts = [(prompt, 0), (GREP, 1), ("a.py:1:def f(x):\n", 0), (FINISH, 1), ("done", 1)]
    ids, mask = [], []
    for text, m in parts:
        t = tok.encode(text, add_special_tokens=False)
        ids += t
        mask += [m] * len(t)
    return Segment(tuple(ids), (0.0,) * len(ids), tuple(mask), tuple(0 if m else -1 for m in mask))


def test_turns_are_keyed_by_tool_and_an_untrained_model_reproduces_none():
    tok = build_tokenizer(None)
    acc = turn_accuracy(tiny_llama(vocab=len(tok)), tok, [trajectory([demo(tok)], None)])
    # the finish call and the trailing text are one run of model tokens: one turn, keyed by finish
    assert {k: s.turns for k, s in acc.by_tool.items()} == {"grep": 1, "finish": 1}
    assert acc.by_tool["grep"].tokens == len(tok.encode(GREP, add_special_tokens=False))
    assert acc.total.exact == 0 and acc.total.token_accuracy < 0.2


def test_a_model_fitted_to_the_demo_reproduces_every_turn():
    tok = build_tokenizer(None)
    model = tiny_llama(vocab=len(tok))
    demos = [trajectory([demo(tok)], None)]
    sft(model, demos, SFTConfig(lr=1e-2, experimental=SFTExperimental(
        max_steps=150, progress=False, pad_id=tok.pad_token_id)))
    acc = turn_accuracy(model, tok, demos)
    assert acc.exact_rate("grep") == 1.0 and acc.exact_rate("finish") == 1.0
    assert acc.total.token_accuracy == 1.0
    assert model.training  # the diagnostic restores the mode it found
    assert "| grep | 1 | 1.000 | 1.000 |" in acc.markdown()


def test_train_keeps_validation_demos_out_and_reports_them():
    from looprl.train.report import turns_markdown
    from looprl.train.stages import split_validation

    tok = build_tokenizer(None)
    demos = [trajectory([demo(tok, f"fix f number {i}\n")], None) for i in range(10)]
    train, val = split_validation(demos, 32, seed=0)
    assert len(val) == 2 and len(train) == 8  # at most a fifth
    assert not {id(d) for d in train} & {id(d) for d in val}
    acc = turn_accuracy(tiny_llama(vocab=len(tok)), tok, val)
    md = "\n".join(turns_markdown({"init": acc, "sft": acc}))
    assert "| grep | 2 | 0.000 | 0.000 |" in md and "| all | 4 | 0.000 | 0.000 |" in md
