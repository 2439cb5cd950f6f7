"""A real-time loop run's page section (``looprl feedback loop``'s run directory): the result
line as cards, one row per cycle, the final A/B; read from the files the loop writes
(``cycles.jsonl``, ``final_ab.json``, ``result.txt``), nothing recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from looprl.dashboard.data import RunData
from looprl.dashboard.render import (
    ARM_COLS,
    NO_KEPT,
    ago,
    cards,
    ci,
    esc,
    fmt,
    interval,
    link,
    problems,
    table,
)

RESULT_CARDS = (("cycles", "cycles"), ("sessions", "sessions"), ("kept B − A", "kept_delta"),
                ("kept B − A 95% CI", "kept_ci"), ("kept within requests B − A", "kept_within"),
                ("resolved B − A", "resolved"), ("edited B − A", "edited_delta"),
                ("dissatisfied B − A", "dissatisfied_delta"),
                ("latency B − A (s)", "latency_delta"), ("rollback ok", "rollback_ok"),
                ("lost sessions", "lost"), ("trained twice", "trained_twice"))
"""A loop's ``result.txt`` figures (``feedback.loop.LoopResult.line``) as cards."""
STATUS_LABELS = {"promoted": "promoted", "rolled_back": "rolled back", "rejected": "rejected",
                 "no_update": "no update", "skipped": "skipped"}
"""``CycleRow.status`` -> what the page says (the CSS class is the status itself)."""


def status_badge(status: str) -> str:
    return f'<span class="status {esc(status)}">{esc(STATUS_LABELS.get(status, status))}</span>'


