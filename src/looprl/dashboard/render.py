"""HTML for the dashboard: pure functions from records (``data.py``) to markup.

    html = page("looprl", [runs_table(runs, link), *run_charts(run, "r0")], assets=SERVED)
    chart_html(Chart("mean reward", steps, {"reward": ys}, skipped=(3,)), "r0-0")

Charts are interactive (uPlot, vendored under ``static/``: zoom by dragging, double-click to
reset, click a legend entry to hide a line, a shared cursor across a page's charts). Each chart is
a ``<div data-chart=ID>`` and its data a ``<script type="application/json" id=ID>`` block that
``static/dashboard.js`` draws; missing values are JSON ``null`` and drawn as gaps, skipped steps
as grey bands. The live server links the scripts (``assets=SERVED``); an export inlines them
(``assets=INLINE``) with a Content-Security-Policy that allows exactly those scripts, so the file
is self-contained and works offline.

Escaping: every string from a file or a server goes through ``html.escape``; JSON data blocks are
written with ``<``, ``>`` and ``&`` as ``\\u`` escapes, so no run data can close a script element.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.dashboard.data import (
    TRAINED_ONLY,
    FeedbackData,
    FleetData,
    RunData,
    flatten,
    fmt,
    metric_value,
    metric_values,
    numeric_keys,
    step_skipped,
)
from looprl.dashboard.markdown import ImageResolver, markdown
from looprl.rundir import eval_name

STATIC = Path(__file__).parent / "static"
SCRIPTS = ("uPlot.iife.min.js", "dashboard.js")
STYLES = ("uPlot.min.css", "style.css")
SERVED, INLINE = "served", "inline"

# (title, metric keys); "reward/*" expands to every reward term but the total, another "x*" to
# every key starting with x.
TRAINING_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mean reward", ("reward/total_mean",)),
    ("pass rate (hidden tests)", ("rollout/pass_rate",)),
    ("reward terms (mean)", ("reward/*",)),
    ("IS ratio trainer/engine", ("train/is_ratio_mean", "train/is_ratio_max")),
    ("loss", ("train/loss",)),
    ("grad norm", ("train/grad_norm",)),
    ("KL to reference (mean)", ("train/kl_mean",)),
    ("broken tool calls / call", ("broken_call_rate",)),
    ("groups without reward variance", ("train/zero_variance_groups", "train/no_pass_groups")),
    ("staleness (versions behind)", ("train/mean_staleness",)),
    ("train-inference KL (engine || trainer)", ("train/engine_kl",)),
    ("tokens with engine/trainer logprobs apart", ("train/engine_mismatch_frac",)),
    ("MoE router disagreement with the engine, per layer",
     ("train/router_disagree", "train/router_disagree_l*")),
    ("MoE load-balancing loss", ("train/moe_aux_loss",)),
)
HINT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hinted continuations distilled", ("train/hints",)),
    ("hint KL (teacher with hint || student without)", ("train/hint_kl",)),
    ("hinted continuations' pass rate", ("train/hint_pass_rate",)),
)
"""Targeted textual feedback (``grpo.experimental.feedback``): drawn once a step distilled one."""
HINT_CARDS = (("hints", "train/hints"), ("hint KL", "train/hint_kl"),
              ("hint pass rate", "train/hint_pass_rate"))
THROUGHPUT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("throughput (tokens/s)", ("rollout/tokens_per_s", "train/tokens_per_s")),
    ("trainer idle fraction", ("loop/trainer_idle_fraction",)),
    ("schedule: trainer and engine busy / idle, overlap per step (s)",
     ("loop/trainer_busy_s", "loop/trainer_idle_s", "loop/engine_busy_s", "loop/engine_idle_s",
      "loop/overlap_s")),
    ("groups stale / dropped / screened out, infra errors",
     ("loop/groups_stale", "loop/groups_dropped", "loop/groups_screened_out",
      "runner/infra_errors")),
    ("weight publish (s)", ("loop/publish_s",)),
)
COMPARE_METRICS = (("mean reward", "reward/total_mean"), ("pass rate", "rollout/pass_rate"),
                   ("loss", "train/loss"), ("IS ratio (mean)", "train/is_ratio_mean"),
                   ("grad norm", "train/grad_norm"), ("broken tool calls / call", "broken_call_rate"),
                   ("rollout tokens/s", "rollout/tokens_per_s"),
                   ("trainer idle fraction", "loop/trainer_idle_fraction"))
OVERVIEW_METRICS = COMPARE_METRICS[:4]
TRAINING_CARDS = (("step", "step"), ("reward", "reward/total_mean"),
                  ("pass rate", "rollout/pass_rate"), ("IS ratio", "train/is_ratio_mean"),
                  ("loss", "train/loss"), ("KL", "train/kl_mean"),
                  ("broken calls", "broken_call_rate"), ("elapsed (min)", "elapsed_s"))
THROUGHPUT_CARDS = (("rollout tok/s", "rollout/tokens_per_s"), ("train tok/s", "train/tokens_per_s"),
                    ("trainer idle", "loop/trainer_idle_fraction"), ("schedule", "loop/schedule"),
                    ("groups stale", "loop/groups_stale"), ("groups dropped", "loop/groups_dropped"),
                    ("infra errors", "runner/infra_errors"))
POOL_CARDS = (("busy", "busy"), ("idle", "idle"), ("warm", "warm"), ("queued", "queued"),
              ("max running", "max_running"), ("exec p50 ms", "exec_p50_ms"),
              ("exec p95 ms", "exec_p95_ms"), ("execs", "execs_total"), ("leases", "leases_total"),
              ("warm hits", "warm_hits_total"), ("expired", "expired_total"),
              ("sandbox errors", "errors_total"))
POOL_SERIES = ("busy", "idle", "warm", "queued")
ARM_COLS = ("sessions", "scored", "reward", "resolved", "edited", "kept", "reverted", "dissatisfied",
            "latency")
SMALL_SAMPLE = 30
"""Scored sessions per arm below which an A/B interval is flagged as unreliable (a bootstrap
over a handful of sessions is far too narrow, and 1 session gives no spread at all)."""

esc = html.escape


# -- charts ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Chart:
    """One chart: x values, one line per label (None = a gap), grey bands at ``skipped`` x."""

    title: str
    x: list[float]
    series: dict[str, list[float | None]]
    skipped: tuple[float, ...] = ()
    xlabel: str = "step"
    unit_range: bool = False
    """The y axis spans at least [0, 1] (rates and fractions)."""


RATES = frozenset({"rollout/pass_rate", "broken_call_rate", "loop/trainer_idle_fraction",
                   "train/hint_pass_rate",
                   "train/clip_fraction", "trajectories_with_broken_calls"})


def json_block(obj: Any) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</script>``, no ``<!--``).

    >>> json_block({"t": "</script><b>&"})
    '{"t": "\\\\u003c/script\\\\u003e\\\\u003cb\\\\u003e\\\\u0026"}'
    """
    text = json.dumps(obj, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def chart_html(chart: Chart, cid: str) -> str:
    data = {"title": chart.title, "x": chart.x, "xlabel": chart.xlabel,
            "series": [{"label": k, "values": v} for k, v in chart.series.items()],
            "skipped": list(chart.skipped), "unit": chart.unit_range}
    return (f'<figure class="chart" data-chart="{esc(cid)}"><figcaption>{esc(chart.title)}'
            f'</figcaption></figure><script type="application/json" id="{esc(cid)}">'
            f"{json_block(data)}</script>")


def charts_grid(charts: Sequence[Chart], prefix: str) -> str:
    if not charts:
        return ""
    return ('<div class="charts">' + "".join(chart_html(c, f"{prefix}-{i}")
                                             for i, c in enumerate(charts)) + "</div>")


def _expand(keys: Sequence[str], present: list[str]) -> list[str]:
    out = []
    for k in keys:
        if k == "reward/*":
            out += [p for p in present if p.startswith("reward/") and p != "reward/total_mean"]
        elif k.endswith("*"):
            out += [p for p in present if p.startswith(k[:-1])]
        elif k in present:
            out.append(k)
    return out


def _short(key: str) -> str:
    """A legend label: ``reward/length_mean`` -> ``length``; other keys stay whole."""
    if key.startswith("reward/") and key.endswith("_mean"):
        return key[len("reward/"):-len("_mean")]
    return key


def run_charts(rows: Sequence[dict[str, Any]],
               panels: Sequence[tuple[str, Sequence[str]]]) -> list[Chart]:
    """Charts of one run; panels whose keys never appear are left out."""
    present = numeric_keys(rows)
    xs = [float(r["step"]) for r in rows]
    skipped = tuple(float(r["step"]) for r in rows if step_skipped(r))
    out = []
    for title, keys in panels:
        ks = _expand(keys, present)
        if ks:
            out.append(Chart(title, xs, {_short(k) if len(ks) > 1 else k: metric_values(rows, k)
                                         for k in ks}, skipped, unit_range=set(ks) <= RATES))
    return out


def compare_charts(runs: Sequence[RunData], metrics: Sequence[tuple[str, str]]) -> list[Chart]:
    """One chart per metric, one line per run, on the union of their steps."""
    steps = sorted({float(r["step"]) for run in runs for r in run.rows})
    out = []
    for title, key in metrics:
        lines = {}
        for run in runs:
            by_step = {float(r["step"]): metric_value(r, key) for r in run.rows}
            if any(v is not None for v in by_step.values()):
                lines[run.name] = [by_step.get(s) for s in steps]
        if lines:
            out.append(Chart(title, steps, lines, unit_range=key in RATES))
    return out


# -- small pieces ---------------------------------------------------------------------------------

def cards(values: dict[str, Any], spec: Sequence[tuple[str, str]]) -> str:
    items = []
    for label, key in spec:
        if key not in values:
            continue
        v = values[key]
        if key == "elapsed_s" and isinstance(v, (int, float)):
            v = v / 60
        items.append(_card(label, fmt(v), key))
    return f'<div class="cards" data-live>{"".join(items)}</div>' if items else ""


def _card(label: str, value: str, title: str, note: str = "") -> str:
    n = f'<div class="n">{esc(note)}</div>' if note else ""
    return (f'<div class="card" title="{esc(title)}"><div class="k">{esc(label)}</div>'
            f'<div class="v">{esc(value)}</div>{n}</div>')


def card_value(run: RunData, key: str) -> tuple[Any, int | None]:
    """A card's figure: the last step's, or for a trainer-side metric the newest step that
    trained (with that step)."""
    if key in TRAINED_ONLY:
        return run.latest(key)
    v = run.last.get(key)
    return (v / 60 if key == "elapsed_s" and isinstance(v, (int, float)) else v), run.last.get("step")


def run_cards(run: RunData) -> str:
    """The last step's figures; a trainer-side figure from the newest step that trained."""
    last = run.last
    items = []
    for label, key in TRAINING_CARDS:
        if key not in last:
            continue
        v, step = card_value(run, key)
        note = f"step {step}" if step is not None and step != last.get("step") else ""
        items.append(_card(label, fmt(v), key, note))
    return f'<div class="cards" data-live>{"".join(items)}</div>' if items else ""


def problems(msgs: Sequence[str], cls: str = "problem") -> str:
    return "".join(f'<div class="{cls}">{esc(m)}</div>' for m in msgs)


def table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """A table of already-escaped cells."""
    c = f' class="{cls}"' if cls else ""
    return (f"<table{c}><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{x}</td>" for x in r) + "</tr>" for r in rows)
            + "</table>")


