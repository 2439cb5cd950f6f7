"""Copy drills: short pretraining documents that teach the three copies every fix needs.

    docs = copy_drills(demos, tok, per_demo=4, seed=0)   # token ids for pretrain(transcripts=)

A small model fails an agent task less for want of the fix than for want of copying: the name
the user gave into a ``grep`` call, the path and line ``grep`` printed into a ``read_file`` call,
the line ``read_file`` showed into ``edit_file``'s ``old_string`` (``bench.turns``
measures each). A drill is one such step cut from a checked demo (``tasks.demos``) — the message
holding the source and the assistant turn copying it, in the harness's chat format — with what is
copied replaced, in both, by something random:

- ``grep``: the function name, by a random identifier;
- ``read_file``: the file's path, by a random path, and the line, by a random number;
- ``edit_file``: every identifier of ``old_string``, by random identifiers.

Each demo step gives ``per_demo`` drills with different replacements, so no name, path or line
can be remembered: only copying from the context predicts the call. Random identifiers are drawn
from the demos' own tool outputs (real names, real tokenization). Drills carry a loss on every
token (pretraining), and being a few hundred tokens long, many fit in one window.

The chat format must be ChatML (``<|im_start|>role ... <|im_end|>``), as the default tokenizer's
and Qwen's are; other templates raise ``ConfigError``.
"""

from __future__ import annotations

import builtins
import json
import keyword
import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

from looprl.errors import ConfigError
from looprl.harness.format import ChatFormat, parse_turn
from looprl.types import Trajectory

_BLOCK = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.S)
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_KEEP = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls"}
KINDS = ("grep", "read_file", "edit_file")


def _call(body: str) -> tuple[str, dict[str, Any]] | None:
    """(tool name, arguments) of an assistant turn that makes exactly one well-formed call (as
    the harness parses it), else None."""
    parsed = parse_turn(body)
    if len(parsed.tool_calls) != 1 or parsed.errors:
        return None
    call = parsed.tool_calls[0]
    return call.name, json.loads(call.arguments)


def _swap(texts: tuple[str, str], pairs: dict[str, str]) -> tuple[str, str]:
    """Replace each key, as a whole word, by its value in both texts (in one pass)."""
    if not pairs:
        return texts
    pat = re.compile(r"\b(" + "|".join(map(re.escape, sorted(pairs, key=len, reverse=True)))
                     + r")\b")

    def swap(text: str) -> str:
        return pat.sub(lambda m: pairs[m.group(1)], text)

    return swap(texts[0]), swap(texts[1])


def _fresh(rng: random.Random, pool: Sequence[str], avoid: set[str]) -> str:
    """A name from ``pool`` not in ``avoid`` (then joined pairs of them, when the pool is
    nearly all taken); added to ``avoid``."""
    for tries in range(1_000_000):
        name = rng.choice(pool) if tries < 64 else f"{rng.choice(pool)}_{rng.choice(pool)}"
        if name not in avoid:
            avoid.add(name)
            return name
    raise AssertionError("no fresh identifier")  # pairs of >= 50 names never run out


def _drill(kind: str, args: dict[str, Any], ctx: str, turn: str, rng: random.Random,
           pool: Sequence[str]) -> tuple[str, str] | None:
    """(context, turn) with the copied parts replaced, or None when the turn does not copy
    from this context (then there is nothing to drill)."""
    taken = set(_IDENT.findall(ctx)) | set(_IDENT.findall(turn))
    if kind == "grep":
        m = re.match(r"def (\w+)", str(args.get("pattern", "")))
        if not m or not re.search(rf"\b{re.escape(m.group(1))}\b", ctx):
            return None
        return _swap((ctx, turn), {m.group(1): _fresh(rng, pool, taken)})
    if kind == "read_file":
        path, line = str(args.get("path", "")), args.get("offset")
        if not isinstance(line, int) or f"{path}:{line}:" not in ctx or "." not in path:
            return None
        dirs = [_fresh(rng, pool, taken) for _ in range(path.count("/"))]
        dot = "./" if path.startswith("./") else ""  # grep prints ./-relative paths
        new_path = dot + "/".join([*dirs[len(dot) // 2:], _fresh(rng, pool, taken)]) + \
            path[path.rindex("."):]
        new_line = rng.randint(1, 2000)
        ctx = ctx.replace(f"{path}:{line}:", f"{new_path}:{new_line}:").replace(path, new_path)
        turn = turn.replace(json.dumps(path), json.dumps(new_path)).replace(
            f'"offset": {line}', f'"offset": {new_line}')
        return ctx, turn
    if kind == "edit_file":
        old = str(args.get("old_string", ""))
        if not old.strip() or any(ln.strip() and ln not in ctx for ln in old.splitlines()):
            return None
        names = sorted({n for n in _IDENT.findall(old) if n not in _KEEP})
        return _swap((ctx, turn), {n: _fresh(rng, pool, taken) for n in names})
    return None


def _steps(text: str) -> Iterable[tuple[str, str, str, dict[str, Any], str]]:
    """(context role, context, tool, arguments, assistant turn) for each single-call turn."""
    blocks = _BLOCK.findall(text)
    for (ctx_role, ctx), (role, body) in zip(blocks, blocks[1:], strict=False):
        call = _call(body) if role == "assistant" and ctx_role in ("user", "tool") else None
        if call is not None:
            yield ctx_role, ctx, call[0], call[1], body


def identifier_pool(texts: Iterable[str], min_len: int = 3) -> list[str]:
    """Distinct non-keyword identifiers in ``texts`` (sorted, for reproducibility)."""
    return sorted({n for t in texts for n in _IDENT.findall(t)
                   if len(n) >= min_len and n not in _KEEP and not n.isupper()})


def copy_drills(demos: Sequence[Trajectory], tok: Any, *, per_demo: int = 4, seed: int = 0,
                kinds: Iterable[str] = KINDS) -> list[list[int]]:
    """Token ids of ``per_demo`` drills per copying step of each demo (see the module
    docstring), shuffled."""
    fmt = ChatFormat(tok)
    texts = [fmt.decode(list(s.token_ids_T)) for d in demos for s in d.segments]
    if texts and not any(_BLOCK.search(t) for t in texts):
        raise ConfigError("copy drills need a ChatML chat format (<|im_start|>role ... "
                          "<|im_end|>); this tokenizer's template renders something else")
    pool = identifier_pool(body for t in texts for role, body in _BLOCK.findall(t)
                           if role == "tool")
    if len(pool) < 50:
        raise ConfigError(f"only {len(pool)} identifiers in the demos' tool outputs; copy drills "
                          "need more demos")
    rng = random.Random(seed)
    wanted = set(kinds)
    docs: list[list[int]] = []
    for text in texts:
        for ctx_role, ctx, tool, args, turn in _steps(text):
            if tool not in wanted:
                continue
            for _ in range(per_demo):
                got = _drill(tool, args, ctx, turn, rng, pool)
                if got is None:
                    break
                docs.append(fmt.encode(f"<|im_start|>{ctx_role}\n{got[0]}{fmt.eot}\n"
                                       f"<|im_start|>assistant\n{got[1]}{fmt.eot}\n"))
    rng.shuffle(docs)
    return docs
