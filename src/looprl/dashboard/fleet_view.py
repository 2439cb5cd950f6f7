"""The Ray fleet view (``/fleet``): every node of a run's fleet, its environment server and engine
replicas — sandboxes busy/idle/queued, rollouts in flight, requests and tokens in flight and
tokens/s per replica — from the ``fleet.json`` the run's driver rewrites every ``fleet.poll_s``
(``looprl.fleet.snapshot``). A run without one (``fleet.backend = "inprocess"``) is not listed.

    html = fleet_page(dash)      # the page body for the app's /fleet route
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from looprl.dashboard import render
from looprl.fleet.snapshot import FleetSnapshot, NodeView, read_snapshot
from looprl.rundir import RunDir

STALE_S = 30.0
"""A snapshot older than this belongs to a driver that stopped (the run ended or died)."""


def load_fleet(run_dir: Path) -> tuple[FleetSnapshot | None, str | None]:
    """(snapshot, problem): the run's fleet, or why it cannot be shown; (None, None) when the run
    has no fleet."""
    path = RunDir(run_dir).fleet
    if not path.exists():
        return None, None
    try:
        return read_snapshot(path), None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"{path} is not a fleet snapshot ({type(e).__name__}: {e})"


def _n(v: Any) -> str:
    return render.esc(f"{v:,.0f}" if isinstance(v, (int, float)) else "—")


def _engines(node: NodeView) -> str:
    if not node.engines:
        return ""
    return render.table(
        ["replica", "requests in flight", "prompt tokens in flight", "tokens/s", "open rollouts",
         "policy", "prompt KV reused"],
        [[str(e.index), _n(e.in_flight), _n(e.tokens_in_flight), render.esc(f"{e.tokens_per_s:.1f}"),
          _n(e.open_trajectories), f"v{e.policy_version}", _n(e.reused_group_tokens)]
         for e in node.engines])


def fleet_section(name: str, snap: FleetSnapshot) -> str:
    """One run's fleet: totals, a row per node (its replicas nested), the newest events."""
    live = [n for n in snap.nodes if n.state == "live"]
    sb = lambda k: sum(float(n.sandboxes.get(k, 0)) for n in live)  # noqa: E731
    age = time.time() - snap.written_at
    stale = render.problems([f"the last snapshot is {render.ago(snap.written_at)}: its driver "
                             "is not running (the run ended or died)"]) if age > STALE_S else ""
    totals = {"nodes live": f"{len(live)} of {len(snap.nodes)}",
              "sandboxes busy / idle / queued": f"{sb('busy'):.0f} / {sb('idle'):.0f} / {sb('queued'):.0f}",
              "rollouts in flight": f"{sum(n.rollouts_in_flight for n in live)}",
              "tokens/s": f"{sum(e.tokens_per_s for n in live for e in n.engines):.1f}",
              "policy version": f"v{snap.policy_version}",
              "nodes lost": f"{snap.members_lost}",
              "rollouts retried after a loss": f"{snap.attempts_lost}"}
    cards = "".join(f'<div class="card"><div class="k">{render.esc(k)}</div>'
                    f'<div class="v">{render.esc(v)}</div></div>' for k, v in totals.items())
    rows = [[f'<span title="{render.esc(n.node_id)}">{render.esc(n.node_id[:8])}</span>',
             render.esc(n.address), render.esc(n.state),
             " / ".join(_n(n.sandboxes.get(k)) if n.sandboxes else "—"
                        for k in ("busy", "idle", "queued", "warm")),
             _n(n.rollouts_in_flight) if n.engines else "—",
             render.esc(", ".join(f"{k} {v:g}" for k, v in sorted(n.resources.items()))),
             render.esc(f"{n.since_s:.0f} s") if n.since_s else "—",
             _engines(n)] for n in snap.nodes]
    events = "".join(f"<li>{render.esc(e)}</li>" for e in reversed(snap.events[-12:]))
    return (f'<section><h2>fleet — {render.esc(name)}</h2><div data-live>{stale}'
            f'<div class="muted">Ray at {render.esc(snap.address)} · sampled '
            f'{render.esc(render.ago(snap.written_at))}</div>'
            f'<div class="cards">{cards}</div>'
            + render.table(["node", "address", "state", "sandboxes busy / idle / queued / warm",
                            "rollouts in flight", "resources", "up", "engine replicas"], rows,
                           "fleet")
            + (f"<h3>events (newest first)</h3><ul>{events}</ul>" if events else "")
            + "</div></section>")


def fleet_page(dash: Any) -> str:
    """The ``/fleet`` page of ``dash`` (an ``app.Dashboard``): a section per run with a fleet."""
    body = []
    for name, path in dash.run_paths().items():
        snap, problem = load_fleet(path)
        if problem:
            body.append(f"<section><h2>fleet — {render.esc(name)}</h2>"
                        + render.problems([problem], "error") + "</section>")
        elif snap is not None:
            body.append(fleet_section(name, snap))
    if not body:
        body.append(render.problems([
            "no run here has a Ray fleet: train with -o fleet.backend=ray (its driver writes "
            f"{RunDir(Path('RUN')).fleet}) and pass that run with --run"]))
    return dash.html("looprl — fleet", body)