def interval(diff: Any, lo: Any, hi: Any) -> str:
    """A difference and its 95% interval, signed (the loop's report writes them so too).

    >>> interval(-0.4349, -0.9253, 0.0753), interval(None, None, None), interval(0.1, None, None)
    ('-0.435 [-0.925, +0.075]', '—', '+0.100')
    """
    if not isinstance(diff, (int, float)):
        return "—"
    return f"{diff:+.3f}" + (f" {ci(lo, hi)}" if ci(lo, hi) != "—" else "")


def ci(lo: Any, hi: Any) -> str:
    """``[lo, hi]`` of a 95% interval, signed; ``—`` when an end is missing."""
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
        return "—"
    return f"[{lo:+.3f}, {hi:+.3f}]"


def link(href: str, text: str) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def ago(t: float) -> str:
    """Seconds since ``t`` as a person says it.

    >>> now = time.time(); ago(now - 5), ago(now - 300), ago(now - 7200)
    ('5 s ago', '5 min ago', '2.0 h ago')
    """
    s = max(0.0, time.time() - t)
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.1f} h ago"


def skipped_note(run: RunData) -> str:
    skipped = run.skipped_steps
    if not skipped:
        return ""
    return (f'<div class="note" data-live>{len(skipped)} of {len(run.rows)} steps trained on no '
            "token (every group of the batch had the same reward: nothing to learn from). Their "
            "loss, IS ratio, KL and grad norm are not measured: gaps on grey bands, not 0.</div>")


