"""The dashboard web app (FastAPI) and its static export: training runs, trajectories, the
sandbox fleet and the A/B test.

    cfg = DashboardConfig(runs=(Path("runs"),), store=Path("feedback.db"),
                          env_server="http://127.0.0.1:8377", env_token="s3cret")
    looprl.asgi.run(create_app(cfg), host="127.0.0.1", port=8500, drain_s=10)  # looprl dashboard
    export_html(cfg, Path("report.html"))                      # one self-contained file

Routes: ``/`` overview (the runs list, their main curves on shared axes, every overview panel),
``/runs/{name}`` one run (cards, every curve, evaluations, trajectories, report.md rendered, the
resolved config; for a real-time loop run, ``looprl feedback loop``, its result, cycles and final
A/B instead of the curves), ``/runs/{name}/trajectories/{file}`` a filterable list of a
trajectory file and ``.../{n}`` the viewer of one trajectory, ``/compare?run=a&run=b`` runs side
by side, ``/fleet`` the Ray fleet of each run that has one (``fleet_view.py``),
``/api/summary`` (the figures as JSON), ``/healthz`` (no auth). A ``--run`` directory that holds
runs rather than being one lists them all, new runs included as they appear. Pages re-read their
inputs on each request; with ``refresh_s`` the browser reloads their data in place (charts keep
their zoom).

Adding a view: an overview panel is a function ``(dash, runs) -> html`` appended to
``OVERVIEW_PANELS`` (``render.py`` has the pieces: ``cards``, ``table``, ``Chart`` +
``charts_grid``); a page is a route in ``create_app`` that returns ``dash.html(title, body)``,
and an entry in ``NAV`` if it belongs in the header.

Auth: with a ``token``, every route but ``/healthz`` wants ``Authorization: Bearer <token>``, or
``?token=<token>`` once in the browser (it sets a cookie), checked before any request body is read
(``looprl.asgi.Guard``; bodies over 64 KiB are 413: every route is a GET). The token is a shared
secret over plain HTTP: it keeps casual visitors out, it does not protect against anyone who can
read the traffic — bind to loopback (the default) or put TLS in front. Without a token the pages
are open to whoever can reach the port. Pages are sent with a Content-Security-Policy that runs
only the dashboard's own scripts, so text from a run cannot run as script even if escaping missed
it. Every page re-reads its inputs, so a flood of requests costs CPU (no rate limiting).
"""

from __future__ import annotations

import functools
import hmac
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse
from starlette.types import Scope

from looprl.asgi import Guard, install_error_handlers, query_param
from looprl.dashboard import render, trajview
from looprl.dashboard.data import (
    IMAGE_TYPES,
    FeedbackData,
    FleetData,
    RunData,
    TrajectoryIndex,
    expand_runs,
    fetch_fleet,
    load_feedback,
    load_run,
    load_tokenizer,
)
from looprl.dashboard.fleet_view import fleet_page
from looprl.dashboard.infra_view import infra_section
from looprl.dashboard.loop_view import loop_section
from looprl.rundir import RunDir

COOKIE = "looprl_dashboard_token"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
       "form-action 'self'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer"}  # no-referrer: a ?token= URL never leaves the page


@dataclass(frozen=True)
class DashboardConfig:
    runs: tuple[Path, ...] = ()
    """Run directories (``runs/<name>/``) written by ``looprl train``, or folders of them."""
    store: Path | None = None
    """A feedback store (SQLite, ``looprl serve --store``) for the A/B view."""
    env_server: str | None = None
    """URL of an env server (``looprl sandbox serve``) for the sandbox fleet view."""
    env_token: str | None = None
    """Bearer token of that env server."""
    token: str | None = None
    """Bearer token guarding the dashboard itself; None = open (loopback only, see cli)."""
    refresh_s: int = 10
    """Pages reload their data this often (0 = never; exports never refresh)."""
    min_sessions: int = 100
    """Scored sessions per arm before the A/B decision may leave ``keep`` (as ``ab_report``)."""
    experiment: str | None = None
    """Only this experiment's sessions in the A/B view."""


