"""SWE-smith-style bug injection: small AST-located edits to real functions of a real package.

Each mutator is a named function ``(source, tree, path) -> list[Mutation]`` in ``MUTATORS``; a
``Mutation`` is a list of minimal text edits (character spans found through ``ast`` positions), so
formatting elsewhere is untouched and the gold patch (mutated -> original) is a few lines.

    muts = candidates(source_text, "pkg/mod.py", kinds=("compare_flip", "off_by_one"))
    new_text = apply_edits(source_text, muts[0].edits)
    gold = unified_diff("pkg/mod.py", new_text, source_text)  # (looprl.diffs) the reverse diff

Kinds: compare_flip, arith_flip, bool_flip, off_by_one, negate_condition, drop_condition,
drop_guard, swap_args, drop_statement, drop_return, change_default, and feature_deletion
(the function body becomes ``raise NotImplementedError``: the task is to implement it).
``combine`` joins 2-3 accepted mutations of different functions into one multi-site task.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from looprl.diffs import unified_diff

_CMP_FLIP = {ast.Lt: ("<", ">="), ast.GtE: (">=", "<"), ast.Gt: (">", "<="), ast.LtE: ("<=", ">"),
             ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"),
             ast.IsNot: ("is not", "is"), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in")}
_ARITH_FLIP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"),
               ast.FloorDiv: ("//", "*"), ast.Div: ("/", "*"), ast.Mod: ("%", "//"),
               ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&"), ast.LShift: ("<<", ">>"),
               ast.RShift: (">>", "<<")}
_BOOL_FLIP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
FuncNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Edit:
    """Replace characters ``[start, end)`` of a file's text with ``new``."""

    start: int
    end: int
    new: str


@dataclass(frozen=True)
class Site:
    """The edits of one mutation inside one file."""

    path: str
    function: str
    """Qualified name of the mutated function ('Class.method')."""
    line: int
    edits: tuple[Edit, ...]


@dataclass(frozen=True)
class Mutation:
    kind: str
    sites: tuple[Site, ...]
    description: str
    """Human-readable: "`<` -> `>=` in Foo.bar" (never shown to the agent)."""

    @property
    def id(self) -> str:
        key = repr((self.kind, [(s.path, s.edits) for s in self.sites]))
        return hashlib.sha1(key.encode()).hexdigest()[:10]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.path for s in self.sites))

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.function for s in self.sites))


class Source:
    """A file's text with ast position -> character offset conversion (ast columns are bytes)."""

    def __init__(self, text: str, path: str):
        self.text, self.path = text, path
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for ln in self.lines:
            self.starts.append(self.starts[-1] + len(ln))

    def off(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode("utf-8", "replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.off(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.off(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def seg(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def full_lines(self, node: ast.stmt) -> tuple[int, int] | None:
        """Character range of the whole lines ``node`` occupies, if nothing else shares them."""
        a, b = self.span(node)
        first = self.starts[node.lineno - 1]
        last = self.starts[node.end_lineno]  # type: ignore[index]
        if self.text[first:a].strip() or self.text[b:last].split("#", 1)[0].strip():
            return None
        return first, last


def apply_edits(text: str, edits: tuple[Edit, ...] | list[Edit]) -> str:
    """Apply non-overlapping edits (any order)."""
    out, pos = [], 0
    for e in sorted(edits, key=lambda e: e.start):
        assert e.start >= pos, "mutation edits overlap"
        out += [text[pos:e.start], e.new]
        pos = e.end
    return "".join(out) + text[pos:]


# ------------------------------------------------------------------ walking


def functions(tree: ast.Module) -> Iterator[tuple[str, FuncNode]]:
    """(qualified name, node) of every function and method, outermost first."""
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, FuncNode]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = f"{prefix}{child.name}"
                yield q, child
                yield from walk(child, q + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
    yield from walk(tree, "")


def own_nodes(fn: FuncNode) -> Iterator[ast.AST]:
    """Nodes of ``fn``'s body, not descending into nested functions, classes or lambdas."""
    stack: list[ast.AST] = list(reversed(fn.body))
    while stack:
        node = stack.pop()
        yield node
        for child in reversed(list(ast.iter_child_nodes(node))):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                      ast.Lambda)):
                stack.append(child)


def _docstring_node(fn: FuncNode) -> ast.stmt | None:
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
            first.value.value, str):
        return first
    return None


def _in_docstring_or_annotation(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


# ------------------------------------------------------------------ mutators
Found = tuple[ast.AST, tuple[Edit, ...], str]


def _op_in_gap(src: Source, left: ast.AST, right: ast.AST, old: str, new: str) -> Edit | None:
    """An edit replacing operator ``old`` found between ``left`` and ``right`` by ``new``."""
    a, b = src.span(left)[1], src.span(right)[0]
    gap = src.text[a:b]
    pattern = r"\s+".join(re.escape(w) for w in old.split())
    cleaned = re.sub(r"[\s()\\]", "", gap)
    if cleaned != old.replace(" ", ""):
        return None  # comments or unexpected tokens in between: skip rather than guess
    m = re.search(pattern, gap)
    if not m:
        return None
    return Edit(a + m.start(), a + m.end(), new)


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, (ast.JoinedStr,)) or (isinstance(node, ast.Constant)
                                                   and isinstance(node.value, (str, bytes)))