# -- runs -----------------------------------------------------------------------------------------

def _pass1(run: RunData, policy: str) -> float | None:
    e = run.evals.get("held-out functions", {}).get(policy)
    v = (e or {}).get("metrics", {}).get("pass@1")
    return v if isinstance(v, (int, float)) else None


def runs_table(runs: Sequence[RunData], href: Callable[[RunData], str] | None,
               compare_action: str | None = None) -> str:
    """The runs list: one row per run, checkboxes to compare (when served)."""
    head = (["compare"] if compare_action else []) + [
        "run", "kind · status", "steps", "updated", "reward", "pass rate", "skipped steps",
        "held-out pass@1 start → RL", "problems"]
    rows = []
    for run in runs:
        last = run.last
        start, rl = _pass1(run, "start"), _pass1(run, "RL")
        evals = f"{fmt(start)} → {fmt(rl)}" if start is not None or rl is not None else "—"
        name = link(href(run), run.name) if href else esc(run.name)
        box = ([f'<input type="checkbox" name="run" value="{esc(run.name)}"'
                f'{"" if run.is_loop else " checked"}>'] if compare_action else [])
        training = ([str(len(run.rows)), esc(ago(run.mtime)),
                     esc(fmt(last.get("reward/total_mean"))),
                     esc(fmt(last.get("rollout/pass_rate"))), str(len(run.skipped_steps))]
                    if not run.is_loop else ["—", esc(ago(run.mtime)), "—", "—", "—"])
        rows.append(box + [name, loop_status(run) if run.is_loop else train_status(run), *training,
                           esc(evals), str(len(run.problems))])
    msgs = [f"{run.name}: {p}" for run in runs for p in run.problems]
    body = table(head, rows, "runs") + problems(msgs[:10]) + (
        f'<div class="muted">and {len(msgs) - 10} more problems</div>' if len(msgs) > 10 else "")
    if compare_action:
        body = (f'<form method="get" action="{esc(compare_action)}">{body}'
                '<button type="submit">compare selected runs</button></form>')
    return f'<section id="runs" data-live><h2>runs</h2>{body}</section>'


