"""The trajectory pages: a filterable list of a trajectory file and the viewer of one trajectory.

    html = trajectory_list(items, file="train", href=lambda n: f".../{n}", flt=Filter(step=3))
    html = trajectory_view(traj, tokenizer, prev_href=None, next_href=".../4")

The viewer shows what the agent did and how it was judged: the messages (assistant text, each
tool call with its arguments, each tool result), the final diff, the reward terms and total, the
hacking/behaviour flags, the counters, and every token of every segment coloured by who wrote it:
grey for prompt and tool output (loss mask 0), one colour per policy version for sampled tokens
(a trajectory that crossed a weight update mid-rollout shows two colours); hovering a token shows
its id, version and logprob. Everything from the record is escaped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from looprl.dashboard.data import TrajSummary, fmt
from looprl.dashboard.render import esc, link, problems, table
from looprl.harness.hinted import turn_messages
from looprl.types import HintSpan, Message, Segment, Trajectory

PAGE_SIZE = 100
MAX_TOKENS = 40_000
"""Tokens drawn per trajectory (beyond it the viewer says how many it left out)."""
LONG_TEXT = 1_500
"""Message contents longer than this start folded."""
LONG_CONTEXT = 300
"""Runs of prompt / tool-output tokens longer than this start folded (the system prompt and tool
schemas come first in every segment)."""
VERSION_COLORS = ("#2f6fde", "#d9480f", "#2b8a3e", "#ae3ec9", "#e8590c", "#0b7285", "#c2255c",
                  "#5c940d")


@dataclass(frozen=True)
class Filter:
    """What the list shows: a training step, a task (substring), a flag, passed or failed."""

    step: int | None = None
    task: str = ""
    flag: str = ""
    passed: bool | None = None
    page: int = 0

    def keep(self, s: TrajSummary) -> bool:
        return ((self.step is None or s.step == self.step)
                and (not self.task or self.task in s.task_id)
                and (not self.flag or self.flag in s.flags)
                and (self.passed is None or s.passed == self.passed))


def trajectory_list(items: Sequence[TrajSummary], file: str, href: Callable[[int], str],
                    flt: Filter, page_href: Callable[[int], str], notes: Sequence[str] = ()) -> str:
    kept = [s for s in items if flt.keep(s)]
    pages = max(1, -(-len(kept) // PAGE_SIZE))
    page = min(max(flt.page, 0), pages - 1)
    shown = kept[page * PAGE_SIZE:(page + 1) * PAGE_SIZE]
    flags = sorted({f for s in items for f in s.flags})
    steps = any(s.step is not None for s in items)
    rows = []
    for s in shown:
        badge = '<span class="pass">pass</span>' if s.passed else '<span class="fail">fail</span>'
        rows.append([link(href(s.n), f"#{s.n}"), *([esc(fmt(s.step))] if steps else []),
                     esc(s.task_id), badge, esc(fmt(s.reward)), esc(s.stop_reason),
                     str(s.turns), str(s.tool_calls), str(s.broken_tool_calls),
                     str(s.output_tokens), esc(",".join(map(str, s.versions))),
                     " ".join(f'<span class="flag">{esc(f)}</span>' for f in s.flags)])
    head = ["#", *(["step"] if steps else []), "task", "tests", "reward", "stop", "turns",
            "tool calls", "broken", "output tokens", "versions", "flags"]
    opt = "".join(f'<option value="{esc(f)}"{" selected" if f == flt.flag else ""}>{esc(f)}</option>'
                  for f in flags)
    passed = {None: "", True: "pass", False: "fail"}[flt.passed]
    form = (
        '<form method="get" class="filters">'
        + (f'<label>step <input name="step" size="5" value="{esc(fmt(flt.step)) if flt.step is not None else ""}"></label>'
           if steps else "")
        + f'<label>task <input name="task" value="{esc(flt.task)}"></label>'
        f'<label>flag <select name="flag"><option value="">any</option>{opt}</select></label>'
        '<label>tests <select name="passed">'
        + "".join(f'<option value="{v}"{" selected" if v == passed else ""}>{v or "any"}</option>'
                  for v in ("", "pass", "fail"))
        + '</select></label><button type="submit">filter</button></form>')
    nav = ""
    if pages > 1:
        nav = '<p class="pages">' + " ".join(
            f"<strong>{p + 1}</strong>" if p == page else link(page_href(p), str(p + 1))
            for p in range(pages)) + "</p>"
    return (f"<section><h2>trajectories — {esc(file)}</h2>{problems(notes)}"
            f'<div class="muted">{len(kept)} of {len(items)} shown by the filter</div>{form}'
            + table(head, rows, "trajs") + nav + "</section>")


def _text_block(text: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    if len(text) <= LONG_TEXT:
        return f"<pre{c}>{esc(text)}</pre>"
    first = text[:200].replace("\n", " ")
    return (f"<details><summary>{esc(first)}… ({len(text):,} characters)</summary>"
            f"<pre{c}>{esc(text)}</pre></details>")


def _arguments(raw: str) -> tuple[str, bool]:
    """Pretty arguments and whether they parsed as a JSON object."""
    try:
        obj = json.loads(raw)
    except (ValueError, TypeError):
        return raw, False
    return json.dumps(obj, indent=2, ensure_ascii=False), isinstance(obj, dict)


def hint_html(i: int, h: HintSpan) -> str:
    """The hint a hinted continuation inserted (``harness.hinted``): not a model turn, and not
    the task's prompt either: where it sits, what kind, and that it is context only."""
    kind = f" · {esc(h.kind.replace('_', ' '))}" if h.kind else ""
    return (f'<div class="msg hint" id="m{i}"><div class="head"><span class="role">hint</span>'
            f"{kind} · inserted after turn {h.turn} · context, never trained</div>"
            f"{_text_block(h.text)}</div>")


