"""``looprl bench``: run a policy on a task file and gate checkpoints on the result.

    looprl bench run --policy oracle --tasks tasks.jsonl --k 1 --out bench/oracle.json
    looprl bench run --tasks tasks.jsonl --selection function   # prompts carry the enclosing def
    looprl bench run --policy model:~/.cache/looprl/models/default --tasks t.jsonl --k 4 --out b.json
    looprl bench compare bench/base.json bench/cand.json      # exit code 1 when the gate fails
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from looprl.errors import TaskError

app = typer.Typer(help="Benchmark a policy on held-out tasks; compare runs and gate checkpoints.",
                  no_args_is_help=True)


@app.command("run")
def run_cmd(
    tasks: Annotated[Path, typer.Option("--tasks", help="JSONL task file (looprl tasks build)",
                                        exists=True, dir_okay=False)],
    policy: Annotated[str, typer.Option(help="oracle | null | model:PATH | openai:URL,tokenizer=PATH")] = "oracle",
    k: Annotated[int, typer.Option("--k", help="samples per task (pass@k)", min=1)] = 1,
    out: Annotated[Path, typer.Option(help="report JSON (.md and .png written beside)",
                                      dir_okay=False)] = Path("bench.json"),
    limit: Annotated[int, typer.Option(help="only the first N tasks (0 = all)", min=0)] = 0,
    concurrency: Annotated[int, typer.Option(help="samples in flight", min=1)] = 2,
    max_turns: Annotated[int, typer.Option(help="agent turns per sample", min=1)] = 30,
    selection: Annotated[str, typer.Option(
        help="append the editor selection first: line | block | function | none")] = "none",
) -> None:
    """Run POLICY on every task K times through the harness and grade each sample
    (``LOOPRL_FAULTS`` injects infrastructure failures, ``looprl.faults``)."""
    from looprl import faults
    from looprl.bench.report import markdown, summarize, write_report
    from looprl.bench.run import BenchSettings, run_bench
    from looprl.progress import Bar
    from looprl.tasks.taskset import load_tasks

    ts = load_tasks(tasks)
    if not ts:
        raise TaskError(f"{tasks} holds no tasks; build some with `looprl tasks build`")
    if limit:
        ts = ts[:limit]
    if selection != "none":  # the width a run trained at (tasks.experimental.selection_width)
        from looprl.config import check_choice
        from looprl.harness.selection import WIDTHS
        from looprl.train.tasks import select_code

        check_choice("--selection", selection, WIDTHS)
        ts = [select_code(t, width=selection) for t in ts]
    out.parent.mkdir(parents=True, exist_ok=True)  # before the run: a report is never lost
    settings = BenchSettings(concurrency=concurrency, max_turns=max_turns)
    faults.install_from_env("bench")
    with Bar() as bar:
        job = bar.add_task(f"{policy} x{k}", total=len(ts) * k)
        samples = run_bench(ts, policy, k, settings, progress=lambda n: bar.advance(job, n))
    rep = summarize(samples, k, policy=policy, tasks_file=str(tasks))
    paths = write_report(rep, out)
    typer.echo(markdown(rep))
    typer.echo("wrote " + ", ".join(map(str, paths)))


@app.command("compare")
def compare_cmd(
    a: Annotated[Path, typer.Argument(help="baseline report (bench run --out)", exists=True,
                                      dir_okay=False)],
    b: Annotated[Path, typer.Argument(help="candidate report", exists=True, dir_okay=False)],
    max_drop: Annotated[float, typer.Option(help="largest pass@1 drop tolerated at the CI bound")] = 0.02,
    min_gain: Annotated[float, typer.Option(help="require a pass@1 gain above this at the CI bound")] = 0.0,
    n_boot: Annotated[int, typer.Option(help="bootstrap resamples", min=100)] = 2000,
    max_infra_share: Annotated[float, typer.Option(
        help="refuse to gate when more of a report's samples failed as infrastructure",
        min=0.0, max=1.0)] = 0.05,
    max_infra_increase: Annotated[float, typer.Option(
        help="fail B when its infrastructure share exceeds A's by more", min=0.0, max=1.0)] = 0.0,
) -> None:
    """Per-metric differences B - A with paired bootstrap CIs; exit 1 if the gate fails or
    refuses (too many infrastructure failures to judge)."""
    from looprl.bench.gate import compare, comparison_markdown, load

    c = compare(load(a), load(b), n_boot=n_boot, max_drop=max_drop, min_gain=min_gain,
                max_infra_share=max_infra_share, max_infra_increase=max_infra_increase)
    typer.echo(comparison_markdown(c))
    raise typer.Exit(0 if c.passed else 1)