def _f3(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "—"


def _hints_note(window: dict[str, Any], train: dict[str, Any]) -> str:
    """What a window's follow-ups gave as hints (``feedback.follow_ups``), when they were on."""
    if "follow_up_hints" not in window:
        return ""
    return (f'<div class="muted hints">{esc(fmt(window["follow_up_hints"]))} follow-ups as hints'
            f' · {esc(fmt(window.get("hinted")))} continued · {esc(fmt(train.get("hints")))}'
            f' distilled, hint KL {esc(_f3(train.get("hint_kl")))}</div>')


def cycles_table(cycles: Sequence[dict[str, Any]]) -> str:
    """One row per finished cycle, from ``cycles.jsonl`` as the loop wrote it."""
    rows = []
    for c in cycles:
        cand = c.get("candidate_version")
        w, g, ab = c.get("window") or {}, c.get("gate") or {}, c.get("ab") or {}
        if g.get("pass1_current") is not None:
            gate = (f"{_f3(g.get('pass1_current'))} → {_f3(g.get('pass1_candidate'))}"
                    f'<div class="muted">diff CI {esc(ci(g.get("ci_low"), g.get("ci_high")))}'
                    f' · {esc(str(g.get("n_tasks", "?")))} tasks</div>')
        else:
            gate = esc(g.get("reason") or "—")
        d = (ab.get("diffs") or {}).get("reward") or {}
        arms = ab.get("arms") or {}
        kept = (f"{_f3((arms.get('A') or {}).get('kept'))} → "
                f"{_f3((arms.get('B') or {}).get('kept'))}" if arms else "—")
        rows.append([
            esc(str(c.get("cycle"))) + (' <span class="muted">(noise)</span>'
                                        if c.get("injected") else ""),
            f"v{esc(str(c.get('policy_version')))} → "
            + ("—" if cand is None else f"v{esc(str(cand))}"),
            f'{status_badge(str(c.get("status", "")))}<div class="reason">'
            f'{esc(str(c.get("reason", "")))}</div>',
            esc(fmt(w.get("sessions"))) + _hints_note(w, c.get("train") or {}),
            esc(_f3(w.get("mean_reward"))), gate,
            esc(interval(d.get("diff"), d.get("lo"), d.get("hi"))), esc(kept)])
    return table(["cycle", "current → candidate", "status", "window sessions",
                  "window mean reward", "gate pass@1 current → candidate",
                  "A/B reward B − A [95% CI]", "A/B kept A → B"], rows, "cycles")


def final_ab_table(final: dict[str, Any]) -> str:
    """The final A/B (start vs last promoted policy): each arm's means, B − A with its 95%
    bootstrap interval (``final_ab.json``, ``ABReport.to_dict``)."""
    arms, diffs = final.get("arms") or {}, final.get("diffs") or {}
    versions = {"A": final.get("a"), "B": final.get("b")}
    rows = []
    for a in sorted(arms):
        m = arms[a] or {}
        rows.append([esc(a), "—" if versions.get(a) is None else f"v{esc(str(versions[a]))}",
                     *(esc(fmt(m.get(col)) if col in ("sessions", "scored") else _f3(m.get(col)))
                       for col in ARM_COLS)])
    diff_row = ["<strong>B − A</strong>", "", "", ""]
    for col in ARM_COLS[2:]:
        d = diffs.get(col) or {}
        diff_row.append(f"<strong>{esc(interval(d.get('diff'), d.get('lo'), d.get('hi')))}"
                        "</strong>")
    head = ["arm", "version", *ARM_COLS[:-1], "latency (s)"]
    return table(head, [*rows, diff_row], "final-ab")


def loop_section(run: RunData, prefix: str, *, title_href: str | None = None) -> str:
    """A real-time loop run: the result line as cards, the cycles, the final A/B."""
    title = link(title_href, run.name) if title_href else esc(run.name)
    n = len(run.cycles)
    parts = [f'<section id="{esc(prefix)}" data-live><h2>real-time RL loop — {title}</h2>'
             f'<div class="muted">{esc(str(run.path))} · {n} cycle{"s" * (n != 1)} finished'
             f" · updated {esc(ago(run.mtime))}</div>{problems(run.problems)}"]
    if run.result is not None:
        r = run.result
        values: dict[str, Any] = {**r, "kept_ci": ci(r.get("kept_ci_low"), r.get("kept_ci_high"))}
        for k in ("resolved", "kept_within"):  # B − A with its interval
            if r.get(f"{k}_delta") is not None:
                values[k] = interval(r[f"{k}_delta"], r.get(f"{k}_ci_low"), r.get(f"{k}_ci_high"))
        for k in ("kept_delta", "edited_delta", "dissatisfied_delta", "latency_delta"):
            if k in r:  # signed, as every B − A on this page
                values[k] = interval(r[k], None, None)
        if "rollback_ok" in r:  # None: no bad candidate was injected
            ok = r["rollback_ok"]
            values["rollback_ok"] = "— (none injected)" if ok is None else "yes" if ok else "NO"
        src = ("the final A/B" if run.final_ab else
               f"cycle {run.cycles[-1].get('cycle')}'s A/B (no final A/B ran)" if run.cycles
               else "the last A/B")
        no_kept = f" · kept —: {NO_KEPT}" if r.get("kept_delta") is None else ""
        parts.append(f"<h3>result</h3>{cards(values, RESULT_CARDS)}"
                     f'<div class="muted">result.txt; B − A of {esc(src)}, 95% bootstrap '
                     "interval; rollback ok: the injected bad candidate was not promoted"
                     f"{esc(no_kept)}</div>")
    else:
        parts.append(f'<div class="note">running: cycle {n + 1} is under way, or the loop stopped '
                     "before its end (see the time of the last update). cycles.jsonl gets a line "
                     "as each cycle ends; result.txt and report.md come at the end.</div>")
    if run.cycles:
        parts.append(f"<h3>cycles</h3>{cycles_table(run.cycles)}")
    if run.final_ab:
        fa = run.final_ab
        parts.append(f"<h3>final A/B: start v{esc(str(fa.get('a', '?')))} (A) vs "
                     f"v{esc(str(fa.get('b', '?')))} (B)</h3>{final_ab_table(fa)}"
                     '<div class="muted">arm means over scored sessions; B − A with its 95% '
                     "bootstrap interval (report.md below has each arm's own interval)</div>")
    return "".join(parts) + "</section>"
