"""``looprl tasks``: fetch real packages and build validated task files from them.

    looprl tasks fetch inflection==0.5.1
    looprl tasks build inflection==0.5.1 toolz==1.2.0 --out tasks.jsonl --max-tasks 60
    looprl tasks show tasks.jsonl
    looprl tasks import harbor path/to/task-dirs... --out harbor.jsonl
    looprl tasks import swebench rows.parquet --repos clones/ --out swebench.jsonl
    looprl tasks export harbor tasks.jsonl --out harbor-dirs/
    looprl tasks export swebench tasks.jsonl --out rows.jsonl     # + rows.repos/ (git)

A package that cannot be fetched or built is reported and the others go on; the command then
exits 1 (2, with one line, when nothing at all was built). An import or export says, one line
each, which tasks it skipped and why (docs/tasks.md); it exits 1 when it skipped any.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from looprl.errors import TaskError

app = typer.Typer(help="Real tasks from real packages: fetch, build, inspect; import and export "
                  "Harbor and SWE-bench tasks.", no_args_is_help=True)
import_app = typer.Typer(help="Tasks in other formats -> a looprl task file (docs/tasks.md).",
                         no_args_is_help=True)
export_app = typer.Typer(help="A looprl task file -> tasks in other formats (docs/tasks.md).",
                         no_args_is_help=True)
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")


@app.command("fetch")
def fetch_cmd(specs: Annotated[list[str], typer.Argument(help="NAME==VERSION ...")]) -> None:
    """Download, build a test venv, and record the passing tests of each package."""
    from looprl.tasks.sources import fetch_package

    rejected = 0
    for spec in specs:
        try:
            s = fetch_package(spec)
        except TaskError as e:
            typer.echo(f"{spec}: rejected: {e}", err=True)
            rejected += 1
            continue
        typer.echo(f"{s.key}: {len(s.passing_tests)} passing tests, {len(s.source_files)} source "
                   f"files, suite {s.suite_wall_s:.1f}s, repo {s.repo}")
    if rejected:
        raise typer.Exit(1)


@app.command("build")
def build_cmd(
    specs: Annotated[list[str], typer.Argument(help="NAME==VERSION ...")],
    out: Annotated[Path, typer.Option("--out", help="JSONL task file to write", dir_okay=False)],
    max_tasks: Annotated[int, typer.Option(help="mutation tasks per package (all mutation kinds)",
                                           min=1)] = 60,
    releases: Annotated[int, typer.Option(help="earlier releases to diff against (0 = none)",
                                          min=0)] = 2,
    validate: Annotated[str, typer.Option(help="oracle | patch | none")] = "oracle",
    budget_s: Annotated[float, typer.Option(help="screening budget per package, seconds")] = 90.0,
    max_tries: Annotated[int, typer.Option(
        help="candidate bugs screened per package at most: the same tasks on any machine "
             "(0 = --budget-s alone decides)", min=0)] = 0,
    kinds: Annotated[str, typer.Option(
        help="mutation kinds: 'single' (all single-site kinds), 'local' (bugs whose fix can be "
             "read off the changed line: what a small model can learn) or a comma list")
    ] = "single",
    mix: Annotated[str, typer.Option(
        help="share of each source kind, e.g. mutation=1 or mutation=0.55,multi_site=0.2,"
             "feature_deletion=0.25")] = "mutation=0.55,multi_site=0.2,feature_deletion=0.25",
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Build validated tasks from each package and print a summary table."""
    from rich.progress import TaskID

    from looprl.progress import Bar
    from looprl.tasks import mutate
    from looprl.tasks.build import BuildConfig, build_package_tasks
    from looprl.tasks.releases import build_release_tasks
    from looprl.tasks.sources import fetch_package
    from looprl.tasks.taskset import print_table, write_tasks

    named = {"single": mutate.SINGLE_KINDS, "local": mutate.LOCAL_KINDS}
    kind_list = named.get(kinds) or tuple(k.strip() for k in kinds.split(",") if k.strip())
    try:
        shares = {k.strip(): float(v) for k, v in (p.split("=", 1) for p in mix.split(",") if p)}
    except ValueError:
        raise TaskError(f"--mix {mix!r}: write kind=share pairs separated by commas, e.g. "
                        "mutation=0.6,feature_deletion=0.4") from None
    cfg = BuildConfig(max_tasks=max_tasks, validate=validate, budget_s=budget_s,
                      max_tries=max_tries, kinds=kind_list, mix=shares, seed=seed)
    all_tasks, skipped = [], []
    with Bar() as bar:
        job = bar.add_task("packages", total=len(specs))
        for spec in specs:
            bar.update(job, description=spec)
            sub = bar.add_task(f"  {spec} tasks", total=max_tasks)

            def tick(what: str, n: int, sub: TaskID = sub, spec: str = spec,
                     tried: list[int] = [0]) -> None:  # noqa: B006 (one list per package)
                if what == "validated":
                    bar.advance(sub, n)
                elif what == "tried":  # off a terminal, the minute's line says it is screening
                    tried[0] += n
                    bar.update(sub, description=f"  {spec} tasks ({tried[0]} bugs tried)")

            try:
                snap = fetch_package(spec)
                if "==" not in spec:  # the newest release today: another one on another day
                    bar.console.print(f"{spec}: no version given, using the newest release, "
                                      f"{snap.name}=={snap.version} (pin it for the same tasks "
                                      "on any machine)", highlight=False)
                if not bar.console.is_terminal:  # no live bar: say what the wait is
                    bar.console.print(f"{snap.name}=={snap.version}: screening candidate bugs "
                                      f"(at most {budget_s:g} s), a progress line a minute",
                                      highlight=False)
                all_tasks += build_package_tasks(snap, cfg, tick)
                if releases:
                    all_tasks += build_release_tasks(snap, releases, cfg, tick)
            except TaskError as e:
                bar.console.print(f"[red]{spec}: skipped: {e}")
                skipped.append(spec)
            bar.advance(job)
    if not all_tasks:
        raise TaskError(f"no tasks built from {', '.join(specs)}"
                        + (" (every package was skipped; reasons above)" if skipped else
                           "; try more --budget-s or other packages"))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_tasks(all_tasks, out)
    print_table(all_tasks)
    typer.echo(f"wrote {len(all_tasks)} tasks to {out}")
    if skipped:
        typer.echo(f"{len(skipped)} of {len(specs)} packages skipped: {', '.join(skipped)}", err=True)
        raise typer.Exit(1)


