import io

from rich.console import Console
from rich.progress import TextColumn

from looprl.progress import Bar


def test_a_bar_off_a_terminal_logs_a_plain_line_per_interval():
    out = io.StringIO()
    with Bar(TextColumn("pretrain"), console=Console(file=out, width=100), every=0.0) as bar:
        job = bar.add_task("pretrain", total=4, loss=float("nan"))
        bar.update(job, advance=1, loss=2.5)
        bar.advance(job, 1)
    lines = [s for s in out.getvalue().splitlines() if s.startswith("pretrain ")]
    assert lines[:2] == ["pretrain 1/4 (25%) loss 2.5 [0:00]", "pretrain 2/4 (50%) loss 2.5 [0:00]"]


def test_a_bar_logs_nothing_before_its_interval_nor_on_a_terminal_nor_when_disabled():
    for console, kwargs in ((Console(file=io.StringIO(), width=100), {"every": 3600.0}),
                            (Console(file=io.StringIO(), width=100, force_terminal=True),
                             {"every": 0.0}),
                            (Console(file=io.StringIO(), width=100), {"every": 0.0,
                                                                      "disable": True})):
        with Bar(console=console, **kwargs) as bar:
            job = bar.add_task("tasks", total=None)
            for _ in range(3):
                bar.advance(job)
        assert "tasks 1" not in console.file.getvalue()