def hint_index(t: Trajectory) -> int | None:
    """Where ``t``'s hint message is: right after turn ``hint.turn``'s tool results."""
    h = t.hint
    turns = turn_messages(t.messages)
    if h is None or not 1 <= h.turn <= len(turns):
        return None
    i = turns[h.turn - 1][1]
    m = t.messages[i] if i < len(t.messages) else {}
    return i if m.get("role") == "user" and m.get("content") == h.text else None


def message_html(i: int, m: Message) -> str:
    role = str(m.get("role", "?"))
    parts = [f'<div class="msg {esc(role)}" id="m{i}"><div class="head"><span class="role">{esc(role)}</span>']
    if role == "tool":
        parts.append(f' · {esc(str(m.get("name", "")))} · result of '
                     f'<code>{esc(str(m.get("tool_call_id", "")))}</code>')
    parts.append("</div>")
    content = m.get("content") or ""
    if content:
        parts.append(_text_block(str(content)))
    for call in m.get("tool_calls") or []:
        fn = call.get("function") or {}
        args, ok = _arguments(str(fn.get("arguments", "")))
        bad = "" if ok else ' <span class="flag">arguments are not a JSON object</span>'
        parts.append(f'<div class="call"><div class="head">tool call <code>{esc(str(call.get("id", "")))}'
                     f'</code> · <strong>{esc(str(fn.get("name", "")))}</strong>{bad}</div>'
                     f"{_text_block(args, 'args')}</div>")
    return "".join(parts) + "</div>"


def diff_html(diff: str) -> str:
    if not diff.strip():
        return '<p class="muted">no change to the workspace</p>'
    lines = []
    for line in diff.splitlines():
        cls = ("meta" if line.startswith(("diff ", "+++", "---", "index ")) else
               "hunk" if line.startswith("@@") else
               "add" if line.startswith("+") else "del" if line.startswith("-") else "")
        lines.append(f'<span class="{cls}">{esc(line)}</span>' if cls else esc(line))
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def reward_html(t: Trajectory) -> str:
    r = t.reward
    if r is None:
        why = t.error or "not scored"
        return problems([f"no reward: {why}"], "error" if t.is_infra_error else "problem")
    rows = [[esc(k), f'<span class="{"neg" if v < 0 else "pos" if v > 0 else ""}">{esc(fmt(v))}</span>']
            for k, v in sorted(r.components.items(), key=lambda kv: -abs(kv[1]))]
    rows.append(["<strong>total</strong>", f"<strong>{esc(fmt(r.total))}</strong>"])
    flags = (" ".join(f'<span class="flag">{esc(f)}</span>' for f in r.flags)
             if r.flags else '<span class="muted">none</span>')
    details = table(["detail", "value"], [[esc(k), esc(fmt(v))] for k, v in r.details.items()])
    return (table(["term", "value"], rows, "reward") + f"<p>flags: {flags}</p>"
            + f"<details><summary>grading details ({len(r.details)})</summary>{details}</details>")


def _piece(tokenizer: Any, cache: dict[int, str], tid: int) -> str:
    if tid not in cache:
        cache[tid] = tokenizer.decode([tid], skip_special_tokens=False) if tokenizer else f"[{tid}]"
    return cache[tid]


def _fold(context: list[str]) -> str:
    """A run of prompt / tool-output tokens; a long one starts folded."""
    if len(context) <= LONG_CONTEXT:
        return "".join(context)
    return (f"<details><summary>{len(context):,} prompt / tool-output tokens</summary>"
            f"{''.join(context)}</details>")


