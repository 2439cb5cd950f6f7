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

A renamed demo (``renamed_demos``, for SFT) is the same idea on a whole demo: every identifier its
``edit_file`` call's ``old_string`` names is renamed at random in all the code the transcript
holds (the prompt's selection, tool outputs, the edit call's strings), so the demo stays one
coherent fix, with its loss on the same model turns, of code no prior can predict: only copying
reproduces the edit.

The chat format must be ChatML (``<|im_start|>role ... <|im_end|>``), as the default tokenizer's
and Qwen's are; other templates raise ``ConfigError``.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import keyword
import random
import re
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from looprl.chat import ChatFormat, parse_turn
from looprl.errors import ConfigError
from looprl.types import Message, Segment, Trajectory

_BLOCK = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.S)
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_CODE_NAME = re.compile(r"(?<![\\\w])[A-Za-z_]\w*\b(?![\"'])")
"""A name in code as it stands in a file: not a letter of an escape (``\\w``, ``\\n``), not a
string prefix (``r"``)."""
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


def _renamer(pairs: dict[str, str], *, code: bool = False) -> Callable[[str], str]:
    """Text -> the text with each key of ``pairs``, as a whole word, replaced by its value (in
    one pass, so a value that is another key is never renamed again). With ``code`` (text as it
    stands in a file), only where ``_CODE_NAME`` sees a name."""
    if not pairs:
        return lambda text: text
    names = "|".join(map(re.escape, sorted(pairs, key=len, reverse=True)))
    pat = re.compile(rf"(?<![\\\w])({names})\b(?![\"'])" if code else rf"\b({names})\b")
    return lambda text: pat.sub(lambda m: pairs[m.group(1)], text)


def _swap(texts: tuple[str, str], pairs: dict[str, str]) -> tuple[str, str]:
    """Replace each key, as a whole word, by its value in both texts."""
    rename = _renamer(pairs)
    return rename(texts[0]), rename(texts[1])


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


def _tool_pool(texts: Iterable[str]) -> list[str]:
    """The identifiers random names are drawn from: those of the tool outputs in ``texts``."""
    pool = identifier_pool(body for t in texts for role, body in _BLOCK.findall(t)
                           if role == "tool")
    if len(pool) < 50:
        raise ConfigError(f"only {len(pool)} identifiers in the demos' tool outputs; copy drills "
                          "and renamed demos need more demos")
    return pool


def copy_drills(demos: Sequence[Trajectory], tok: Any, *, per_demo: int = 4, seed: int = 0,
                kinds: Iterable[str] = KINDS) -> list[list[int]]:
    """Token ids of ``per_demo`` drills per copying step of each demo (see the module
    docstring), shuffled."""
    fmt = ChatFormat(tok)
    texts = [fmt.decode(list(s.token_ids_T)) for d in demos for s in d.segments]
    if texts and not any(_BLOCK.search(t) for t in texts):
        raise ConfigError("copy drills need a ChatML chat format (<|im_start|>role ... "
                          "<|im_end|>); this tokenizer's template renders something else")
    pool = _tool_pool(texts)
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


def _edited_names(fmt: ChatFormat, seg: Segment) -> list[str]:
    """The identifiers (keywords, builtins and ``self`` aside) of the ``old_string`` of every
    ``edit_file`` call among the model turns of ``seg``, sorted."""
    names: set[str] = set()
    for a, b in seg.model_turns():
        call = _call(fmt.decode(seg.token_ids_T[a:b]))
        if call is not None and call[0] == "edit_file":
            names |= {n for n in _CODE_NAME.findall(str(call[1].get("old_string", "")))
                      if n not in _KEEP}
    return sorted(names)


_EDIT_CODE = ("old_string", "new_string")
"""The arguments of an ``edit_file`` call that hold code."""


def _renamed_turn(body: str, rename: Callable[[str], str]) -> str:
    """A model turn with the code strings of its ``edit_file`` call renamed in place (as JSON
    strings, so escapes stay valid and the rest of the turn's text is untouched); any other turn
    as it is."""
    call = _call(body)
    if call is None or call[0] != "edit_file":
        return body
    for key in _EDIT_CODE:
        value = call[1].get(key)
        if isinstance(value, str):
            body = body.replace(json.dumps(value), json.dumps(rename(value)), 1)
    return body