def unique_names(paths: list[Path]) -> list[str]:
    """URL-safe display names: the directory name, with its parent's when two runs share one."""
    names = [p.resolve().name or "run" for p in paths]
    out = [f"{p.resolve().parent.name}-{n}" if names.count(n) > 1 else n
           for p, n in zip(paths, names, strict=True)]
    return [n if out.count(n) == 1 else f"{n}-{i}" for i, n in enumerate(out)]


def run_href(name: str) -> str:
    return "/runs/" + quote(name, safe="")


NAV: list[tuple[str, str]] = [("/", "overview")]
"""The header's links (href, text): a page every user wants appends itself here."""


class Dashboard:
    """Reads the inputs on each request; keeps trajectory indexes, tokenizers and a short history
    of sandbox pool samples between requests."""

    def __init__(self, cfg: DashboardConfig, fleet_history: int = 360):
        self.cfg = cfg
        self._lock = threading.Lock()
        self._indexes: OrderedDict[Path, TrajectoryIndex] = OrderedDict()
        self._tokenizers: dict[Path, Any] = {}
        self.pool_samples: deque[tuple[float, dict[str, Any]]] = deque(maxlen=fleet_history)

    # -- inputs ------------------------------------------------------------------------------
    def run_paths(self) -> dict[str, Path]:
        paths = expand_runs(list(self.cfg.runs))
        return dict(zip(unique_names(paths), paths, strict=True))

    def runs(self) -> list[RunData]:
        return [load_run(p, n) for n, p in self.run_paths().items()]

    def run(self, name: str) -> RunData:
        path = self.run_paths().get(name)
        if path is None:
            raise HTTPException(404, f"no run named {name!r}: the overview (/) lists the runs")
        return load_run(path, name)

    def index(self, run: RunData, file: str) -> TrajectoryIndex:
        if file not in run.trajectory_files:
            raise HTTPException(404, f"run {run.name} has no trajectories/{file}.jsonl; it has: "
                                     + (", ".join(run.trajectory_files) or "none"))
        path = RunDir(run.path).trajectory_file(file)
        with self._lock:
            idx = self._indexes.pop(path, None) or TrajectoryIndex(path)
            self._indexes[path] = idx
            while len(self._indexes) > 64:
                self._indexes.popitem(last=False)
        return idx

    def tokenizer(self, run: RunData) -> Any:
        with self._lock:
            if run.path not in self._tokenizers:
                self._tokenizers[run.path] = load_tokenizer(run)
            return self._tokenizers[run.path]

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

    def pool_chart(self) -> render.Chart | None:
        with self._lock:
            samples = list(self.pool_samples)
        if len(samples) < 2:
            return None
        xs = [round(t - samples[0][0], 1) for t, _ in samples]
        lines = {k: [_num(m.get(k)) for _, m in samples] for k in render.POOL_SERIES}
        return render.Chart("sandboxes", xs, lines, xlabel="seconds since the first sample")

    # -- pages -------------------------------------------------------------------------------
    def html(self, title: str, body: list[str], *, refresh: bool = True) -> str:
        nav = " ".join(render.link(href, text) for href, text in NAV)
        note = f"updated {time.strftime('%H:%M:%S')}" + (
            f" · refreshes every {self.cfg.refresh_s}s" if refresh and self.cfg.refresh_s else "")
        return render.page(title, body, refresh_s=self.cfg.refresh_s if refresh else 0, nav=nav,
                           note=note)

    def overview(self) -> str:
        runs = self.runs()
        body: list[str] = []
        if not runs and not self.cfg.store and not self.cfg.env_server:
            body.append(render.problems(["nothing to show: pass --run DIR, --store FILE or "
                                         "--env-server URL"], "error"))
        for panel in OVERVIEW_PANELS:
            body.append(_guard(panel.__name__.replace("_", " "), functools.partial(panel, self, runs)))
        return self.html("looprl dashboard", body)

    def run_page(self, name: str) -> str:
        run = self.run(name)
        counts = {f: len(self.index(run, f).refresh()) for f in run.trajectory_files}
        base = run_href(run.name)
        body = [_guard("run", lambda: _main_section(run, "run")),
                _guard("evaluation", lambda: render.eval_section(
                    run, lambda f, t: f"{base}/trajectories/{f}?" + urlencode({"task": t}))),
                _guard("trajectories", lambda: render.trajectories_section(
                    run, counts, lambda f: f"{base}/trajectories/{f}")),
                _guard("report", lambda: render.report_section(
                    run, lambda src: _file_url(run, src))),
                _guard("config", lambda: render.config_section(run.config))]
        return self.html(f"looprl — {run.name}", body)

    def compare(self, names: list[str]) -> str:
        runs = [self.run(n) for n in dict.fromkeys(names)]
        if len(runs) < 2:
            raise HTTPException(400, "compare needs two or more runs: /compare?run=A&run=B "
                                     "(tick them in the overview's runs list)")
        body = [render.runs_table(runs, lambda r: run_href(r.name)),
                _guard("compare", lambda: render.compare_section(runs))]
        return self.html("looprl — compare " + " vs ".join(r.name for r in runs), body)

    def trajectories(self, name: str, file: str, flt: trajview.Filter) -> str:
        run = self.run(name)
        idx = self.index(run, file)
        items = idx.refresh()
        base = f"{run_href(run.name)}/trajectories/{quote(file, safe='')}"
        params = {k: v for k, v in (("step", flt.step), ("task", flt.task), ("flag", flt.flag),
                                    ("passed", None if flt.passed is None else "pass" if flt.passed else "fail"))
                  if v not in (None, "")}
        body = [trajview.trajectory_list(
            items, file, lambda n: f"{base}/{n}", flt,
            lambda p: base + "?" + urlencode({**params, "page": p}), idx.problems)]
        return self.html(f"looprl — {run.name} — {file}", body, refresh=False)

    def trajectory(self, name: str, file: str, n: int) -> str:
        run = self.run(name)
        idx = self.index(run, file)
        traj = idx.read(n)
        if traj is None:
            raise HTTPException(404, f"{file}.jsonl of run {run.name} has no trajectory #{n}")
        base = f"{run_href(run.name)}/trajectories/{quote(file, safe='')}"
        ns = [s.n for s in idx.items]
        i = ns.index(n)
        body = [trajview.trajectory_view(
            traj, self.tokenizer(run), title=f"{run.name} · {file} #{n}",
            prev_href=f"{base}/{ns[i - 1]}" if i > 0 else None,
            next_href=f"{base}/{ns[i + 1]}" if i + 1 < len(ns) else None, list_href=base)]
        return self.html(f"looprl — {run.name} — {file} #{n}", body, refresh=False)

    def export(self) -> str:
        """Every run in detail, the comparison, the fleet (one sample) and the A/B test, with the
        scripts and images inlined; no refresh, no links to the server."""
        runs = self.runs()
        body = [render.runs_table(runs, None)] if runs else []  # as the overview: no empty list
        if len(runs) > 1:
            body.append(_guard("compare", lambda: render.compare_section(runs)))
        for i, run in enumerate(runs):
            body += [_guard(f"run {run.name}", functools.partial(_main_section, run, f"r{i}")),
                     _guard("evaluation", functools.partial(render.eval_section, run)),
                     _guard("report", functools.partial(render.report_section, run,
                                                        functools.partial(_file_data_uri, run))),
                     _guard("config", functools.partial(render.config_section, run.config))]
        body += [fleet_panel(self, runs), feedback_panel(self, runs)]
        return render.page("looprl report", body, assets=render.INLINE,
                           note=f"exported {time.strftime('%Y-%m-%d %H:%M:%S')}")

    def summary(self) -> dict[str, Any]:
        runs = self.runs()
        fleet, fb = self.fleet(), self.feedback()
        return {
            "runs": [{"name": r.name, "path": str(r.path), "steps": len(r.rows), "last": r.last,
                      "skipped_steps": r.skipped_steps, "trajectory_files": list(r.trajectory_files),
                      "problems": list(r.problems), "status": r.state.status,
                      **({"loop": {"cycles": len(r.cycles), "result": r.result}} if r.is_loop
                         else {})} for r in runs],
            "fleet": None if fleet is None else {"url": fleet.url, "metrics": fleet.metrics,
                                                 "error": fleet.error},
            "feedback": None if fb is None else {
                "path": str(fb.path), "error": fb.error, "sessions": fb.sessions,
                "report": fb.report.to_dict() if fb.report else None,
                "cycles": [asdict(c) for c in fb.cycles]},
        }


