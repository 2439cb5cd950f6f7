"""Task prompts written like a user's: terse, underspecified, from the failing behaviour.

A prompt never contains the diff or the test file. It is built from what a user would notice: the
function they called, the wrong vs expected value from a failing assertion, an exception, or a
failing test's name. Several styles exist; each task records the one used in
``metadata["prompt_style"]``, picked deterministically from the task id among those that fit.

    p = make_prompt(Evidence(functions=("titleize",), module="inflection", failing=(...,),
                             messages={...}, kind="compare_flip"), seed="task-id")
    p.text, p.style

A prompt can also carry the code the user selected in the editor, as Cursor attaches a selection
to a chat message (``with_selection``): where the bug is, not what the fix is.
"""

from __future__ import annotations

import ast
import hashlib
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_VALUE_CHARS = 80


@dataclass(frozen=True)
class Evidence:
    """What the failing behaviour shows (gathered when the task is screened)."""

    functions: tuple[str, ...]
    """Qualified names of the functions involved ('Class.method')."""
    module: str
    """Dotted module of the first function ('pkg.mod')."""
    failing: tuple[str, ...]
    """fail_to_pass node ids."""
    messages: dict[str, str] = field(default_factory=dict)
    """node id -> first line of its failure (pytest's short summary / ``E`` lines)."""
    kind: str = "mutation"
    """Mutation kind, "feature_deletion" or "release"."""
    package: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    """node id (without parameters) -> source of the test function, to tell which side of a
    failing ``assert a == b`` is the computed (actual) value."""


@dataclass(frozen=True)
class Prompt:
    text: str
    style: str


def _short(v: str) -> str:
    v = " ".join(v.split())
    return v if len(v) <= MAX_VALUE_CHARS else v[: MAX_VALUE_CHARS - 3] + "..."


def _test_name(node: str) -> str:
    return node.rsplit("::", 1)[-1].split("[", 1)[0]


def _api(ev: Evidence) -> str:
    """How a user would name the thing: the public function, else the failing test's subject."""
    for f in ev.functions:
        last = f.split(".")[-1]
        if not last.startswith("_"):
            return f.split(".")[-2] if last == "__init__" and "." in f else f
    name = _test_name(ev.failing[0]) if ev.failing else ""
    return re.sub(r"^test_?", "", name) or (ev.functions[0] if ev.functions else ev.module)


def _actual_is_left(source: str) -> bool | None:
    """In the test's first ``assert a == b``: True if only the left side calls code (the left is
    the computed value), False if only the right does, None when the source does not say.

    >>> _actual_is_left("def test_x():\\n    assert f(1) == 2")
    True
    >>> _actual_is_left("def test_x(n, want):\\n    assert want == n + g(n)")
    False
    """
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
                and len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.Eq)):
            left, right = node.test.left, node.test.comparators[0]
            calls = [any(isinstance(n, ast.Call) for n in ast.walk(side)) for side in (left, right)]
            if calls[0] != calls[1]:
                return calls[0]
            return None
    return None


def _assertion(ev: Evidence) -> tuple[str, str] | None:
    """(actual, expected) from an ``assert a == b`` failure message, if one is there and the
    test's source tells which side was computed (tests write both orders)."""
    for node in ev.failing:
        msg = ev.messages.get(node, "")
        m = re.search(r"assert (.+?) == (.+?)(?:$|\n|\s+\+\s)", msg)
        if not (m and len(m.group(1)) < 200 and len(m.group(2)) < 200):
            continue
        left_actual = _actual_is_left(ev.sources.get(node.split("[", 1)[0], ""))
        if left_actual is None:
            continue
        a, b = _short(m.group(1)), _short(m.group(2))
        return (a, b) if left_actual else (b, a)
    return None


def _exception(ev: Evidence) -> str | None:
    for node in ev.failing:
        m = re.match(r"^(\w+(?:Error|Exception|Warning)|StopIteration|KeyError)\b:?\s*(.*)",
                     ev.messages.get(node, ""))
        if m and m.group(1) != "AssertionError":
            return _short(f"{m.group(1)}: {m.group(2)}" if m.group(2) else m.group(1))
    return None


# Each style returns None when the evidence does not support it.
def s_wrong_value(ev: Evidence) -> str | None:
    pair = _assertion(ev)
    if not pair:
        return None
    got, want = pair
    return f"{_api(ev)} gives me {got} but it should be {want}"


def s_exception(ev: Evidence) -> str | None:
    exc = _exception(ev)
    return f"{_api(ev)} crashes with {exc} now. can you fix it?" if exc else None


def s_failing_test(ev: Evidence) -> str | None:
    if not ev.failing:
        return None
    names = sorted({_test_name(n) for n in ev.failing})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{shown} failing, please fix (don't touch the tests)"


def s_bug_report(ev: Evidence) -> str | None:
    where = ev.package or ev.module.split(".")[0]
    return f"something's off with {_api(ev)} in {where}, results look wrong. fix it"


def s_terse(ev: Evidence) -> str | None:
    return f"fix {_api(ev)}"


def s_implement(ev: Evidence) -> str | None:
    if ev.kind != "feature_deletion":
        return None
    f = ev.functions[0] if ev.functions else _api(ev)
    return f"{f} in {ev.module} raises NotImplementedError. implement it"


def s_release(ev: Evidence) -> str | None:
    if ev.kind != "release":
        return None
    names = sorted({_test_name(n) for n in ev.failing})
    topic = re.sub(r"^test_?", "", names[0]).replace("_", " ") if names else "this"
    return f"{ev.package}: support {topic} (expected behaviour is like the next release). " \
           f"{len(names)} test(s) should pass"


STYLES: dict[str, Callable[[Evidence], str | None]] = {
    "wrong_value": s_wrong_value,
    "exception": s_exception,
    "failing_test": s_failing_test,
    "bug_report": s_bug_report,
    "terse": s_terse,
    "implement": s_implement,
    "release": s_release,
}
# Feature tasks are asked for as features; bugs prefer the most informative fitting style.
_PREFERRED = {"feature_deletion": ("implement",), "release": ("release", "wrong_value",
                                                              "exception", "failing_test")}


def make_prompt(ev: Evidence, seed: str) -> Prompt:
    """One prompt for ``ev``, its style chosen from the fitting ones by a hash of ``seed``."""
    names = _PREFERRED.get(ev.kind) or ("wrong_value", "exception", "failing_test", "bug_report",
                                        "terse")
    fitting = [(n, t) for n in names if (t := STYLES[n](ev))]
    assert fitting, f"no prompt style fits {ev}"
    h = int(hashlib.sha1(seed.encode()).hexdigest(), 16)
    # informative styles twice as likely: users often paste what they saw
    weighted = [x for x in fitting for _ in range(2 if x[0] in ("wrong_value", "exception") else 1)]
    style, text = weighted[h % len(weighted)]
    return Prompt(text, style)


def with_selection(text: str, selected: list[tuple[str, int, str]]) -> str:
    """``text`` followed by the user's editor selections, each (path, first line, code) as a
    fenced block under its path and line numbers.

    >>> print(with_selection("fix ordinal", [("./inflection/__init__.py", 229, '2: "st",')]))
    fix ordinal
    <BLANKLINE>
    selected in ./inflection/__init__.py, lines 229-229:
    ```
    2: "st",
    ```
    """
    if not selected:
        raise ValueError("with_selection needs at least one (path, line, code) selection")
    blocks = [f"selected in {path}, lines {line}-{line + code.count(chr(10))}:\n```\n{code}\n```"
              for path, line, code in selected]
    return "\n\n".join([text, *blocks])
