"""How much code an editor selection holds: the changed code itself, its enclosing block, or
its enclosing function (``tasks.experimental.selection_width``).

    first, last = enclosing_lines(text, 12, 12, "function")   # 1-based, inclusive

A user who selects code to say "this is wrong" rarely selects the exact tokens: they select a
line, a block or the whole function. The wider the selection, the more of the finding is left to
the agent. Enclosing nodes come from Python's ``ast``; a file that does not parse (or code at
module level for ``function``) keeps the lines as they are.
"""

from __future__ import annotations

import ast

WIDTHS = ("line", "block", "function")
"""``line``: the code the fix replaces (the tightest snippet); ``block``: the innermost compound
statement (``if``, ``for``, ``while``, ``with``, ``try``, ``match``) holding it, or, directly in
a ``def``, class or module body, the run of simple statements around it (the paragraph an editor's
"expand selection" reaches); ``function``: the innermost ``def`` holding it."""

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (*_FUNCTIONS, ast.ClassDef, ast.Module)
_BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
           *((ast.TryStar,) if hasattr(ast, "TryStar") else ()),
           *((ast.Match,) if hasattr(ast, "Match") else ()))


def enclosing_lines(text: str, first: int, last: int, width: str) -> tuple[int, int]:
    """(first, last) line, 1-based and inclusive, of the smallest ``width`` node of ``text``
    holding lines ``first``..``last``; the lines themselves when none does.

    >>> src = ("def f(a):\\n    'Doc.'\\n    a += 1\\n    b = a\\n    if a:\\n        a += b\\n"
    ...        "    return a\\n")
    >>> enclosing_lines(src, 6, 6, "block"), enclosing_lines(src, 6, 6, "function")
    ((5, 6), (1, 7))
    >>> enclosing_lines(src, 4, 4, "block")  # straight in the def: its run of simple statements
    (3, 4)
    >>> enclosing_lines("x = 1\\n", 1, 1, "function")
    (1, 1)
    """
    if width not in WIDTHS:
        raise ValueError(f"unknown selection width {width!r}: use one of {', '.join(WIDTHS)}")
    if width == "line":
        return first, last
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return first, last
    node = _smallest(tree, _FUNCTIONS if width == "function" else _BLOCKS, first, last)
    if node is not None:
        return node.lineno, node.end_lineno or node.lineno
    if width == "block":
        scope = _smallest(tree, _SCOPES, first, last) or tree
        return _paragraph(scope, first, last) or (first, last)
    return first, last


def _smallest(tree: ast.AST, kinds: tuple[type, ...], first: int, last: int) -> ast.stmt | None:
    """The shortest statement of one of ``kinds`` spanning lines ``first``..``last``."""
    best: ast.stmt | None = None
    for node in ast.walk(tree):
        if not isinstance(node, kinds) or not isinstance(node, ast.stmt):
            continue
        end = node.end_lineno or node.lineno
        if node.lineno <= first <= last <= end and (
                best is None or end - node.lineno < (best.end_lineno or 0) - best.lineno):
            best = node
    return best


def _paragraph(scope: ast.AST, first: int, last: int) -> tuple[int, int] | None:
    """The run of simple statements of ``scope``'s body around lines ``first``..``last`` (a
    docstring and compound statements end it), or the statement holding them if compound."""
    body: list[ast.stmt] = getattr(scope, "body", [])
    at = [i for i, st in enumerate(body) if st.lineno <= last and first <= (st.end_lineno or 0)]
    if not at:
        return None

    def simple(i: int) -> bool:
        st = body[i]
        doc = i == 0 and isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and (
            isinstance(st.value.value, str))
        return not doc and not isinstance(st, (*_BLOCKS, *_SCOPES))

    lo, hi = at[0], at[-1]
    if any(not simple(i) for i in range(lo, hi + 1)):
        return body[lo].lineno, body[hi].end_lineno or body[hi].lineno
    while lo > 0 and simple(lo - 1):
        lo -= 1
    while hi + 1 < len(body) and simple(hi + 1):
        hi += 1
    return body[lo].lineno, body[hi].end_lineno or body[hi].lineno


def widen(text: str, spans: list[tuple[int, str]], width: str) -> list[tuple[int, str]]:
    """(first line, code) of each selection of one file's ``text`` at ``width``, from the
    (first line, code) ``spans`` of the code the fix replaces: whole lines, as an editor
    selects them, overlapping ones merged.

    >>> src = "def f(a):\\n    a += 1\\n    return a\\n"
    >>> widen(src, [(2, "+= 1"), (3, "return a")], "function")
    [(1, 'def f(a):\\n    a += 1\\n    return a')]
    """
    if width == "line":
        return spans
    lines = text.splitlines()
    ranges = sorted(enclosing_lines(text, a, a + code.count("\n"), width) for a, code in spans)
    merged: list[list[int]] = []
    for a, b in ranges:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, "\n".join(lines[a - 1:b])) for a, b in merged]