def _main_section(run: RunData, prefix: str) -> str:
    """A training run's cards, curves and infrastructure failures, or a real-time loop's result,
    cycles and final A/B."""
    if run.is_loop:
        return loop_section(run, prefix)
    return render.run_section(run, prefix) + infra_section(run, prefix)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _image_path(run: RunData, src: str) -> Path | None:
    """A picture directly inside the run directory (report.md's charts), else None."""
    if "/" in src or "\\" in src or Path(src).suffix.lower() not in IMAGE_TYPES:
        return None
    path = run.path / src
    try:
        ok = path.is_file() and path.resolve().parent == run.path.resolve()
    except OSError:
        return None
    return path if ok else None


def _file_url(run: RunData, src: str) -> str | None:
    return f"{run_href(run.name)}/files/{quote(src)}" if _image_path(run, src) else None


def _file_data_uri(run: RunData, src: str) -> str | None:
    path = _image_path(run, src)
    return render.data_uri(path.read_bytes(), IMAGE_TYPES[path.suffix.lower()]) if path else None


# -- overview panels: (dash, runs) -> html; append one to add a view --------------------------------

def runs_panel(dash: Dashboard, runs: list[RunData]) -> str:
    if not runs:
        return ""
    return render.runs_table(runs, lambda r: run_href(r.name),
                             compare_action="/compare" if len(runs) > 1 else None)