def hint_section(run: RunData, prefix: str) -> str:
    """The targeted-feedback charts and cards, once a step distilled a hinted continuation
    (every step logs ``train/hints``, 0 while the term is off)."""
    if not any(metric_value(r, "train/hints") for r in run.rows):
        return ""
    unmeasured = ("train/hint_kl", "train/hint_pass_rate")  # 0 on a step without hints: a gap
    rows = [r if metric_value(r, "train/hints") else {k: v for k, v in r.items()
                                                      if k not in unmeasured} for r in run.rows]
    return ("<h3>targeted feedback: hinted continuations</h3>" + cards(run.last, HINT_CARDS)
            + charts_grid(run_charts(rows, HINT_PANELS), prefix + "-h"))


def run_section(run: RunData, prefix: str, *, title_href: str | None = None) -> str:
    """Cards, skipped-step note, problems and every training and throughput chart of a run."""
    title = link(title_href, run.name) if title_href else esc(run.name)
    n = len(run.rows)
    return (f'<section id="{esc(prefix)}"><h2>training — {title}</h2>'
            f'<div class="muted" data-live>{esc(str(run.path))} · {n} step{"s" * (n != 1)} logged'
            f" · {train_status(run)} · updated {esc(ago(run.mtime))}</div>"
            f'<div data-live>{problems(run.problems)}</div>{run_cards(run)}{skipped_note(run)}'
            + charts_grid(run_charts(run.rows, TRAINING_PANELS), prefix + "-t")
            + hint_section(run, prefix)
            + "<h3>rollout and trainer throughput</h3>" + cards(run.last, THROUGHPUT_CARDS)
            + charts_grid(run_charts(run.rows, THROUGHPUT_PANELS), prefix + "-p") + "</section>")


