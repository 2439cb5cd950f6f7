"""A seeded generator of assistant turns in each non-Hermes tool-call format (Hermes has its own,
``tests/harness/turn_fuzz.py``), built from fragments whose outcome is known from how they were
built, so a test checks the parser's counts exactly: the calls that parse (with their names and
arguments, and whether a tool takes them), and the broken calls.

Fragments per format: valid calls (markers of every format inside their JSON strings, huge
strings and numbers), calls that parse but no tool takes, broken calls that end where they
started ("closed": bad structure, no name, non-object arguments, stray markers, foreign
recipients) and broken calls whose end cannot be known ("open": JSON that does not parse,
numbers of 5,000 digits, NaN, nesting past any recursion limit, a tag with no call), which run
to the next call opener, so only an opener or the end of the turn follows them; text (garbage
without the characters the format reads); and runs of many calls.

    rng = random.Random(7)
    turn = fuzz_format_turn(rng, "llama3")   # .text, .runs, .calls, .broken, .thinking
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.harness.turn_fuzz import AGENT_TOOLS, garbage, valid_args

FORMAT_MARKERS = ("[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<|call|>", "<|end|>",
                  "<|message|>", "<|start|>", "<tool_call>", "</tool_call>", "<think>")
"""Markers a JSON string argument may hold: data, whatever format reads it."""
XML_SAFE = ("[TOOL_CALLS]", "<|python_tag|>", "<|call|>", "<think>", "</think>", "<function=x>",
            "<parameter=y>")
"""What a Qwen3-Coder value may hold (XML cannot quote </parameter> nor the block markers)."""
BIG_DIGITS = '{"name": "read_file", "parameters": {"path": "a", "offset": ' + "1" * 5000 + "}}"


@dataclass
class FTurn:
    """One fuzzed turn and what the parser must make of it."""

    text: str = ""
    runs: list[bool] = field(default_factory=list)
    """One entry per call that parses, in order: whether its tool and arguments are valid."""
    calls: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)
    """(name, arguments) per parsed call; arguments None where the format retypes them."""
    broken: int = 0
    thinking: list[str] = field(default_factory=list)
    """Harmony's analysis bodies, in order."""

    def broken_results(self, max_calls: int) -> int:
        return self.broken + sum(not ok or i >= max_calls for i, ok in enumerate(self.runs))


def clean(text: str, bad: str) -> str:
    return "".join(c for c in text if c not in bad)


def invalid_for(fmt: str, rng: random.Random) -> tuple[str, dict[str, Any]]:
    """A call that parses in ``fmt`` but no tool takes (names without spaces: Mistral v11 and
    harmony end a name at whitespace; no mistyped strings for Qwen3-Coder, whose text values
    the schema retypes)."""
    choices: list[tuple[str, dict[str, Any]]] = [
        (rng.choice(["rm_rf", "READ_FILE", "fínish"]), {}), ("read_file", {}),
        ("read_file", {"path": "a", "bogus": 1}), ("memory", {"action": "delete"}),
        ("read_file", {"path": "a", "offset": rng.choice([0, -5])}),
        ("list_dir", {"depth": -(10 ** 50)})]
    if fmt != "qwen3_coder":
        choices += [("read_file", {"path": rng.choice([7, None, ["a"], True])}),
                    ("read_file", {"path": "a", "offset": rng.choice([True, 1.5, "3"])})]
    return rng.choice(choices)


