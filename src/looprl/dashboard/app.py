"""The dashboard web app (FastAPI) and its static export: training, fleet and feedback on one page.

    cfg = DashboardConfig(runs=(Path("runs/quickstart"),), store=Path("feedback.db"),
                          env_server="http://127.0.0.1:8377", env_token="s3cret")
    uvicorn.run(create_app(cfg), host="127.0.0.1", port=8500)   # or: looprl dashboard --run ...
    export_html(cfg, Path("report.html"))                         # one self-contained file

Routes: ``/`` overview (every run's cards and curves, a comparison of runs, the sandbox fleet, the
A/B test), ``/run/{i}`` one run in detail (all curves, evaluation, report.md), ``/api/summary``
(the same figures as JSON), ``/healthz`` (no auth). Pages re-read their inputs on each request and
refresh themselves every ``refresh_s`` seconds, so a running job can be watched; charts are
re-drawn only when a run's metrics change.

Auth: with a ``token``, every route but ``/healthz`` wants ``Authorization: Bearer <token>``, or
``?token=<token>`` once in the browser (it sets a cookie). The token is a shared secret over plain
HTTP: it keeps casual visitors out, it does not protect against anyone who can read the traffic —
bind to loopback (the default) or put TLS in front.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse

from looprl.dashboard import render
from looprl.dashboard.data import (
    FeedbackData,
    FleetData,
    RunData,
    fetch_fleet,
    load_feedback,
    load_run,
)

COOKIE = "looprl_dashboard_token"


@dataclass(frozen=True)
class DashboardConfig:
    runs: tuple[Path, ...] = ()
    """Run directories (``runs/<name>/``) written by ``looprl quickstart`` or ``GRPOLoop``."""
    store: Path | None = None
    """A feedback store (SQLite, ``looprl serve --store``) for the A/B view."""
    env_server: str | None = None
    """URL of an env server (``looprl sandbox serve``) for the sandbox fleet view."""
    env_token: str | None = None
    """Bearer token of that env server."""
    token: str | None = None
    """Bearer token guarding the dashboard itself; None = open (loopback only, see cli)."""
    refresh_s: int = 10
    """Pages reload themselves this often (0 = never; exports never refresh)."""
    min_sessions: int = 100
    """Scored sessions per arm before the A/B decision may leave ``keep`` (as ``ab_report``)."""
    experiment: str | None = None
    """Only this experiment's sessions in the A/B view."""


def _unique_names(paths: tuple[Path, ...]) -> list[str]:
    """Display names: the directory name, with its parent when two runs share a name."""
    names = [p.resolve().name or str(p) for p in paths]
    return [f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 else n
            for p, n in zip(paths, names, strict=True)]