@app.command("show")
def show_cmd(path: Annotated[Path, typer.Argument(help="JSONL task file", exists=True,
                                                   dir_okay=False)]) -> None:
    """Check a task file and print its summary table."""
    from looprl.tasks.taskset import load_tasks, print_table

    tasks = load_tasks(path)
    if not tasks:
        raise TaskError(f"{path} holds no tasks; build some with `looprl tasks build`")
    print_table(tasks)


def _store_for(out: Path) -> Path:
    """Where an import keeps its tasks' repos and verifier files: beside the task file (as an
    absolute path, which the task file records)."""
    return out.resolve().with_name(out.stem + "-files")


def _finish_import(report: object, out: Path, what: str) -> None:
    from looprl.tasks.imported import ImportReport
    from looprl.tasks.taskset import print_table, write_tasks

    assert isinstance(report, ImportReport)
    for line in report.lines():
        typer.echo(line, err=True)
    if not report.tasks:
        raise TaskError(f"no task imported from {what}" + (" (reasons above)" if report.skipped
                                                            else ""))
    write_tasks(report.tasks, out)
    print_table(report.tasks)
    typer.echo(f"wrote {len(report.tasks)} tasks to {out} (their files in {_store_for(out)})")
    if report.skipped:
        typer.echo(f"{len(report.skipped)} skipped", err=True)
        raise typer.Exit(1)


