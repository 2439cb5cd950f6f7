"""HTML and PNG charts for the dashboard: pure functions from records (``data.py``) to markup.

    html = page("looprl", [training_section(run, png)], refresh_s=10)
    png = chart_png(run.rows, TRAINING_PANELS)         # bytes; inline with data_uri(png)

Charts are drawn server-side with matplotlib (Agg) and inlined as base64 PNG, and the stylesheet
(``static/style.css``) is inlined too: a page makes no request to anything but the dashboard, so it
works without internet and an exported file is self-contained. Every string from a file or a
server goes through ``html.escape``.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from looprl.dashboard.data import FeedbackData, FleetData, RunData, fmt, numeric_keys

STYLE = (Path(__file__).parent / "static" / "style.css").read_text()

# (title, metric keys); a "reward/*" key expands to every reward term except the total.
TRAINING_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mean reward", ("reward/total_mean",)),
    ("pass rate (hidden tests)", ("rollout/pass_rate",)),
    ("reward terms (mean)", ("reward/*",)),
    ("KL to reference (mean)", ("train/kl_mean",)),
    ("IS ratio trainer/engine", ("train/is_ratio_mean", "train/is_ratio_max")),
    ("loss", ("train/loss",)),
    ("grad norm", ("train/grad_norm",)),
    ("broken tool calls / call", ("broken_call_rate",)),
)
THROUGHPUT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("throughput (tokens/s)", ("rollout/tokens_per_s", "train/tokens_per_s")),
    ("trainer idle fraction", ("loop/trainer_idle_fraction",)),
    ("groups stale / dropped, infra errors",
     ("loop/groups_stale", "loop/groups_dropped", "runner/infra_errors")),
    ("weight publish (s)", ("loop/publish_s",)),
)
TRAINING_CARDS = (("step", "step"), ("reward", "reward/total_mean"),
                  ("pass rate", "rollout/pass_rate"), ("KL", "train/kl_mean"),
                  ("IS ratio", "train/is_ratio_mean"), ("loss", "train/loss"),
                  ("broken calls", "broken_call_rate"), ("elapsed (min)", "elapsed_s"))
THROUGHPUT_CARDS = (("rollout tok/s", "rollout/tokens_per_s"), ("train tok/s", "train/tokens_per_s"),
                    ("trainer idle", "loop/trainer_idle_fraction"),
                    ("groups stale", "loop/groups_stale"), ("groups dropped", "loop/groups_dropped"),
                    ("infra errors", "runner/infra_errors"))
POOL_CARDS = (("busy", "busy"), ("idle", "idle"), ("warm", "warm"), ("queued", "queued"),
              ("max running", "max_running"), ("exec p50 ms", "exec_p50_ms"),
              ("exec p95 ms", "exec_p95_ms"), ("execs", "execs_total"), ("leases", "leases_total"),
              ("warm hits", "warm_hits_total"), ("expired", "expired_total"),
              ("sandbox errors", "errors_total"))
POOL_SERIES = ("busy", "idle", "warm", "queued")
ARM_COLS = ("sessions", "scored", "reward", "kept", "reverted", "dissatisfied")

esc = html.escape


def _expand(keys: Sequence[str], present: list[str]) -> list[str]:
    out = []
    for k in keys:
        if k == "reward/*":
            out += [p for p in present if p.startswith("reward/") and p != "reward/total_mean"]
        elif k in present:
            out.append(k)
    return out


def chart_png(series: dict[str, tuple[list[float], dict[str, list[float]]]], cols: int = 4,
              xlabel: str = "step") -> bytes:
    """One PNG of small panels: title -> (x values, label -> y values). Empty input: b""."""
    if not series:
        return b""
    from matplotlib.figure import Figure  # no pyplot: no global state, safe in worker threads
    from matplotlib.ticker import MaxNLocator

    n = len(series)
    ncols = min(cols, n)
    nrows = (n + ncols - 1) // ncols
    fig = Figure(figsize=(3.4 * ncols, 2.5 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax, (title, (xs, lines)) in zip(axes.flat, series.items(), strict=False):
        for label, ys in lines.items():
            ax.plot(xs[:len(ys)], ys, marker="o", ms=2.5, lw=1.3, label=label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if xlabel == "step":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if len(lines) > 1:
            ax.legend(fontsize=6.5, loc="best")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def run_series(rows: Sequence[dict[str, Any]],
               panels: Sequence[tuple[str, Sequence[str]]]) -> dict[str, tuple[list[float], dict[str, list[float]]]]:
    """Panel data from metrics rows; panels whose keys never appear are left out."""
    present = numeric_keys(tuple(rows))
    out = {}
    for title, keys in panels:
        ks = _expand(keys, present)
        if not ks:
            continue
        xs = [float(r["step"]) for r in rows]
        lines = {_short(k) if len(ks) > 1 else k: [_num(r.get(k)) for r in rows]
                 for k in ks}
        out[title] = (xs, lines)
    return out


def compare_series(runs: Sequence[RunData]) -> dict[str, tuple[list[float], dict[str, list[float]]]]:
    """Reward and pass rate of several runs on shared axes (one line per run)."""
    out: dict[str, tuple[list[float], dict[str, list[float]]]] = {}
    for title, key in (("mean reward", "reward/total_mean"), ("pass rate", "rollout/pass_rate")):
        longest = max(runs, key=lambda r: len(r.rows))
        xs = [float(r["step"]) for r in longest.rows]
        lines = {r.name: [_num(row.get(key)) for row in r.rows] for r in runs if r.rows}
        if xs and lines:
            out[title] = (xs, lines)
    return out


def _short(key: str) -> str:
    """A legend label: ``reward/length_mean`` -> ``length``; other keys stay whole (``rollout/`` and
    ``train/tokens_per_s`` share a panel)."""
    if key.startswith("reward/") and key.endswith("_mean"):
        return key[len("reward/"):-len("_mean")]
    return key


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def img(png: bytes, alt: str) -> str:
    return f'<img class="chart" alt="{esc(alt)}" src="{data_uri(png)}">' if png else ""


def cards(values: dict[str, Any], spec: Sequence[tuple[str, str]]) -> str:
    items = []
    for label, key in spec:
        if key not in values:
            continue
        v = values[key]
        if key == "elapsed_s" and isinstance(v, (int, float)):
            v = v / 60
        items.append(f'<div class="card" title="{esc(key)}"><div class="k">{esc(label)}</div>'
                     f'<div class="v">{esc(fmt(v))}</div></div>')
    return f'<div class="cards">{"".join(items)}</div>' if items else ""


def problems(msgs: Sequence[str], cls: str = "problem") -> str:
    return "".join(f'<div class="{cls}">{esc(m)}</div>' for m in msgs)


def eval_table(evals: dict[str, dict[str, Any]]) -> str:
    if not evals:
        return ""
    labels = list(evals)
    keys: dict[str, None] = {}
    for e in evals.values():
        for k, v in (e.get("metrics") or {}).items():
            if isinstance(v, (int, float)):
                keys.setdefault(k, None)
    head = "".join(f"<th>{esc(lb)}</th>" for lb in labels)
    body = "".join(
        f"<tr><td>{esc(k)}</td>" + "".join(
            f"<td>{esc(fmt((evals[lb].get('metrics') or {}).get(k)))}</td>" for lb in labels)
        + "</tr>" for k in keys)
    return (f"<h3>held-out evaluation</h3><table><tr><th>metric</th>{head}</tr>{body}</table>"
            if keys else "")


def training_section(run: RunData, png: bytes, link: str | None = None, detail: bool = True) -> str:
    """Cards of the last step, the training curves, problems, evaluation and report."""
    title = f'<a href="{esc(link)}">{esc(run.name)}</a>' if link else esc(run.name)
    n = len(run.rows)
    parts = [f'<section><h2>training — {title}</h2>',
             f'<div class="muted">{esc(str(run.path))} · {n} step{"s" * (n != 1)} logged</div>',
             problems(run.problems), cards(run.last, TRAINING_CARDS), img(png, f"{run.name} curves")]
    if detail:
        parts.append(eval_table(run.evals))
        if run.report_md:
            parts.append(f"<h3>report.md</h3><pre>{esc(run.report_md)}</pre>")
    parts.append("</section>")
    return "".join(parts)


def throughput_section(run: RunData, png: bytes) -> str:
    """Engine / rollout / trainer throughput and loop health of one run."""
    if not run.rows:
        return ""
    return (f"<section><h2>rollout and trainer throughput — {esc(run.name)}</h2>"
            f"{cards(run.last, THROUGHPUT_CARDS)}{img(png, f'{run.name} throughput')}</section>")


def fleet_section(fleet: FleetData, png: bytes) -> str:
    """The env server's sandbox pool: cards of the latest sample, busy/idle/warm/queued over time."""
    head = f"<section><h2>sandbox fleet — {esc(fleet.url)}</h2>"
    if fleet.error:
        return head + problems([fleet.error], "error") + "</section>"
    m = fleet.metrics
    health = ("" if m.get("ok", True) else
              problems([f"pool unhealthy: {m.get('detail', '')}"], "error"))
    leases = m.get("leases_total") or 0
    extra = {"warm hit rate": (m.get("warm_hits_total", 0) / leases) if leases else None}
    return (head + health + cards(m, POOL_CARDS) + cards(extra, (("warm hit rate", "warm hit rate"),))
            + img(png, "pool over time") + "</section>")