class Builder:
    """Turn assembly shared by the formats; ``open_next``: the last fragment was an open
    broken call, so the next must start with a call opener."""

    def __init__(self, rng: random.Random, fmt: str, big: int) -> None:
        self.rng, self.fmt, self.big = rng, fmt, big
        self.turn = FTurn()
        self.parts: list[str] = []
        self.open_next = False

    def marks(self) -> tuple[str, ...]:
        return XML_SAFE if self.fmt == "qwen3_coder" else FORMAT_MARKERS

    def a_call(self, small: bool = False) -> tuple[str, dict[str, Any], bool]:
        rng = self.rng
        if not small and rng.random() < 0.25:
            name, args = invalid_for(self.fmt, rng)
            return name, args, False
        name = rng.choice(AGENT_TOOLS) if not small else "read_file"
        args = (valid_args(rng, name, self.marks(), self.big) if not small
                else {"path": rng.choice(["README.md", "nope.py"]), "limit": 1})
        return name, args, True

    def record(self, name: str, args: dict[str, Any], ok: bool) -> None:
        self.turn.runs.append(ok)
        self.turn.calls.append((name, None if self.fmt == "qwen3_coder" and not ok else args))

    def snapshot(self) -> tuple[Any, ...]:
        t = self.turn
        return len(self.parts), list(t.runs), list(t.calls), t.broken, list(t.thinking), self.open_next

    def restore(self, snap: tuple[Any, ...]) -> None:
        n, self.turn.runs, self.turn.calls, self.turn.broken, self.turn.thinking, self.open_next = snap
        del self.parts[n:]

    def add(self, text: str, broken: int = 0, open_: bool = False) -> None:
        self.parts.append(text)
        self.turn.broken += broken
        self.open_next = open_


# --- one class of fragments per format ------------------------------------------------------

def _qwen_call(name: str, args: dict[str, Any]) -> str:
    body = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                   for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def qwen3_coder(b: Builder, last: bool) -> None:
    rng, r = b.rng, b.rng.random()
    if r < 0.45:
        name, args, ok = b.a_call()
        b.record(name, args, ok)
        b.add(_qwen_call(name, args))
    elif r < 0.75:
        body = rng.choice([
            lambda: clean(garbage(rng), "<"), lambda: '{"name": "read_file", "arguments": {}}',
            lambda: "<function=read_file>\n<parameter=path>\na\n</function>",
            lambda: "<function=read_file>\n<parameter=path>\na\n</parameter>\n",
            lambda: "<function=>\n</function>",
            lambda: "<function=read_file>\n<parameter=p>\n1\n</parameter>\n<parameter=p>\n2\n"
                    "</parameter>\n</function>",
            lambda: "<function=read_file>\ntext between\n</function>"])()
        b.add(f"<tool_call>{body}</tool_call>", 1)
    elif r < 0.8:
        b.add("</tool_call>", 1)
    elif r < 0.95 or b.open_next:
        b.add(clean(garbage(rng), "<") or "text")
    elif last:
        name, args, _ = b.a_call()
        text = _qwen_call(name, args)
        b.add(text[:rng.randrange(11, text.index("</function>"))], 1)


def llama3(b: Builder, last: bool) -> None:
    rng, r = b.rng, b.rng.random()
    if r < 0.55:  # a call list: <|python_tag|> then calls (the turn may open with a bare one)
        bare = not "".join(b.parts).strip()
        out = "" if bare and rng.random() < 0.5 else "<|python_tag|>"
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.8:
                name, args, ok = b.a_call()
                key = "parameters" if rng.random() < 0.8 else "arguments"
                b.record(name, args, ok)
                out += json.dumps({"name": name, key: args}, ensure_ascii=rng.random() < 0.3)
            else:  # JSON that is no call: closed
                out += json.dumps(rng.choice([{"parameters": {}}, {"name": "a", "parameters": [1]},
                                              {"name": "a", "parameters": {}, "arguments": {}},
                                              {"name": "a", "parameters": {}, "x": 1},
                                              {"name": "", "parameters": {}}]))
                b.turn.broken += 1
            out += rng.choice(["; ", ";", " ", "\n", ";\n"])
        b.add(out)
        if rng.random() < 0.2:  # then a value that does not parse: open
            b.add(rng.choice(['{"name": "read_file", "parameters": {"offset": NaN}}', BIG_DIGITS,
                              "{" + clean(garbage(rng), "<{}") + "x", '{"a": ' + "[" * 5000]),
                  1, True)
    elif r < 0.65:  # a tag with no JSON call after it: open
        b.add("<|python_tag|>" + rng.choice(["brave_search.call(query='x')", "[1]",
                                             clean(garbage(rng), "<{") + "x"]), 1, True)
    elif not b.open_next:  # text: no '{' (it would open a list), no '<'
        b.add(clean(garbage(rng), "<{") or "text")


