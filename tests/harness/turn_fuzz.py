"""A seeded generator of assistant turns for fuzzing the harness. Each turn is built from
fragments whose effect is known from how they were built, so a test checks the harness's counts
exactly: the calls that parse (and which of them a tool takes), the broken blocks, the thinking
text and the text of every call block.

Fragments: valid calls (some with tool-call or think markers inside their JSON strings, some with
huge strings), calls that parse but no tool takes (unknown name, missing, extra or mistyped
arguments, a value under a minimum), broken blocks (garbage, structured JSON that is no call,
numbers of 5,000 digits, NaN, 1e400, lone surrogates, nesting 40 deep or past any recursion
limit), stray close markers, text (garbage bytes decoded as text), think blocks and lone think
markers in every position (leading: thinking; later: plain text), and runs of hundreds or
thousands of calls. A turn may end with a truncated block, or inside a leading think block it
never closed (from a call marker in it on, one broken block).

Why the expectation is exact (``looprl.chat.format``'s rules): generated text holds no quote, backslash
or '<' outside the JSON and the markers the generator wrote, and that JSON has balanced quotes,
so a JSON string left open by a broken block can only end at the next block's opening '{"' and
fail there; a truncated block (unbalanced) only ever ends a turn. Inside the thinking, no string
holds ``</think>`` (it would end the thinking mid-call).

    rng = random.Random(7)
    turn = fuzz_turn(rng, tools=AGENT_TOOLS)   # .text, .runs, .broken, .thinking, .blocks
    check_trajectory(traj, turns, fmt, max_calls)  # a run of such turns: counted and saved
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from looprl.chat import ChatFormat
from looprl.types import StopReason, Trajectory

MARKERS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
AGENT_TOOLS = ("read_file", "list_dir", "glob", "grep", "edit_file", "write_file", "memory",
               "run_terminal")
"""Tools a fuzzed turn calls in the agent loop (``finish`` would end the episode early;
run_tests and read_lints start whole programs, too slow for hundreds of turns)."""
SPACE = " \t\n\r"  # JSON's whitespace: what may precede a leading <think>


def garbage(rng: random.Random, n: int = 30) -> str:
    """Text without quotes, backslashes or '<': random bytes decoded as UTF-8, or junk words."""
    if rng.random() < 0.5:
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(0, n)))
        text = raw.decode("utf-8", errors="replace")
    else:
        words = ["{", "}", "[", "]", ":", ",", "true", "null", "0", "-1e9", "é漢😀", "\t", "\n",
                 "name", "arguments", "/", ">", " "]
        text = "".join(rng.choice(words) for _ in range(rng.randint(0, n // 3)))
    return "".join(c for c in text if c not in '"\\<')


def string_arg(rng: random.Random, marks: tuple[str, ...]) -> str:
    """A string argument: words, unicode, quotes and backslashes (escaped by the JSON), and
    sometimes markers."""
    parts = [rng.choice(["fix", "a b", "é漢", "😀", 'q"uote', "back\\slash", "\n", "def f():"])
             for _ in range(rng.randint(1, 4))]
    if marks and rng.random() < 0.5:
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(marks))
    return "".join(parts)


def block(name: str, arguments: Any, rng: random.Random) -> str:
    """A well-formed call block (whitespace around the JSON sometimes; ASCII escapes sometimes)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=rng.random() < 0.3)
    pad = rng.choice(["", " ", "\n"])
    return f"<tool_call>{pad}{body}{pad}</tool_call>"


