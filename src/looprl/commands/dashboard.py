"""``looprl dashboard``: watch training runs, their trajectories, the sandbox fleet and the A/B
test in a browser.

    looprl dashboard --run runs [--store feedback.db] \\
        [--env-server http://127.0.0.1:8377 --env-token s3cret] [--port 8500] [--token T]
    looprl dashboard --run runs/qs1 --run runs/qs2        # these runs only
    looprl dashboard export --run runs/qs1 --out report.html    # one self-contained file

Serves on 127.0.0.1 by default; binding another address needs ``--token``.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Training, fleet and feedback dashboards (web app or static HTML export).",
                  invoke_without_command=True)

Runs = Annotated[list[Path] | None, typer.Option("--run", metavar="DIR",
                                                  help="a run directory, or a folder of runs (repeatable)",
                                                  exists=True, file_okay=False)]
Store = Annotated[Path | None, typer.Option("--store", metavar="FILE", help="feedback store (looprl serve --store)",
                                            exists=True, dir_okay=False)]
EnvServer = Annotated[str | None, typer.Option("--env-server", metavar="URL", help="env server URL (looprl sandbox serve)")]
EnvToken = Annotated[str | None, typer.Option("--env-token", envvar="LOOPRL_ENV_TOKEN",
                                              help="bearer token of the env server")]
MinSessions = Annotated[int, typer.Option(help="scored sessions per arm before an A/B decision")]
Experiment = Annotated[str | None, typer.Option(
    "--experiment", metavar="NAME",
    help="the A/B view covers this experiment's sessions only (e.g. a real-time loop's "
         "NAME-final); default: every session in the store")]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.callback()
def serve(
    ctx: typer.Context,
    run: Runs = None,
    store: Store = None,
    env_server: EnvServer = None,
    env_token: EnvToken = None,
    host: Annotated[str, typer.Option(help="bind address (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port", min=0, max=65535)] = 8500,
    token: Annotated[str | None, typer.Option(envvar="LOOPRL_DASHBOARD_TOKEN",
                                              help="bearer token required by the dashboard")] = None,
    refresh: Annotated[int, typer.Option(help="page auto-refresh, seconds (0 = off)")] = 10,
    min_sessions: MinSessions = 100,
    experiment: Experiment = None,
    drain: Annotated[float, typer.Option(
        help="on SIGTERM: seconds open requests may finish before the server exits")] = 10.0,
) -> None:
    """Serve the dashboard (without a sub-command)."""
    if ctx.invoked_subcommand is not None:
        return
    from looprl.dashboard.app import DashboardConfig, create_app

    if not run and store is None and env_server is None:
        raise typer.BadParameter("nothing to show: pass --run DIR (repeatable), --store FILE "
                                 "or --env-server URL")
    if not _is_loopback(host) and not token:
        raise typer.BadParameter(f"--host {host} is reachable from other machines: pass --token "
                                 "(or LOOPRL_DASHBOARD_TOKEN), or keep the default 127.0.0.1")
    if not drain > 0:
        raise typer.BadParameter("--drain must be > 0 seconds")
    from looprl.asgi import run as serve_app

    cfg = DashboardConfig(tuple(run or ()), store, env_server, env_token, token, refresh, min_sessions,
                          experiment)
    typer.echo(f"looprl dashboard on http://{host}:{port}/" + ("?token=..." if token else ""))
    serve_app(create_app(cfg), host=host, port=port, drain_s=drain)


@app.command("export")
def export_cmd(
    run: Runs = None,
    out: Annotated[Path, typer.Option("--out", help="HTML file to write")] = Path("report.html"),
    store: Store = None,
    env_server: EnvServer = None,
    env_token: EnvToken = None,
    min_sessions: MinSessions = 100,
    experiment: Experiment = None,
) -> None:
    """Write one self-contained HTML report (charts and their scripts inlined; for CI artifacts)."""
    from looprl.dashboard.app import DashboardConfig, export_html

    if not run and store is None and env_server is None:
        raise typer.BadParameter("nothing to export: pass --run DIR (repeatable) or --store FILE")
    cfg = DashboardConfig(tuple(run or ()), store, env_server, env_token, None, 0, min_sessions,
                          experiment)
    path = export_html(cfg, out)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