def _mistral_item(b: Builder) -> str:
    rng = b.rng
    if rng.random() < 0.8:
        name, args, ok = b.a_call()
        b.record(name, args, ok)
        item: dict[str, Any] = {"name": name, "arguments": args}
        if rng.random() < 0.3:
            item["id"] = "a1B2c3D4e"
        return json.dumps(item, ensure_ascii=rng.random() < 0.3)
    b.turn.broken += 1
    return json.dumps(rng.choice([3, "x", None, {"arguments": {}}, {"name": "a", "arguments": [1]},
                                  {"name": "a", "arguments": {}, "extra": 1}, {"id": 5}]))


def mistral(b: Builder, last: bool) -> None:
    rng, r = b.rng, b.rng.random()
    if r < 0.55:
        items = [_mistral_item(b) for _ in range(rng.randint(1, 4))]
        b.add("[TOOL_CALLS]" + rng.choice(["", " ", "\n"]) + "[" + rng.choice([", ", ","]).join(items)
              + "]")
    elif r < 0.75:  # a list that does not parse: open
        b.add("[TOOL_CALLS] " + rng.choice([
            '{"name": "a", "arguments": {}}', "[]", '[{"name": "a", "arguments": {}',
            "[" + BIG_DIGITS.replace("parameters", "arguments") + "]", "[" * 5000,
            '[{"name": "a", "arguments": {}} {"name": "b"}]', clean(garbage(rng), "[")]), 1, True)
    elif not b.open_next:
        b.add(clean(garbage(rng), "[") or "text")


def mistral_v11(b: Builder, last: bool) -> None:
    rng, r = b.rng, b.rng.random()
    if r < 0.5:
        name, args, ok = b.a_call()
        b.record(name, args, ok)
        cid = "[CALL_ID]x1y2z3w4v" if rng.random() < 0.2 else ""
        b.add(f"[TOOL_CALLS]{name}{cid}[ARGS]{json.dumps(args, ensure_ascii=rng.random() < 0.3)}")
    elif r < 0.6:  # closed: parses, but is no call
        b.add(rng.choice(["[TOOL_CALLS]read_file[ARGS][1]", '[TOOL_CALLS]a[ARGS]"x"', "[ARGS]",
                          "[CALL_ID]"]), 1)
    elif r < 0.75:  # open
        b.add(rng.choice(['[TOOL_CALLS]read_file{"path": "a"}', '[TOOL_CALLS][ARGS]{"path": "a"}',
                          "[TOOL_CALLS]read_file[ARGS]{oops", "[TOOL_CALLS]",
                          "[TOOL_CALLS]grep[ARGS]" + "[" * 5000,
                          '[TOOL_CALLS]read file[ARGS]{"path": "a"}']), 1, True)
    elif not b.open_next:
        b.add(clean(garbage(rng), "[") or "text")