def eval_section(run: RunData, task_href: Callable[[str, str], str] | None = None) -> str:
    """Held-out evaluations: start vs RL per metric, and per task (linked to its trajectories)."""
    if not run.evals:
        return ""
    parts = ['<section data-live><h2>held-out evaluation</h2>']
    for group, by_policy in run.evals.items():
        labels = list(by_policy)
        keys = list(dict.fromkeys(k for e in by_policy.values()
                                  for k, v in (e.get("metrics") or {}).items()
                                  if isinstance(v, (int, float))))
        n = next(iter(by_policy.values())).get("n_tasks")
        parts.append(f"<h3>{esc(group)}{f' · {n} tasks' if n else ''}</h3>")
        parts.append(table(["metric", *map(esc, labels)], [
            [esc(k), *(esc(fmt((by_policy[lb].get("metrics") or {}).get(k))) for lb in labels)]
            for k in keys]))
        tasks = list(dict.fromkeys(t for e in by_policy.values() for t in (e.get("per_task") or {})))
        if tasks:
            rows = []
            for t in tasks:
                cells = []
                for lb in labels:
                    pt = (by_policy[lb].get("per_task") or {}).get(t)
                    txt = "—" if pt is None else f"{fmt(pt.get('pass@1'))} ({pt.get('correct', 0)}/{pt.get('n', 0)})"
                    file = eval_name(lb.lower(), packages="packages" in group)
                    cells.append(link(task_href(file, t), txt) if task_href and pt else esc(txt))
                rows.append([esc(t), *cells])
            parts.append(f"<details><summary>per task ({len(tasks)})</summary>"
                         + table(["task", *(f"{esc(lb)} pass@1" for lb in labels)], rows)
                         + "</details>")
    return "".join(parts) + "</section>"


def config_section(config: dict[str, Any] | None) -> str:
    if not config:
        return ""
    rows = [[esc(k), esc(json.dumps(v) if not isinstance(v, str) else v)]
            for k, v in flatten(config).items()]
    return ("<section><h2>resolved config</h2><details><summary>"
            f"{len(rows)} settings (config.json; override any with -o key=value)</summary>"
            + table(["key", "value"], rows, "config") + "</details></section>")


def report_section(run: RunData, image: ImageResolver | None) -> str:
    if not run.report_md:
        return ""
    return f'<section class="report"><h2>report.md</h2>{markdown(run.report_md, image)}</section>'


def trajectories_section(run: RunData, counts: dict[str, int], href: Callable[[str], str]) -> str:
    if not run.trajectory_files:
        return ""
    items = "".join(f"<li>{link(href(f), f)} · {counts.get(f, 0)} trajectories</li>"
                    for f in run.trajectory_files)
    return f"<section data-live><h2>trajectories</h2><ul>{items}</ul></section>"


# -- real-time loop runs --------------------------------------------------------------------------

NO_KEPT = "an arm had no session with an edit"
"""Why a kept rate (and its B − A) has no value: it is measured on sessions with an edit event."""


def train_status(run: RunData) -> str:
    """The runs list's cell of a train run: its state (``looprl.runstate``), and the stage a
    run still training, or one that ended early, was in."""
    st = run.state
    if st.status == "unknown":  # no state.json: a run older than it, or not a train run
        return "training" if not run.report_md else "finished"
    stage = f" ({esc(st.stage)})" if st.stage and st.status != "finished" else ""
    return f"{esc(st.status)}{stage}"