def _segment_spans(s: Segment, budget: int, tokenizer: Any, cache: dict[int, str],
                   color: dict[int, str], hint: range = range(0)) -> str:
    """The tokens; those in ``hint`` (the hinted observation's span) are marked as the hint's."""
    out: list[str] = []
    context: list[str] = []
    for i, (tid, lp, m, v) in enumerate(zip(s.token_ids_T[:budget], s.logprobs_T, s.loss_mask_T,
                                            s.policy_version_T, strict=False)):
        piece = esc(_piece(tokenizer, cache, tid))
        if m:
            out.append(_fold(context))
            context = []
            out.append(f'<span class="tok" style="--v:{color[v]}" title="id {tid} · v{v} · '
                       f'logprob {lp:.3f}">{piece}</span>')
        elif i in hint:  # never folded: the hint is what this trajectory is about
            if i == hint.start:
                out.append(_fold(context))
                context = []
            out.append(f'<span class="tok ctx hint" title="id {tid} · hint">{piece}</span>')
        else:
            context.append(f'<span class="tok ctx" title="id {tid}">{piece}</span>')
    return "".join(out) + _fold(context)


def tokens_html(segments: Sequence[Segment], tokenizer: Any, hint: HintSpan | None = None) -> str:
    """Every token of every segment, coloured by loss mask and policy version; a hinted
    continuation's hint span (its one segment) marked apart."""
    versions = sorted({v for s in segments for v, m in zip(s.policy_version_T, s.loss_mask_T,
                                                          strict=True) if m})
    color = {v: VERSION_COLORS[i % len(VERSION_COLORS)] for i, v in enumerate(versions)}
    counts = {v: sum(1 for s in segments for x, m in zip(s.policy_version_T, s.loss_mask_T,
                                                         strict=True) if m and x == v)
              for v in versions}
    legend = ('<div class="legend"><span class="tok ctx">prompt / tool output (not trained)</span>'
              + ('<span class="tok ctx hint">tool output + hint (inserted, not trained)</span>'
                 if hint is not None else "")
              + "".join(f'<span class="tok" style="--v:{color[v]}">sampled by policy v{v} · '
                        f"{counts[v]} tokens</span>" for v in versions) + "</div>")
    cache: dict[int, str] = {}
    budget = MAX_TOKENS
    out = [legend]
    if tokenizer is None:
        out.append(problems(["no tokenizer found in the run (model_rl/, model_start/ or "
                             "model.path): tokens are shown as ids"]))
    for k, s in enumerate(segments):
        n = len(s.token_ids_T)
        out.append(f"<h4>segment {k + 1} of {len(segments)} · {n:,} tokens · "
                   f"{s.num_model_tokens:,} sampled</h4>")
        span = range(hint.start, hint.end) if hint is not None and k == 0 else range(0)
        spans = _segment_spans(s, budget, tokenizer, cache, color, span)
        out.append(f'<div class="tokens">{spans}</div>')
        if n > budget:
            out.append(problems([f"{n - budget:,} more tokens of this segment not drawn"]))
        budget = max(0, budget - n)
    return "".join(out)


def trajectory_view(t: Trajectory, tokenizer: Any, *, title: str,
                    prev_href: str | None, next_href: str | None, list_href: str) -> str:
    c = t.counters
    nav = " · ".join(x for x in (link(list_href, "all trajectories"),
                                 link(prev_href, "← previous") if prev_href else "",
                                 link(next_href, "next →") if next_href else "") if x)
    step = t.metadata.get("train_step")
    facts = [("task", t.task_id), ("trajectory", t.id), ("group", t.group_id),
             ("train step", step), ("hinted from", t.metadata.get("hinted_from")),
             ("stop", t.stop_reason.value), ("wall s", round(t.wall_s, 2))]
    head = " · ".join(f"{k} <strong>{esc(fmt(v))}</strong>" for k, v in facts if v not in (None, ""))
    counters = "".join(f'<div class="card"><div class="k">{esc(k.replace("_", " "))}</div>'
                       f'<div class="v">{v}</div></div>' for k, v in c.to_dict().items())
    err = problems([t.error], "error") if t.error else ""
    at = hint_index(t)
    msgs = "".join(hint_html(i, t.hint) if i == at and t.hint is not None else message_html(i, m)
                   for i, m in enumerate(t.messages))
    return (f'<section class="traj"><h2>{esc(title)}</h2><p>{nav}</p><p>{head}</p>{err}'
            f'<div class="cards">{counters}</div></section>'
            f'<div class="split"><section><h2>messages ({len(t.messages)})</h2>{msgs}</section>'
            f"<div><section><h2>reward</h2>{reward_html(t)}</section>"
            f"<section><h2>diff</h2>{diff_html(t.diff)}</section></div></div>"
            f"<section><h2>tokens</h2>{tokens_html(t.segments, tokenizer, t.hint)}</section>")