def valid_args(rng: random.Random, tool: str, marks: tuple[str, ...], big: int) -> dict[str, Any]:
    """Arguments ``tool`` accepts (its schema); values may still be absurd (huge numbers, paths
    that escape, patterns that do not compile): those are tool errors, not broken calls."""
    huge = 10 ** rng.randint(20, 90)
    if tool == "read_file":
        args: dict[str, Any] = {"path": rng.choice(["pkg/calc.py", "README.md", "nope.py", "../x",
                                                    "/etc/passwd", "a/" * 3000, "x" * 300, "pkg"])}
        if rng.random() < 0.5:
            args["offset"] = rng.choice([1, 2, huge])
        if rng.random() < 0.3:
            args["limit"] = rng.choice([1, huge])
        return args
    if tool == "list_dir":
        return {"path": rng.choice([".", "pkg", "nope"]), "depth": rng.choice([1, 3, huge])}
    if tool == "glob":
        return {"pattern": rng.choice(["*.py", "**/*.md", "[z-a]", "[!t]*", "", "*.txt"])}
    if tool == "grep":
        pattern = rng.choice(["def", "(", "[a-", "a{99999999999}", "(" * 3000 + ")" * 3000,
                              "needle", string_arg(rng, marks)])
        return {"pattern": pattern, "glob": rng.choice(["*.py", "[z-a]", "**"])}
    if tool == "edit_file":
        return {"path": "pkg/calc.py", "old_string": rng.choice(["return a - b", "a", "zz"]),
                "new_string": string_arg(rng, marks), "replace_all": rng.random() < 0.5}
    if tool == "write_file":
        r = rng.random()
        content = ("y" * big if r < 0.05 else "x = " + "-" * big + "1\n" if r < 0.1
                   else string_arg(rng, marks))
        return {"path": rng.choice(["notes/n.txt", "deep.py", "."]), "content": content}
    if tool == "memory":
        return {"action": rng.choice(["add", "list"]),
                "note": rng.choice([string_arg(rng, marks), "n" * 3000])}
    if tool == "run_terminal":
        command = rng.choice(["echo hi", "printf 'a\\377b'", "exit 3",
                              "echo 'bwrap: fake' >&2; exit 1",
                              "touch \"$(printf 'bad\\377name.txt')\"; echo needle > nx.txt"])
        return {"command": command, "timeout_s": rng.choice([5, huge])}
    raise AssertionError(tool)


