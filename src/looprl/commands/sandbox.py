"""``looprl sandbox``: run one command in a fresh sandbox, or serve the environment server.

    looprl sandbox run --base ./repo --venv ./repo/.venv --timeout 30 -- python -m pytest -q
    looprl sandbox serve --port 8377 --max-running 32 --allowed-root /data/repos
                                                    # token: --token or LOOPRL_SANDBOX_TOKEN
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from looprl.errors import SandboxError

app = typer.Typer(help="Sandboxes: run a command isolated over a repository; the env server.",
                  no_args_is_help=True)


@app.command(context_settings={"allow_interspersed_args": False})
def run(cmd: Annotated[list[str], typer.Argument(help="The command (after --).")],
        base: Annotated[Path, typer.Option(help="Repository directory (never modified).")],
        venv: Annotated[str | None, typer.Option(help="A venv, mounted read-only.")] = None,
        timeout: Annotated[float, typer.Option(help="Wall-clock limit in seconds.")] = 60.0,
        diff: Annotated[bool, typer.Option(help="Print the workspace diff to stderr.")] = False,
        ) -> None:
    """Run CMD in a fresh sandbox over BASE and exit with its exit code (124 on timeout; 125 when
    the sandbox cannot run it, e.g. BASE is missing)."""
    import asyncio

    from looprl.sandbox import create_sandbox

    if not 0 < timeout < float("inf"):
        raise typer.BadParameter(f"must be a finite number of seconds > 0, got {timeout}",
                                 param_hint="--timeout")

    async def go() -> int:
        sb = await create_sandbox(base, venv)
        try:
            r = await sb.exec(shlex.join(cmd), timeout_s=timeout)
            sys.stdout.write(r.stdout)
            sys.stderr.write(r.stderr)
            if diff:
                sys.stderr.write(await sb.diff())
            return 124 if r.timed_out else (137 if r.exit_code is None else r.exit_code)
        finally:
            await sb.close()

    try:
        code = asyncio.run(go())
    except SandboxError as e:
        typer.echo(f"sandbox error: {e}", err=True)
        raise typer.Exit(125) from e
    raise typer.Exit(code)


@app.command()
def serve(host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
          port: Annotated[int, typer.Option(help="TCP port.")] = 8377,
          token: Annotated[str | None, typer.Option(
              help="Bearer token (default: LOOPRL_SANDBOX_TOKEN or a random one, printed).")] = None,
          max_running: Annotated[int, typer.Option(help="Sandboxes leased at once.")] = 16,
          lease_timeout: Annotated[float, typer.Option(help="Lease expiry, seconds.")] = 3600.0,
          allowed_root: Annotated[list[Path], typer.Option(
              help="base_dir/venv must lie under this directory (repeatable; default: looprl's "
                   "home, LOOPRL_HOME).")] = [],  # noqa: B006
          idle_timeout: Annotated[float, typer.Option(
              help="Release a lease after this many seconds without a request or heartbeat "
                   "(its client went away).")] = 60.0,
          max_body_mb: Annotated[float, typer.Option(help="Largest request body, MiB.")] = 16.0,
          drain: Annotated[float, typer.Option(
              help="On SIGTERM: seconds running requests may finish before they are cancelled "
                   "and every sandbox is closed.")] = 30.0,
          ) -> None:
    """Serve a sandbox pool over HTTP until SIGTERM/Ctrl-C, then drain and close every sandbox
    (``LOOPRL_FAULTS`` fails its sandbox creations and commands on purpose, ``looprl.faults``)."""
    from looprl import faults
    from looprl.asgi import Drain, run
    from looprl.sandbox.pool import SandboxPool
    from looprl.sandbox.server import EnvServerConfig, create_app, default_token

    for r in allowed_root:
        if not r.is_dir():
            raise typer.BadParameter(f"--allowed-root {r} is not a directory")
    if not (lease_timeout > 0 and idle_timeout > 0 and drain > 0 and max_body_mb > 0):
        raise typer.BadParameter("--lease-timeout, --idle-timeout, --drain and --max-body-mb "
                                 "must be > 0")
    cfg = EnvServerConfig(allowed_roots=tuple(str(r.resolve()) for r in allowed_root),
                          idle_timeout_s=idle_timeout, max_body_bytes=int(max_body_mb * 2**20),
                          drain_s=drain)
    tok = token or default_token()
    faults.install_from_env("env-server")
    pool = SandboxPool(max_running=max_running, lease_timeout_s=lease_timeout)
    roots = ", ".join(str(r) for r in cfg.roots())
    typer.echo(f"environment server on http://{host}:{port} (token {tok}; allowed roots {roots})")
    d = Drain()
    run(create_app(pool, tok, cfg, d), host=host, port=port, drain=d, drain_s=drain)