def m_compare_flip(src: Source, fn: FuncNode) -> Iterator[Found]:
    for n in own_nodes(fn):
        if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in _CMP_FLIP:
            old, new = _CMP_FLIP[type(n.ops[0])]
            if e := _op_in_gap(src, n.left, n.comparators[0], old, new):
                yield n, (e,), f"`{old}` -> `{new}`"


def m_arith_flip(src: Source, fn: FuncNode) -> Iterator[Found]:
    for n in own_nodes(fn):
        if isinstance(n, ast.BinOp) and type(n.op) in _ARITH_FLIP and not (
                _is_str(n.left) or _is_str(n.right)):
            old, new = _ARITH_FLIP[type(n.op)]
            if e := _op_in_gap(src, n.left, n.right, old, new):
                yield n, (e,), f"`{old}` -> `{new}`"


def m_bool_flip(src: Source, fn: FuncNode) -> Iterator[Found]:
    for n in own_nodes(fn):
        if isinstance(n, ast.BoolOp):
            old, new = _BOOL_FLIP[type(n.op)]
            if e := _op_in_gap(src, n.values[0], n.values[1], old, new):
                yield n, (e,), f"`{old}` -> `{new}`"


def m_off_by_one(src: Source, fn: FuncNode) -> Iterator[Found]:
    for n in own_nodes(fn):
        if isinstance(n, ast.Constant) and type(n.value) is int and re.fullmatch(r"\d+", src.seg(n)):
            delta = 1 if (n.lineno + n.col_offset) % 2 == 0 or n.value == 0 else -1
            a, b = src.span(n)
            yield n, (Edit(a, b, str(n.value + delta)),), f"`{n.value}` -> `{n.value + delta}`"


def m_negate_condition(src: Source, fn: FuncNode) -> Iterator[Found]:
    for n in own_nodes(fn):
        if isinstance(n, (ast.If, ast.While, ast.IfExp)):
            t = n.test
            a, b = src.span(t)
            if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
                yield n, (Edit(a, b, src.seg(t.operand)),), "dropped a `not`"
            elif "\n" not in src.seg(t):
                yield n, (Edit(a, b, f"not ({src.seg(t)})"),), "negated a condition"


def m_drop_condition(src: Source, fn: FuncNode) -> Iterator[Found]:
    for n in own_nodes(fn):
        if isinstance(n, ast.BoolOp) and len(n.values) == 2:
            keep = n.values[0] if n.lineno % 2 else n.values[1]
            a, b = src.span(n)
            yield n, (Edit(a, b, src.seg(keep)),), "dropped one operand of a boolean condition"