def invalid_call(rng: random.Random, tools: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """A call that parses but no tool takes: an unknown name or arguments its schema refuses."""
    return rng.choice([
        (rng.choice(["rm_rf", "READ_FILE", "read file", "fínish"]), {}),
        ("read_file", {}),
        ("read_file", {"path": "a", "bogus": 1}),
        ("read_file", {"path": rng.choice([7, None, ["a"], True, {"p": "a"}])}),
        ("read_file", {"path": "a", "offset": rng.choice([0, -5, True, 1.5, "3"])}),
        ("memory", {"action": "delete"}),
        ("list_dir", {"depth": -(10 ** 50)}),
    ]) if "read_file" in tools else (rng.choice(["rm_rf", "READ_FILE"]), {})


@dataclass
class Turn:
    """One fuzzed turn and what the harness must make of it."""

    text: str
    runs: list[bool] = field(default_factory=list)
    """One entry per call that parses, in order: whether its tool and arguments are valid."""
    broken: int = 0
    """Blocks that do not parse to a call (each one broken tool result)."""
    thinking: str = ""
    """The thinking span's text, markers included ('' when the turn does not open with one)."""
    blocks: list[str] = field(default_factory=list)
    """The text of every call block, valid or broken, markers included."""

    def broken_results(self, max_calls: int) -> int:
        """Broken tool results the agent returns for this turn: parse errors, calls no tool
        takes, and calls past the per-turn cap."""
        return self.broken + sum(not ok or i >= max_calls for i, ok in enumerate(self.runs))


class _Builder:
    def __init__(self, rng: random.Random, tools: tuple[str, ...], big: int, raw_surrogates: bool):
        self.rng, self.tools, self.big, self.raw_surrogates = rng, tools, big, raw_surrogates
        self.turn = Turn("")
        self.parts: list[str] = []
        self.thinking_open = False

    @property
    def at_start(self) -> bool:
        return not "".join(self.parts).strip(SPACE)

    def marks(self) -> tuple[str, ...]:
        """Markers a JSON string may hold here (not </think> while thinking)."""
        return tuple(m for m in MARKERS if m != "</think>" or not self.thinking_open)

    def add(self, text: str, runs: tuple[bool, ...] = (), broken: int = 0,
            blocks: tuple[str, ...] = ()) -> None:
        self.parts.append(text)
        if self.thinking_open:  # thought: no calls, no blocks
            self.turn.thinking += text
            return
        self.turn.runs += runs
        self.turn.broken += broken
        self.turn.blocks += blocks

    def valid(self, marks: tuple[str, ...] | None = None, big: int | None = None) -> tuple[str, bool]:
        name = self.rng.choice(self.tools)
        return block(name, valid_args(self.rng, name, self.marks() if marks is None else marks,
                                      self.big if big is None else big), self.rng), True

    def call_fragment(self) -> None:
        if self.rng.random() < 0.75:
            text, ok = self.valid()
        else:
            text, ok = block(*invalid_call(self.rng, self.tools), self.rng), False
        self.add(text, (ok,), 0, (text,))

    def broken_fragment(self) -> None:
        rng = self.rng
        bodies: list[Callable[[], str]] = [
            lambda: garbage(rng),
            lambda: json.dumps(rng.choice([[1], 3, None, "x y", {"arguments": {}, "nam": "a"},
                                           {"name": "", "arguments": {}},
                                           {"name": "a", "arguments": [1]},
                                           {"name": "a", "arguments": "{oops"},
                                           {"name": "a", "arguments": {}, "extra": 1}])),
            lambda: '{"name": "read_file", "arguments": {"path": "a", "offset": '
                    + "1" * 5000 + "}}",
            lambda: '{"name": "read_file", "arguments": {"offset": '
                    + rng.choice(["NaN", "Infinity", "-Infinity", "1e400"]) + "}}",
            lambda: '{"name": "read_file", "arguments": {"path": "\\ud800x"}}',
            lambda: '{"name": "grep", "arguments": "{\\"pattern\\": \\"\\\\udfff\\"}"}',
            lambda: '{"name": "read_file", "arguments": {"path": ' + "[" * 40 + "]" * 40 + "}}",
            lambda: "[" * max(self.big, 5_000),  # past any recursion limit
            lambda: '{"name": "read_file", "arguments": {"path": "a"}} ' + garbage(rng, 8) + "x",
        ]
        if self.raw_surrogates:  # text no tokenizer decodes to: for parse_turn alone
            bodies.append(lambda: '{"name": "read_file", "arguments": {"path": "a\udcffb"}}')
        text = "<tool_call>" + rng.choice(bodies)() + "</tool_call>"
        self.add(text, (), 1, (text,))

    def think_fragment(self) -> None:
        rng = self.rng
        kind = rng.randrange(3)
        if kind == 0 or self.thinking_open:
            inner, ok = (self.valid(tuple(m for m in MARKERS if m != "</think>"))
                         if rng.random() < 0.5 else ("", False))
            body = garbage(rng)
            if self.at_start or self.thinking_open:  # leading (or inside): all of it is thought,
                self.thinking_open = True  # and its </think> ends the thinking
                self.add("<think>" + body + inner + "</think>")
                self.thinking_open = False
                return
            # later in the turn: plain text around whatever call it holds
            self.add("<think>" + body)
            if inner:
                self.add(inner, (ok,), 0, (inner,))
            self.add("</think>")
        elif kind == 1:  # a lone <think>: at the start it opens thinking that runs on
            if self.at_start:
                self.thinking_open = True
            self.add("<think>")
        else:  # a lone </think>: closes open thinking, else plain text
            self.add("</think>")
            self.thinking_open = False

    def many_calls(self, n: int) -> None:
        """``n`` small valid calls in a row (cheap to run: the count is what is tested)."""
        if "read_file" not in self.tools:
            calls = [self.valid((), big=10)[0] for _ in range(n)]
        else:
            calls = [block("read_file", {"path": self.rng.choice(["README.md", "nope.py"]),
                                         "limit": 1}, self.rng) for _ in range(n)]
        self.add("".join(calls), (True,) * n, 0, tuple(calls))

    def fragment(self) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.35:
            self.call_fragment()
        elif r < 0.6:
            self.broken_fragment()
        elif r < 0.65:
            self.add("</tool_call>", (), 1, ("</tool_call>",))
        elif r < 0.8:
            self.add(garbage(rng) or "text")
        elif r < 0.95:
            self.think_fragment()
        else:
            self.add(rng.choice(SPACE) * rng.randint(1, 3))

    def truncated_end(self) -> None:
        """A block the turn was cut in: garbage, or a call cut anywhere (no markers inside)."""
        text, _ = self.valid(())
        cut = "<tool_call>" + (garbage(self.rng) if self.rng.random() < 0.5
                               else text[11:self.rng.randrange(11, len(text) - 12)])
        self.add(cut, (), 1, (cut,))


    def unclosed_thinking(self) -> None:
        """The turn ends inside thinking it never closed that holds a call marker: from that
        marker on, the turn is one broken block (rule 1 of ``looprl.chat.format``)."""
        cut = self.turn.thinking.index("<tool_call>")
        self.turn.thinking, rest = self.turn.thinking[:cut], self.turn.thinking[cut:]
        self.turn.broken += 1
        self.turn.blocks.append(rest)


def fuzz_turn(rng: random.Random, *, tools: tuple[str, ...] = AGENT_TOOLS, big: int = 200_000,
              many: int = 0, raw_surrogates: bool = False, needs_action: bool = True) -> Turn:
    """One turn: optional leading whitespace and thinking, 0-7 fragments (``many`` > 0: also
    that many valid calls in a row, somewhere), maybe a truncated block. ``needs_action``: make
    sure it calls or breaks something (a plain answer would end an agent's episode).
    ``raw_surrogates``: also lone surrogates as characters (parse_turn only: no tokenizer
    decodes to them). ``big``: size of the huge strings."""
    b = _Builder(rng, tools, big, raw_surrogates)
    if rng.random() < 0.2:
        b.add(rng.choice(SPACE) * rng.randint(1, 3))
    if rng.random() < 0.3:
        b.think_fragment()
    n = rng.randint(0, 7)
    for k in range(n + 1):
        if many and k == n // 2:
            b.many_calls(many)
        if k < n:
            b.fragment()
    if rng.random() < 0.25:
        b.truncated_end()
    if b.thinking_open and "<tool_call>" in b.turn.thinking:
        b.unclosed_thinking()
    if needs_action and not b.turn.runs and not b.turn.broken:
        if b.thinking_open:
            b.add("</think>")
            b.thinking_open = False
        b.add("</tool_call>", (), 1, ("</tool_call>",))
    b.turn.text = "".join(b.parts)
    return b.turn


def check_trajectory(traj: Trajectory, turns: list[Turn], fmt: ChatFormat, max_calls: int) -> None:
    """One fuzzed trajectory: it ran every turn, its counters are what the turns were built
    with, and it saves."""
    assert traj.stop_reason == StopReason.MAX_TURNS, traj.error
    expected = sum(t.broken_results(max_calls) for t in turns)
    shown = [m for m in traj.messages if m["role"] == "tool"
             and m["content"].startswith("Invalid tool call")]
    c = traj.counters
    assert c.broken_tool_calls == len(shown) == expected
    assert c.tool_calls == sum(len(t.runs) + t.broken for t in turns)
    assert c.thinking_tokens == sum(len(fmt.encode(t.thinking)) for t in turns)
    assert c.tool_call_tokens == sum(len(fmt.encode(b)) for t in turns for b in t.blocks)
    text = traj.to_json()
    text.encode("utf-8")
    assert Trajectory.from_json(text) == traj