def curves_panel(dash: Dashboard, runs: list[RunData]) -> str:
    if not any(r.rows for r in runs):
        return ""
    if len(runs) == 1:
        run = runs[0]
        return (f'<section id="curves"><h2>{render.link(run_href(run.name), run.name)}</h2>'
                f"{render.run_cards(run)}{render.skipped_note(run)}"
                + render.charts_grid(render.run_charts(run.rows, render.TRAINING_PANELS[:6]), "ov")
                + "</section>")
    return ('<section id="curves"><h2>main curves, all runs</h2>'
            + render.charts_grid(render.compare_charts(runs, render.OVERVIEW_METRICS), "ov")
            + "</section>")


def fleet_panel(dash: Dashboard, runs: list[RunData]) -> str:
    fleet = dash.fleet()
    return "" if fleet is None else render.fleet_section(fleet, dash.pool_chart())


def feedback_panel(dash: Dashboard, runs: list[RunData]) -> str:
    fb = dash.feedback()
    return "" if fb is None else render.feedback_section(fb)


OVERVIEW_PANELS: list[Callable[[Dashboard, list[RunData]], str]] = [
    runs_panel, curves_panel, fleet_panel, feedback_panel]


def _guard(what: str, build: Callable[[], str]) -> str:
    """A section that failed to render says so; the rest of the page still shows."""
    try:
        return build()
    except HTTPException:
        raise
    except Exception as e:  # noqa: BLE001 — one broken input must not blank the dashboard
        return (f"<section><h2>{render.esc(what)}</h2>"
                + render.problems([f"this section failed to render: {type(e).__name__}: {e}"],
                                  "error") + "</section>")


def _authorizer(token: str) -> Callable[[Scope], bool]:
    """Whether a request carries ``token``: as a bearer header, the cookie, or ``?token=``."""
    want = token.encode()

    def authorized(scope: Scope) -> bool:
        req = Request(scope)
        return any(hmac.compare_digest(got.encode("utf-8", "surrogateescape"), expected)
                   for got, expected in ((req.headers.get("authorization", ""), b"Bearer " + want),
                                         (req.cookies.get(COOKIE, ""), want),
                                         (query_param(scope, "token"), want)))
    return authorized