def _bodies(fn: FuncNode) -> Iterator[list[ast.stmt]]:
    for n in own_nodes(fn):
        for attr in ("body", "orelse", "finalbody"):
            body = getattr(n, attr, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield body
    yield fn.body


def m_drop_guard(src: Source, fn: FuncNode) -> Iterator[Found]:
    for body in _bodies(fn):
        for st in body:
            if (isinstance(st, ast.If) and not st.orelse and len(st.body) == 1 and len(body) >= 2
                    and isinstance(st.body[0], (ast.Return, ast.Raise, ast.Continue, ast.Break))
                    and (rng := src.full_lines(st))):
                yield st, (Edit(rng[0], rng[1], ""),), "removed an early-exit guard"


def m_drop_statement(src: Source, fn: FuncNode) -> Iterator[Found]:
    for body in _bodies(fn):
        if len(body) < 2:
            continue
        for st in body[:-1]:
            if isinstance(st, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or (
                    isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)):
                if rng := src.full_lines(st):
                    yield st, (Edit(rng[0], rng[1], ""),), "removed a statement"


def m_drop_return(src: Source, fn: FuncNode) -> Iterator[Found]:
    for n in own_nodes(fn):
        if isinstance(n, ast.If):
            for st in n.body + n.orelse:
                if isinstance(st, ast.Return) and st.value is not None:
                    a, b = src.span(st)
                    yield st, (Edit(a, b, "pass"),), "removed a return"


def m_swap_args(src: Source, fn: FuncNode) -> Iterator[Found]:
    for n in own_nodes(fn):
        if isinstance(n, ast.Call) and len(n.args) >= 2 and not any(
                isinstance(a, ast.Starred) for a in n.args[:2]):
            x, y = n.args[0], n.args[1]
            if src.seg(x) != src.seg(y):
                (xa, xb), (ya, yb) = src.span(x), src.span(y)
                yield n, (Edit(xa, xb, src.seg(y)), Edit(ya, yb, src.seg(x))), "swapped two arguments"


def m_change_default(src: Source, fn: FuncNode) -> Iterator[Found]:
    for d in [*fn.args.defaults, *(k for k in fn.args.kw_defaults if k is not None)]:
        if isinstance(d, ast.Constant) and isinstance(d.value, bool):
            a, b = src.span(d)
            yield d, (Edit(a, b, str(not d.value)),), "changed a default"
        elif isinstance(d, ast.Constant) and type(d.value) is int and re.fullmatch(r"\d+", src.seg(d)):
            a, b = src.span(d)
            yield d, (Edit(a, b, str(d.value + 1)),), "changed a default"


def m_feature_deletion(src: Source, fn: FuncNode) -> Iterator[Found]:
    doc = _docstring_node(fn)
    body = fn.body[1:] if doc else fn.body
    if not body or fn.end_lineno - fn.lineno > 60:  # type: ignore[operator]
        return
    lines_of_code = sum(1 for ln in src.lines[body[0].lineno - 1: fn.end_lineno] if ln.strip()
                        and not ln.strip().startswith("#"))
    if lines_of_code < 3 or any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in own_nodes(fn)):
        return
    first = src.starts[body[0].lineno - 1]
    if src.text[first:src.off(body[0].lineno, body[0].col_offset)].strip():
        return  # body starts on the def line
    indent = src.lines[body[0].lineno - 1][: body[0].col_offset]
    end = src.starts[fn.end_lineno]  # type: ignore[index]
    yield fn, (Edit(first, end, f"{indent}raise NotImplementedError\n"),), "deleted the body"


MUTATORS: dict[str, Callable[[Source, FuncNode], Iterator[Found]]] = {
    "compare_flip": m_compare_flip,
    "arith_flip": m_arith_flip,
    "bool_flip": m_bool_flip,
    "off_by_one": m_off_by_one,
    "negate_condition": m_negate_condition,
    "drop_condition": m_drop_condition,
    "drop_guard": m_drop_guard,
    "drop_statement": m_drop_statement,
    "drop_return": m_drop_return,
    "swap_args": m_swap_args,
    "change_default": m_change_default,
    "feature_deletion": m_feature_deletion,
}
SINGLE_KINDS = tuple(k for k in MUTATORS if k != "feature_deletion")
LOCAL_KINDS = ("compare_flip", "arith_flip", "bool_flip", "off_by_one", "negate_condition",
               "swap_args", "change_default")
"""Kinds whose fix can be read off the mutated line itself (an operator, a constant, an order):
nothing the fix needs was deleted. The small default model is taught and trained on these."""


def candidates(text: str, path: str, kinds: tuple[str, ...] = tuple(MUTATORS), *,
               check_syntax: bool = True) -> list[Mutation]:
    """Every mutation of ``kinds`` in one file whose result still parses. Large files make
    thousands of candidates: pass ``check_syntax=False`` and check the few you use with
    ``parses``."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    src = Source(text, path)
    out: list[Mutation] = []
    seen: set[str] = set()  # one edit reached from two places (e.g. a nested function) is one mutation
    for qual, fn in functions(tree):
        if fn.name.startswith("__") and fn.name not in ("__init__", "__call__", "__eq__",
                                                        "__lt__", "__contains__", "__getitem__"):
            continue
        for kind in kinds:
            for node, edits, desc in MUTATORS[kind](src, fn):
                if check_syntax and not parses(apply_edits(text, edits)):
                    continue
                site = Site(path, qual, getattr(node, "lineno", fn.lineno), edits)
                m = Mutation(kind, (site,), f"{desc} in {qual}")
                if m.id not in seen:
                    seen.add(m.id)
                    out.append(m)
    return out


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def combine(muts: list[Mutation]) -> Mutation:
    """One multi-site mutation from single ones in different functions."""
    assert len({f for m in muts for f in m.functions}) == sum(len(m.functions) for m in muts), \
        "combine mutations of different functions"
    sites = tuple(s for m in muts for s in m.sites)
    return Mutation("multi_site", sites, "; ".join(m.description for m in muts))


def mutated_files(originals: dict[str, str], mut: Mutation) -> dict[str, str]:
    """path -> mutated text for every file ``mut`` touches."""
    out: dict[str, str] = {}
    for path in mut.paths:
        edits = [e for s in mut.sites if s.path == path for e in s.edits]
        out[path] = apply_edits(originals[path], edits)
    return out


def gold_patch(originals: dict[str, str], mutated: dict[str, str]) -> str:
    """The fix: the diff from the mutated files back to the originals."""
    return "".join(unified_diff(p, mutated[p], originals[p]) for p in sorted(mutated))