def loop_status(run: RunData) -> str:
    """The runs list's cell of a loop run: its cycles, and kept B − A once result.txt exists."""
    n = len(run.cycles)
    done = f"{n} cycle{'s' * (n != 1)}"
    if run.result is None:
        return f'<span class="tag">real-time loop</span> {done} · running'
    r = run.result
    kept = interval(r.get("kept_delta"), r.get("kept_ci_low"), r.get("kept_ci_high"))
    return (f'<span class="tag">real-time loop</span> {done} · kept B − A {esc(kept)}'
            + (f" ({NO_KEPT})" if r.get("kept_delta") is None else ""))


# -- compare --------------------------------------------------------------------------------------

def _last_card(key: str) -> Callable[[RunData], str]:
    return lambda r: esc(fmt(card_value(r, key)[0]))


def compare_section(runs: Sequence[RunData], prefix: str = "cmp") -> str:
    """Several runs side by side: last-step cards, curves on shared axes, evaluations, and the
    config settings that differ."""
    parts = ['<section id="compare"><h2>runs compared</h2>']
    heads = ["", *(esc(r.name) for r in runs)]
    figures: list[tuple[str, Callable[[RunData], str]]] = [
        ("steps", lambda r: str(len(r.rows))),
        ("skipped steps", lambda r: str(len(r.skipped_steps)))]
    figures += [(lab, _last_card(key)) for lab, key in TRAINING_CARDS[1:]]
    parts.append(table(heads, [[esc(lab), *(f(r) for r in runs)] for lab, f in figures], "compare"))
    parts.append(charts_grid(compare_charts(runs, COMPARE_METRICS), prefix))
    parts.append(_evals_compared(runs))
    configs = [flatten(r.config or {}) for r in runs]
    keys = list(dict.fromkeys(k for c in configs for k in c))
    differ = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1
              and k != "name"]
    if differ:
        rows = [[esc(k), *(esc(fmt(c.get(k)) if not isinstance(c.get(k), (list, dict))
                               else json.dumps(c.get(k))) for c in configs)] for k in differ]
        parts.append(f"<h3>config settings that differ ({len(differ)} of {len(keys)})</h3>"
                     + table(["key", *heads[1:]], rows, "config"))
    elif all(configs):
        parts.append('<p class="muted">the runs\' configs are the same (but for the name)</p>')
    return "".join(parts) + "</section>"


def _evals_compared(runs: Sequence[RunData]) -> str:
    """Each evaluation's metrics, one column per run and policy (start, RL)."""
    out = []
    for group in dict.fromkeys(g for r in runs for g in r.evals):
        cols = [(r, p) for r in runs for p in (r.evals.get(group) or {})]
        keys = list(dict.fromkeys(k for r, p in cols
                                  for k, v in (r.evals[group][p].get("metrics") or {}).items()
                                  if isinstance(v, (int, float))))
        rows = [[esc(k), *(esc(fmt((r.evals[group][p].get("metrics") or {}).get(k)))
                           for r, p in cols)] for k in keys]
        out.append(f"<h3>{esc(group)}</h3>" + table(
            ["metric", *(f"{esc(r.name)} · {esc(p)}" for r, p in cols)], rows))
    return "".join(out)


# -- fleet and feedback ---------------------------------------------------------------------------

def fleet_section(fleet: FleetData, history: Chart | None) -> str:
    """The env server's sandbox pool: cards of the latest sample, busy/idle/warm/queued over time."""
    head = f'<section id="fleet" data-live><h2>sandbox fleet — {esc(fleet.url)}</h2>'
    if fleet.error:
        return head + problems([fleet.error], "error") + "</section>"
    m = fleet.metrics
    health = ("" if m.get("ok", True) else
              problems([f"pool unhealthy: {m.get('detail', '')}"], "error"))
    leases = m.get("leases_total") or 0
    extra = {"warm hit rate": (m.get("warm_hits_total", 0) / leases) if leases else None}
    chart = charts_grid([history], "pool") if history else ""
    return (head + health + cards(m, POOL_CARDS)
            + cards(extra, (("warm hit rate", "warm hit rate"),)) + "</section>"
            + (f'<section id="fleet-history"><h2>sandbox pool over time</h2>{chart}</section>'
               if chart else ""))