def harmony(b: Builder, last: bool) -> None:
    rng, r = b.rng, b.rng.random()
    start = "<|start|>assistant" if b.parts else ""
    end = "" if last and rng.random() < 0.5 else rng.choice(["<|call|>", "<|end|>"])
    if r < 0.45:
        name, args, ok = b.a_call()
        b.record(name, args, ok)
        head = (f"<|channel|>commentary to=functions.{name} <|constrain|>json" if rng.random() < 0.7
                else f" to=functions.{name}<|channel|>commentary json")
        b.add(f"{start}{head}<|message|>{json.dumps(args, ensure_ascii=rng.random() < 0.3)}"
              + (end or ("<|call|>" if not last else "")))
    elif r < 0.6:
        body = clean(garbage(rng), "<")
        b.turn.thinking.append(body.strip())
        b.add(f"{start}<|channel|>analysis<|message|>{body}<|end|>")
    elif r < 0.7:
        b.add(f"{start}<|channel|>final<|message|>{clean(garbage(rng), '<')}<|end|>")
    elif r < 0.85:  # closed
        b.add(start + rng.choice([
            "<|channel|>commentary to=browser.search<|message|>{}<|call|>",
            "<|channel|>commentary to=functions.read_file<|message|>{oops<|call|>",
            '<|channel|>commentary to=functions.read_file<|message|>{"path": "a"} x<|call|>',
            "<|channel|>commentary to=functions.read_file<|message|>[1]<|call|>",
            "<|channel|>commentary to=functions.read_file<|message|>" + "[" * 5000 + "<|call|>",
            "<|channel|>commentary to=functions.<|message|>{}<|call|>"]), 1)
    elif r < 0.92:  # open: a header that never reaches <|message|>
        b.add(start + "<|channel|>commentary to=functions.read_file " + clean(garbage(rng), "<"),
              1, True)
    elif b.parts and not b.open_next:  # a stray <|call|> after a message
        b.add("<|call|>", 1)


FRAGMENTS: dict[str, Callable[[Builder, bool], None]] = {
    "qwen3_coder": qwen3_coder, "llama3": llama3, "mistral": mistral, "mistral_v11": mistral_v11,
    "harmony": harmony}
OPENS_AGAIN = {"qwen3_coder": "<tool_call>", "llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]",
               "mistral_v11": "[TOOL_CALLS]", "harmony": "<|start|>"}


def fuzz_format_turn(rng: random.Random, fmt: str, *, big: int = 200_000, many: int = 0,
                     needs_action: bool = True) -> FTurn:
    """One turn of 1-8 fragments in ``fmt`` (``many`` > 0: also that many small valid calls in
    a row). ``needs_action``: make sure it calls or breaks something."""
    b = Builder(rng, fmt, big)
    n = rng.randint(1, 8)
    for k in range(n):
        if many and k == n // 2:
            _many(b, many)
        for _ in range(100):  # after an open broken call only a call opener may follow
            snap, was_open = b.snapshot(), b.open_next
            FRAGMENTS[fmt](b, k == n - 1)
            added = "".join(b.parts[snap[0]:])
            if not was_open or not added or added.startswith(OPENS_AGAIN[fmt]):
                break
            b.restore(snap)
    if needs_action and not b.turn.runs and not b.turn.broken:
        b.add({"qwen3_coder": "</tool_call>", "llama3": "<|python_tag|>x",
               "mistral": "[TOOL_CALLS] []", "mistral_v11": "[ARGS]",
               "harmony": ("<|start|>assistant" if b.parts else "") + "<|channel|>x"}[fmt], 1)
    b.turn.text = "".join(b.parts)
    return b.turn


def _many(b: Builder, n: int) -> None:
    """``n`` small valid calls in a row, in the format's own way of writing several."""
    calls = [b.a_call(small=True) for _ in range(n)]
    for name, args, ok in calls:
        b.record(name, args, ok)
    if b.fmt == "qwen3_coder":
        b.add("".join(_qwen_call(nm, a) for nm, a, _ in calls))
    elif b.fmt == "llama3":
        b.add("<|python_tag|>" + "; ".join(json.dumps({"name": nm, "parameters": a})
                                           for nm, a, _ in calls))
    elif b.fmt == "mistral":
        b.add("[TOOL_CALLS] " + json.dumps([{"name": nm, "arguments": a} for nm, a, _ in calls]))
    elif b.fmt == "mistral_v11":
        b.add("".join(f"[TOOL_CALLS]{nm}[ARGS]{json.dumps(a)}" for nm, a, _ in calls))
    else:
        start = "<|start|>assistant" if b.parts else ""
        b.add(start + "<|call|><|start|>assistant".join(
            f"<|channel|>commentary to=functions.{nm} <|constrain|>json<|message|>{json.dumps(a)}"
            for nm, a, _ in calls) + "<|call|>")
    b.open_next = False