def feedback_section(fb: FeedbackData) -> str:
    """Per-arm metrics, B - A intervals and the decision of the A/B test; the latest cycles."""
    head = f"<section><h2>feedback and A/B — {esc(str(fb.path))}</h2>"
    if fb.error or fb.report is None:
        return head + problems([fb.error or "no report"], "error") + "</section>"
    rep = fb.report
    d = rep.decision
    parts = [head, f'<div class="muted">{fb.sessions} sessions stored</div>',
             f'<p><span class="decision {esc(d.action)}">decision: {esc(d.action)}</span> '
             f'{esc(d.reason)}</p>']
    if rep.arms:
        heads = "".join(f"<th>{c}</th>" for c in ARM_COLS)
        rows = "".join(f"<tr><td>{esc(a)}</td>" + "".join(
            f"<td>{esc(fmt(getattr(m, c)))}</td>" for c in ARM_COLS) + "</tr>"
            for a, m in sorted(rep.arms.items()))
        parts.append(f"<h3>per arm</h3><table><tr><th>arm</th>{heads}</tr>{rows}</table>")
    else:
        parts.append(problems(["no sessions yet: serve with `looprl serve --store ...`"]))
    drows = "".join(f"<tr><td>{esc(k)}</td><td>{esc(fmt(x.diff))}</td><td>{esc(fmt(x.lo))}</td>"
                    f"<td>{esc(fmt(x.hi))}</td></tr>" for k, x in rep.diffs.items())
    parts.append("<h3>B − A (95% bootstrap interval)</h3><table><tr><th>metric</th><th>diff</th>"
                 f"<th>low</th><th>high</th></tr>{drows}</table>")
    if fb.cycles:
        crows = "".join(f"<tr><td>{c.id}</td><td>{c.policy_version}</td>"
                        f"<td>{esc(fmt(c.candidate_version))}</td><td>{esc(c.status)}</td>"
                        f"<td>{len(c.session_ids)}</td><td style='text-align:left'>{esc(c.reason)}</td></tr>"
                        for c in fb.cycles[-10:])
        parts.append("<h3>latest cycles</h3><table><tr><th>cycle</th><th>policy</th>"
                     "<th>candidate</th><th>status</th><th>sessions</th><th>reason</th></tr>"
                     f"{crows}</table>")
    return "".join(parts) + "</section>"


def page(title: str, body: Sequence[str], *, refresh_s: int = 0, nav: str = "",
         note: str = "") -> str:
    """A whole self-contained HTML page (inline CSS; ``refresh_s`` > 0 adds a meta refresh)."""
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s > 0 else ""
    return ("<!doctype html><html><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title>{refresh}<style>{STYLE}</style></head><body>"
            f"<header><strong>{esc(title)}</strong>{nav}<small>{esc(note)}</small></header>"
            f"<main>{''.join(body)}</main></body></html>")