def _remember(token: str | None) -> Callable[[Request, Response], None]:
    """Security headers on every page; a browser that came with ?token= gets a cookie, so the
    in-place refresh and the scripts pass."""
    def remember(request: Request, response: Response) -> None:
        response.headers.update(HEADERS)
        if token and hmac.compare_digest(request.query_params.get("token", "").encode(
                "utf-8", "surrogateescape"), token.encode()):
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
    return remember


def create_app(cfg: DashboardConfig) -> FastAPI:
    """The FastAPI app; see the module docstring for routes and auth."""
    dash = Dashboard(cfg)
    app = FastAPI(title="looprl dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.dashboard = dash

    app.add_middleware(Guard, authorized=_authorizer(cfg.token) if cfg.token else None,
                       open_paths={"/healthz"}, max_body=lambda _path: 64 << 10,
                       auth_hint="send 'Authorization: Bearer <token>' or open the page once "
                                 "with ?token=<token>")
    install_error_handlers(app)

    guard = [Depends(_remember(cfg.token))]
    static = {name: (render.STATIC / name).read_bytes() for name in render.SCRIPTS}

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "runs": len(dash.run_paths())}

    @app.get("/", response_class=HTMLResponse, dependencies=guard)
    def overview() -> str:
        return dash.overview()

    @app.get("/runs/{name}", response_class=HTMLResponse, dependencies=guard)
    def run_page(name: str) -> str:
        return dash.run_page(name)

    @app.get("/runs/{name}/trajectories/{file}", response_class=HTMLResponse, dependencies=guard)
    def trajectories(name: str, file: str, step: str = "", task: str = "", flag: str = "",
                     passed: str = "", page: Annotated[int, Query(ge=0)] = 0) -> str:
        if step.strip() and not step.strip().isdigit():
            raise HTTPException(422, f"step must be a whole number, got {step!r}")
        if passed not in ("", "pass", "fail"):
            raise HTTPException(422, f"passed must be pass or fail, got {passed!r}")
        flt = trajview.Filter(int(step) if step.strip() else None, task, flag,
                              {"": None, "pass": True, "fail": False}[passed], page)
        return dash.trajectories(name, file, flt)

    @app.get("/runs/{name}/trajectories/{file}/{n}", response_class=HTMLResponse,
             dependencies=guard)
    def trajectory(name: str, file: str, n: int) -> str:
        return dash.trajectory(name, file, n)

    @app.get("/runs/{name}/files/{fname}", dependencies=guard)
    def run_file(name: str, fname: str) -> Response:
        run = dash.run(name)
        path = _image_path(run, fname)
        if path is None:
            raise HTTPException(404, f"run {name} has no picture {fname!r} (only .png/.jpg/.gif "
                                     "files directly in the run directory are served)")
        return Response(path.read_bytes(), media_type=IMAGE_TYPES[path.suffix.lower()],
                        headers=HEADERS)

    @app.get("/compare", response_class=HTMLResponse, dependencies=guard)
    def compare(run: Annotated[list[str] | None, Query()] = None) -> str:
        return dash.compare(run or [])

    @app.get("/static/{fname}", dependencies=guard)
    def static_file(fname: str) -> Response:
        if fname not in static:
            raise HTTPException(404, f"no static file {fname!r}")
        return Response(static[fname], media_type="text/javascript; charset=utf-8",
                        headers={**HEADERS, "Cache-Control": "no-cache"})

    @app.get("/fleet", response_class=HTMLResponse, dependencies=guard)
    def fleet() -> str:
        return fleet_page(dash)

    @app.get("/api/summary", dependencies=guard)
    def summary() -> dict[str, Any]:
        return dash.summary()

    return app


def export_html(cfg: DashboardConfig, out: Path) -> Path:
    """Write one self-contained HTML file (scripts, styles and pictures inline; no request to
    anything when opened)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(Dashboard(cfg).export(), encoding="utf-8")
    return out