def _renamed_message(msg: Message, rename: Callable[[str], str]) -> Message:
    """A chat message renamed as its turn is: user and tool contents, and the code strings of
    an assistant's ``edit_file`` calls."""
    if msg.get("role") in ("user", "tool") and "content" in msg:
        return {**msg, "content": rename(msg["content"])}
    calls = msg.get("tool_calls")
    if not calls:
        return msg
    out = []
    for call in calls:
        fn = call.get("function", {})
        if fn.get("name") == "edit_file":
            with contextlib.suppress(ValueError, TypeError, AttributeError):  # broken: left as is
                args = json.loads(fn["arguments"])
                fn = {**fn, "arguments": json.dumps({
                    k: rename(v) if k in _EDIT_CODE and isinstance(v, str) else v
                    for k, v in args.items()}, ensure_ascii=False)}
        out.append({**call, "function": fn})
    return {**msg, "tool_calls": out}


def _renamed(demo: Trajectory, fmt: ChatFormat, rng: random.Random, pool: Sequence[str]
             ) -> Trajectory | None:
    """``demo`` (one segment) with its edited names renamed (module docstring), or None when it
    edits no name. Only code is renamed: the contents of user and tool messages and the strings
    of ``edit_file`` calls, never the system prompt, a role header or a call's JSON keys. Context
    and model turns are re-encoded piece by piece, as the harness encodes them, so the loss stays
    on the model's turns alone."""
    seg, = demo.segments
    names = _edited_names(fmt, seg)
    if not names:
        return None
    decode = partial(fmt.tokenizer.decode, skip_special_tokens=False,
                     clean_up_tokenization_spaces=False)
    taken = set(_IDENT.findall(decode(list(seg.token_ids_T))))
    rename = _renamer({n: _fresh(rng, pool, taken) for n in names}, code=True)

    def rename_context(text: str) -> str:
        head, *blocks = text.split("<|im_start|>")
        out = [head]
        for block in blocks:
            role, nl, rest = block.partition("\n")
            body, end, tail = rest.partition("<|im_end|>")
            out.append(role + nl + (rename(body) if role in ("user", "tool") else body) + end + tail)
        return "<|im_start|>".join(out)

    cuts = sorted({0, len(seg.token_ids_T), *(i for turn in seg.model_turns() for i in turn)})
    ids: list[int] = []
    mask: list[int] = []
    versions: list[int] = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        piece = list(seg.token_ids_T[a:b])
        if seg.loss_mask_T[a]:
            new = fmt.encode(_renamed_turn(fmt.decode(piece), rename))
            new += [fmt.eot_id] if piece[-1] == fmt.eot_id else []
        else:
            new = fmt.encode(rename_context(decode(piece)))
        ids += new
        mask += [seg.loss_mask_T[a]] * len(new)
        versions += [seg.policy_version_T[a]] * len(new)
    return dataclasses.replace(
        demo, task_id=f"{demo.task_id}/renamed",
        messages=tuple(_renamed_message(m, rename) for m in demo.messages),
        segments=(Segment(tuple(ids), (0.0,) * len(ids), tuple(mask), tuple(versions)),),
        metadata={**demo.metadata, "renamed": " ".join(names)})


def renamed_demos(demos: Sequence[Trajectory], tok: Any, *, share: float, seed: int = 0
                  ) -> list[Trajectory]:
    """``demos`` with a ``share`` of those that edit a name replaced by renamed copies (module
    docstring; ``metadata["renamed"]`` lists the names, space-separated); the others, and slip
    demos (their broken spans are token positions), as they are, in order."""
    if share <= 0:
        return list(demos)
    fmt = ChatFormat(tok)
    pool = _tool_pool(fmt.decode(list(s.token_ids_T)) for d in demos for s in d.segments)
    rng = random.Random(seed)
    return [(_renamed(d, fmt, rng, pool) or d) if rng.random() < share and "slip" not in d.metadata
            else d for d in demos]
