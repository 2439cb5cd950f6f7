"""A training run's infrastructure failures, by class of the taxonomy (``looprl.errors.InfraKind``):
each class's count so far and its rate per rollout attempt in the last step (the ``infra/`` and
``infra_rate/`` keys of ``metrics.jsonl``, ``looprl.faults.InfraLedger``), their curves, and —
when the run injected faults — the injector's own books at the last row beside them
(``faults.jsonl``), with whether the two agree.
"""

from __future__ import annotations

from typing import Any

from looprl.dashboard.data import RunData, metric_values
from looprl.dashboard.render import Chart, charts_grid, esc, fmt, table

COUNT, RATE = "infra/", "infra_rate/"


def _classes(rows: tuple[dict[str, Any], ...]) -> list[str]:
    """The classes the run counted (every key ``infra/<class>`` but the attempts)."""
    keys = dict.fromkeys(k for r in rows for k in r if k.startswith(COUNT))
    return [k[len(COUNT):] for k in keys if k != COUNT + "attempts"]


def infra_charts(run: RunData) -> list[Chart]:
    """The per-step rate of each class that ever failed (and of all), and the counts so far."""
    rows = run.rows
    seen = [c for c in _classes(rows) if any((r.get(COUNT + c) or 0) > 0 for r in rows)]
    xs = [float(r["step"]) for r in rows]
    rates = {c: metric_values(rows, RATE + c) for c in [*seen, "all"]}
    counts = {c: metric_values(rows, COUNT + c) for c in seen}
    out = [Chart("infrastructure failures per rollout attempt (each step)", xs, rates,
                 unit_range=True)]
    if counts:
        out.append(Chart("infrastructure failures so far, by class", xs, counts))
    return out


def infra_section(run: RunData, prefix: str) -> str:
    """Nothing for a run whose rows carry no ``infra/`` counts (one from before the ledger)."""
    classes = _classes(run.rows)
    if not classes:
        return ""
    last, books = run.last, run.fault_books
    head = ["class", "failures so far", "last step, per attempt"]
    if books is not None:
        head += ["injected", "settled", "cut off", "metrics = settled"]
    rows = []
    for c in classes:
        n = last.get(COUNT + c)
        cells = [esc(c), esc(fmt(n)), esc(fmt(last.get(RATE + c)))]
        if books is not None:
            settled = books.get("settled", {}).get(c, 0)
            cells += [esc(fmt(books.get("injected", {}).get(c, 0))), esc(fmt(settled)),
                      esc(fmt(books.get("cut_off", {}).get(c, 0))),
                      '<span class="status promoted">yes</span>' if (n or 0) == settled else
                      '<span class="status rejected">NO</span>']
        if n or books is not None and books.get("injected", {}).get(c):
            rows.append(cells)
    attempts = last.get(COUNT + "attempts")
    note = (f"{fmt(attempts)} rollout attempts so far; none of these failures was scored: each "
            "attempt was retried in a fresh sandbox or dropped.")
    if books is not None:
        note += (f" Fault injection was on: the injector's books at step {fmt(books.get('step'))} "
                 "(settled = injected − still open − cut off with an attempt that never came "
                 "back) against the run's own counts.")
    body = table(head, rows, "infra") if rows else '<div class="muted">no infrastructure ' \
        "failure so far</div>"
    return (f'<section id="{esc(prefix)}-infra" data-live><h3>infrastructure failures</h3>'
            f'{body}<div class="muted">{esc(note)}</div>'
            + charts_grid(infra_charts(run), prefix + "-i") + "</section>")