@import_app.command("harbor")
def import_harbor_cmd(
    dirs: Annotated[list[Path], typer.Argument(help="Harbor task directories, or directories "
                                                    "holding them")],
    out: Annotated[Path, typer.Option("--out", help="JSONL task file to write", dir_okay=False)],
    jobs: Annotated[int, typer.Option(help="tasks validated at once", min=1)] = 2,
) -> None:
    """Import Harbor task directories: realise each environment, run its oracle, validate."""
    import asyncio

    from looprl.tasks.harbor import import_harbor

    report = asyncio.run(import_harbor(dirs, _store_for(out), jobs=jobs))
    _finish_import(report, out, ", ".join(map(str, dirs)))


@import_app.command("swebench")
def import_swebench_cmd(
    rows: Annotated[Path, typer.Argument(help="JSONL or parquet rows", exists=True,
                                         dir_okay=False)],
    out: Annotated[Path, typer.Option("--out", help="JSONL task file to write", dir_okay=False)],
    repos: Annotated[Path | None, typer.Option(help="directory of git clones (OWNER__NAME[.git]"
                                               " or NAME[.git]): where repositories come from "
                                               "offline", file_okay=False)] = None,
    flavour: Annotated[str, typer.Option(help="auto | swebench | swegym | swesmith | r2egym")
                       ] = "auto",
    jobs: Annotated[int, typer.Option(help="tasks validated at once", min=1)] = 2,
    limit: Annotated[int, typer.Option(help="only the first N rows (0 = all)", min=0)] = 0,
    grade_by: Annotated[str, typer.Option(help="auto | eval_script | tests: grade by the row's "
                                          "eval_script log, or by looprl's pytest grader")
                        ] = "auto",
) -> None:
    """Import SWE-bench-family rows: check out each repository, build its venv, validate."""
    import asyncio

    from looprl.tasks.swebench import import_swebench

    report = asyncio.run(import_swebench(rows, _store_for(out), repos=repos, flavour=flavour,
                                         jobs=jobs, limit=limit, grade_by=grade_by))
    _finish_import(report, out, str(rows))


def _export_done(written: int, skipped: list[tuple[str, str]], where: Path) -> None:
    for tid, why in skipped:
        typer.echo(f"{tid}: not exported: {why}", err=True)
    if not written:
        raise TaskError("no task exported" + (" (reasons above)" if skipped else ""))
    typer.echo(f"wrote {written} tasks to {where}")
    if skipped:
        raise typer.Exit(1)


@export_app.command("harbor")
def export_harbor_cmd(
    tasks: Annotated[Path, typer.Argument(help="JSONL task file", exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option("--out", help="directory to write task dirs into",
                                      file_okay=False)],
) -> None:
    """Write each task as a Harbor task directory (tests/test.sh writes reward.txt)."""
    from looprl.tasks.harbor import export_harbor
    from looprl.tasks.taskset import load_tasks

    written, skipped = export_harbor(load_tasks(tasks), out)
    _export_done(len(written), skipped, out)


@export_app.command("swebench")
def export_swebench_cmd(
    tasks: Annotated[Path, typer.Argument(help="JSONL task file", exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option("--out", help="rows to write (.jsonl or .parquet)",
                                      dir_okay=False)],
) -> None:
    """Write the tasks as SWE-bench rows, their repositories as git repos beside them."""
    from looprl.tasks.swebench import export_swebench
    from looprl.tasks.taskset import load_tasks

    n, skipped, repos = export_swebench(load_tasks(tasks), out)
    if n:
        typer.echo(f"repositories (git, one commit per task base) in {repos}: pass --repos "
                   f"{repos} to `looprl tasks import swebench`")
    _export_done(n, skipped, out)