def feedback_section(fb: FeedbackData) -> str:
    """Per-arm metrics, B - A intervals and the decision of the A/B test; the latest cycles."""
    head = f'<section id="feedback" data-live><h2>feedback and A/B — {esc(str(fb.path))}</h2>'
    if fb.error or fb.report is None:
        return head + problems([fb.error or "no report"], "error") + "</section>"
    rep = fb.report
    d = rep.decision
    which = (f"of experiment {esc(fb.experiment)}" if fb.experiment else
             "stored (every experiment; --experiment NAME shows one)")
    parts = [head, f'<div class="muted">{fb.sessions} sessions {which}</div>',
             f'<p><span class="decision {esc(d.action)}">decision: {esc(d.action)}</span> '
             f'{esc(d.reason)}</p>']
    if rep.arms:
        rows = [[esc(a), *(esc(fmt(getattr(m, c))) for c in ARM_COLS)]
                for a, m in sorted(rep.arms.items())]
        parts.append("<h3>per arm</h3>" + table(["arm", *ARM_COLS], rows))
    else:
        parts.append(problems(["no sessions yet: serve with `looprl serve --store ...`"]))
    scored = {a: m.scored for a, m in rep.arms.items()}
    small = len(scored) < 2 or min(scored.values()) < SMALL_SAMPLE
    if small:
        counts = " vs ".join(f"{a}: {n}" for a, n in sorted(scored.items())) or "no arms"
        parts.append(problems([f"small sample ({counts} scored sessions): with fewer than "
                               f"{SMALL_SAMPLE} per arm these intervals are not reliable "
                               "(a bootstrap over a handful of sessions is far too narrow; one "
                               "session has no spread at all). Wait for more sessions before "
                               "reading them."], "problem small-sample"))
    drows = [[esc(k), *(esc(fmt(v)) for v in (x.diff, x.lo, x.hi))] for k, x in rep.diffs.items()]
    parts.append("<h3>B − A (95% bootstrap interval)</h3>"
                 + table(["metric", "diff", "low", "high"], drows,
                         "intervals small-sample" if small else "intervals"))
    if fb.cycles:
        crows = [[str(c.id), str(c.policy_version), esc(fmt(c.candidate_version)), esc(c.status),
                  str(len(c.session_ids)), esc(c.reason)] for c in fb.cycles[-10:]]
        parts.append("<h3>latest cycles</h3>" + table(
            ["cycle", "policy", "candidate", "status", "sessions", "reason"], crows))
    return "".join(parts) + "</section>"


# -- the page -------------------------------------------------------------------------------------

def _read(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def page(title: str, body: Sequence[str], *, refresh_s: int = 0, nav: str = "", note: str = "",
         assets: str = SERVED, static_url: str = "/static/") -> str:
    """A whole HTML page. ``assets=SERVED`` links the scripts from ``static_url`` (the server sends
    a CSP allowing only its own scripts); ``INLINE`` embeds them and allows exactly their hashes.
    ``refresh_s`` > 0 makes ``dashboard.js`` reload the page's data in place that often."""
    style = "".join(_read(s) for s in STYLES)
    if assets == INLINE:
        scripts = [_read(s) for s in SCRIPTS]
        hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()
                          + "'" for s in scripts)
        csp = (f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
               "img-src data:; base-uri 'none'; form-action 'none'")
        head_extra = f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        tags = "".join(f"<script>{s}</script>" for s in scripts)
    else:
        head_extra = ""
        tags = "".join(f'<script src="{esc(static_url + s)}"></script>' for s in SCRIPTS)
    return ("<!doctype html><html><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="icon" href="data:,">'
            f"{head_extra}<title>{esc(title)}</title><style>{style}</style></head>"
            f'<body data-refresh="{max(0, int(refresh_s))}">'
            f"<header><strong>{esc(title)}</strong><nav>{nav}</nav>"
            f'<small data-live id="note">{esc(note)}</small></header>'
            "<noscript><div class=\"problem\">charts need JavaScript (no network access: the "
            "scripts come with the page)</div></noscript>"
            f"<main>{''.join(body)}</main>{tags}</body></html>")
