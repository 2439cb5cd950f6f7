"""``looprl tasks``: fetch real packages and build validated task files from them.

    looprl tasks fetch inflection==0.5.1
    looprl tasks build inflection==0.5.1 toolz==1.2.0 --out tasks.jsonl --max-tasks 60
    looprl tasks show tasks.jsonl
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from looprl.errors import TaskError

app = typer.Typer(help="Real tasks from real packages: fetch, build, inspect.", no_args_is_help=True)


@app.command("fetch")
def fetch_cmd(specs: Annotated[list[str], typer.Argument(help="NAME==VERSION ...")]) -> None:
    """Download, build a test venv, and record the passing tests of each package."""
    from looprl.tasks.sources import fetch_package

    for spec in specs:
        try:
            s = fetch_package(spec)
        except TaskError as e:
            typer.echo(f"{spec}: rejected: {e}", err=True)
            continue
        typer.echo(f"{s.key}: {len(s.passing_tests)} passing tests, {len(s.source_files)} source "
                   f"files, suite {s.suite_wall_s:.1f}s, repo {s.repo}")


@app.command("build")
def build_cmd(
    specs: Annotated[list[str], typer.Argument(help="NAME==VERSION ...")],
    out: Annotated[Path, typer.Option("--out", help="JSONL task file to write")],
    max_tasks: Annotated[int, typer.Option(help="mutation tasks per package (all mutation kinds)")] = 60,
    releases: Annotated[int, typer.Option(help="earlier releases to diff against (0 = none)")] = 2,
    validate: Annotated[str, typer.Option(help="oracle | patch | none")] = "oracle",
    budget_s: Annotated[float, typer.Option(help="screening budget per package, seconds")] = 90.0,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Build validated tasks from each package and print a summary table."""
    from rich.progress import Progress

    from looprl.tasks.build import BuildConfig, build_package_tasks
    from looprl.tasks.releases import build_release_tasks
    from looprl.tasks.sources import fetch_package
    from looprl.tasks.taskset import print_table, write_tasks

    cfg = BuildConfig(max_tasks=max_tasks, validate=validate, budget_s=budget_s, seed=seed)
    all_tasks = []
    with Progress() as bar:
        job = bar.add_task("packages", total=len(specs))
        for spec in specs:
            bar.update(job, description=spec)
            sub = bar.add_task(f"  {spec} tasks", total=max_tasks)

            def tick(what: str, n: int, sub: int = sub) -> None:
                if what == "validated":
                    bar.advance(sub, n)

            try:
                snap = fetch_package(spec)
                all_tasks += build_package_tasks(snap, cfg, tick)
                if releases:
                    all_tasks += build_release_tasks(snap, releases, cfg, tick)
            except TaskError as e:
                bar.console.print(f"[red]{spec}: skipped: {e}")
            bar.advance(job)
    write_tasks(all_tasks, out)
    print_table(all_tasks)
    typer.echo(f"wrote {len(all_tasks)} tasks to {out}")


@app.command("show")
def show_cmd(path: Annotated[Path, typer.Argument(help="JSONL task file")]) -> None:
    """Check a task file and print its summary table."""
    from looprl.tasks.taskset import load_tasks, print_table

    print_table(load_tasks(path))
