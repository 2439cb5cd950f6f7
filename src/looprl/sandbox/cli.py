"""``looprl sandbox``: run one command in a fresh sandbox, or serve the environment server.

    looprl sandbox run --base ./repo --venv ./repo/.venv --timeout 30 -- python -m pytest -q
    looprl sandbox serve --port 8377 --max-running 32     # token: --token or LOOPRL_SANDBOX_TOKEN
"""

from __future__ import annotations

import asyncio
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
    """Run CMD in a fresh sandbox over BASE and exit with its exit code (124 on timeout)."""
    from looprl.sandbox import create_sandbox

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
          ) -> None:
    """Serve a sandbox pool over HTTP until interrupted (Ctrl-C / SIGTERM close every sandbox)."""
    import uvicorn

    from looprl.sandbox.pool import SandboxPool
    from looprl.sandbox.server import create_app, default_token

    tok = token or default_token()
    pool = SandboxPool(max_running=max_running, lease_timeout_s=lease_timeout)
    typer.echo(f"environment server on http://{host}:{port} (token {tok})")
    uvicorn.run(create_app(pool, tok), host=host, port=port, log_level="warning")