class Dashboard:
    """Reads the inputs, caches charts per metrics version, keeps a short history of pool samples."""

    def __init__(self, cfg: DashboardConfig, fleet_history: int = 360):
        self.cfg = cfg
        self.names = _unique_names(cfg.runs)
        self._charts: dict[tuple[Any, ...], bytes] = {}
        self._lock = threading.Lock()  # matplotlib rendering and the caches
        self.pool_samples: deque[tuple[float, dict[str, Any]]] = deque(maxlen=fleet_history)
        self._t0 = time.time()

    # -- inputs ------------------------------------------------------------------------------
    def runs(self) -> list[RunData]:
        return [load_run(p, n) for p, n in zip(self.cfg.runs, self.names, strict=True)]

    def fleet(self) -> FleetData | None:
        if not self.cfg.env_server:
            return None
        f = fetch_fleet(self.cfg.env_server, self.cfg.env_token)
        if not f.error:
            with self._lock:
                self.pool_samples.append((time.time(), f.metrics))
        return f

    def feedback(self) -> FeedbackData | None:
        if self.cfg.store is None:
            return None
        return load_feedback(self.cfg.store, self.cfg.min_sessions, self.cfg.experiment)

    # -- charts ------------------------------------------------------------------------------
    def _cached(self, key: tuple[Any, ...], draw: Callable[[], bytes]) -> bytes:
        with self._lock:
            if key not in self._charts:
                if len(self._charts) > 64:
                    self._charts.clear()
                self._charts[key] = draw()
            return self._charts[key]

    def run_chart(self, run: RunData, kind: str) -> bytes:
        panels = {"training": render.TRAINING_PANELS, "throughput": render.THROUGHPUT_PANELS}[kind]
        key = (kind, str(run.path), run.mtime, len(run.rows), run.last.get("step"))
        return self._cached(key, lambda: render.chart_png(render.run_series(run.rows, panels)))

    def compare_chart(self, runs: list[RunData]) -> bytes:
        key = ("compare", *((str(r.path), r.mtime, len(r.rows)) for r in runs))
        return self._cached(key, lambda: render.chart_png(render.compare_series(runs), cols=2))

    def pool_chart(self) -> bytes:
        with self._lock:
            samples = list(self.pool_samples)
        if len(samples) < 2:
            return b""
        xs = [(t - samples[0][0]) for t, _ in samples]
        lines = {k: [render._num(m.get(k)) for _, m in samples] for k in render.POOL_SERIES}
        lat = {k: [render._num(m.get(k)) for _, m in samples] for k in ("exec_p50_ms", "exec_p95_ms")}
        with self._lock:
            return render.chart_png({"sandboxes": (xs, lines), "exec latency (ms)": (xs, lat)},
                                    cols=2, xlabel="seconds since first sample")

    # -- pages -------------------------------------------------------------------------------
    def _nav(self) -> str:
        links = "".join(f' <a href="/run/{i}">{render.esc(n)}</a>' for i, n in enumerate(self.names))
        return f'<span><a href="/">overview</a>{links}</span>'

    def overview(self, *, refresh: bool = True) -> str:
        runs = self.runs()
        body: list[str] = []
        if not runs and not self.cfg.store and not self.cfg.env_server:
            body.append(render.problems(["nothing to show: pass --run DIR, --store FILE or "
                                         "--env-server URL"], "error"))
        if len(runs) > 1:
            body.append(_guard("comparison", lambda: "<section><h2>runs compared</h2>"
                               + render.img(self.compare_chart(runs), "runs compared") + "</section>"))
        for i, run in enumerate(runs):
            body.append(_guard(f"run {run.name}", lambda run=run, i=i: render.training_section(
                run, self.run_chart(run, "training"), link=f"/run/{i}", detail=False)))
        body += self._fleet_and_feedback(runs)
        return render.page("looprl dashboard", body, refresh_s=self.cfg.refresh_s if refresh else 0,
                           nav=self._nav(), note=self._note())

    def run_page(self, i: int) -> str:
        run = load_run(self.cfg.runs[i], self.names[i])
        body = [_guard(f"run {run.name}", lambda: render.training_section(
                    run, self.run_chart(run, "training"))),
                _guard("throughput", lambda: render.throughput_section(
                    run, self.run_chart(run, "throughput")))]
        return render.page(f"looprl — {run.name}", body, refresh_s=self.cfg.refresh_s,
                           nav=self._nav(), note=self._note())

    def _fleet_and_feedback(self, runs: list[RunData]) -> list[str]:
        body = [_guard(f"throughput {r.name}", lambda r=r: render.throughput_section(
                    r, self.run_chart(r, "throughput"))) for r in runs]
        fleet = self.fleet()
        if fleet is not None:
            body.append(_guard("fleet", lambda: render.fleet_section(fleet, self.pool_chart())))
        fb = self.feedback()
        if fb is not None:
            body.append(_guard("feedback", lambda: render.feedback_section(fb)))
        return body

    def export(self) -> str:
        """Every run in detail, the fleet (one sample) and the A/B test; no refresh, no links."""
        runs = self.runs()
        body: list[str] = []
        if len(runs) > 1:
            body.append("<section><h2>runs compared</h2>"
                        + render.img(self.compare_chart(runs), "runs compared") + "</section>")
        for run in runs:
            body.append(_guard(f"run {run.name}", lambda run=run: render.training_section(
                run, self.run_chart(run, "training"))))
        body += self._fleet_and_feedback(runs)
        return render.page("looprl report", body, note=f"exported {time.strftime('%Y-%m-%d %H:%M:%S')}")

    def summary(self) -> dict[str, Any]:
        runs = self.runs()
        fleet, fb = self.fleet(), self.feedback()
        return {
            "runs": [{"name": r.name, "path": str(r.path), "steps": len(r.rows), "last": r.last,
                      "problems": list(r.problems)} for r in runs],
            "fleet": None if fleet is None else {"url": fleet.url, "metrics": fleet.metrics,
                                                 "error": fleet.error},
            "feedback": None if fb is None else {
                "path": str(fb.path), "error": fb.error, "sessions": fb.sessions,
                "report": fb.report.to_dict() if fb.report else None,
                "cycles": [asdict(c) for c in fb.cycles]},
        }

    def _note(self) -> str:
        r = f" · refreshes every {self.cfg.refresh_s}s" if self.cfg.refresh_s > 0 else ""
        return f"updated {time.strftime('%H:%M:%S')}{r}"


def _guard(what: str, build: Callable[[], str]) -> str:
    """A section that failed to render says so; the rest of the page still shows."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 — one broken input must not blank the dashboard
        return (f"<section><h2>{render.esc(what)}</h2>"
                + render.problems([f"this section failed to render: {type(e).__name__}: {e}"],
                                  "error") + "</section>")


def create_app(cfg: DashboardConfig) -> FastAPI:
    """The FastAPI app; see the module docstring for routes and auth."""
    dash = Dashboard(cfg)
    app = FastAPI(title="looprl dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.dashboard = dash

    def auth(request: Request, response: Response) -> None:
        if not cfg.token:
            return
        want = cfg.token.encode()
        header = request.headers.get("authorization", "")
        query = request.query_params.get("token", "")
        if hmac.compare_digest(header.encode(), b"Bearer " + want) or hmac.compare_digest(
                request.cookies.get(COOKIE, "").encode(), want):
            return
        if hmac.compare_digest(query.encode(), want):
            response.set_cookie(COOKIE, cfg.token, httponly=True, samesite="strict")
            return
        raise HTTPException(401, "missing or wrong token: send 'Authorization: Bearer <token>' "
                                 "or open the page once with ?token=<token>")

    guard = [Depends(auth)]

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "runs": len(cfg.runs)}

    @app.get("/", response_class=HTMLResponse, dependencies=guard)
    def overview() -> str:
        return dash.overview()

    @app.get("/run/{i}", response_class=HTMLResponse, dependencies=guard)
    def run_page(i: int) -> str:
        if not 0 <= i < len(cfg.runs):
            raise HTTPException(404, f"no run #{i}: the dashboard shows runs 0..{len(cfg.runs) - 1}")
        return dash.run_page(i)

    @app.get("/api/summary", dependencies=guard)
    def summary() -> dict[str, Any]:
        return dash.summary()

    return app


def export_html(cfg: DashboardConfig, out: Path) -> Path:
    """Write one self-contained HTML file (inline CSS, base64 PNG charts, no external links)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(Dashboard(cfg).export())
    return out
