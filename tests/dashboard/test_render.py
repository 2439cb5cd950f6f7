"""Chart data and markup: every logged metric of a panel gets its own line; text is escaped."""

from __future__ import annotations

from pathlib import Path

from looprl.dashboard import render
from looprl.dashboard.data import RunData, load_run

from .conftest import STEPS


def test_every_logged_metric_of_a_panel_is_a_line(grpo_run: Path):
    run = load_run(grpo_run)
    for panels in (render.TRAINING_PANELS, render.THROUGHPUT_PANELS):
        series = render.run_series(run.rows, panels)
        for title, keys in panels:
            want = [k for k in keys if k in run.last] if "reward/*" not in keys else [
                k for k in run.last if k.startswith("reward/") and k != "reward/total_mean"]
            if not want:
                assert title not in series
                continue
            xs, lines = series[title]
            assert xs == [float(s) for s in range(1, STEPS + 1)]
            assert len(lines) == len(want), (title, list(lines))
            assert all(len(ys) == STEPS for ys in lines.values())
    xs, lines = render.run_series(run.rows, render.THROUGHPUT_PANELS)["throughput (tokens/s)"]
    assert lines["train/tokens_per_s"][-1] == run.last["train/tokens_per_s"]


def test_strings_from_files_are_escaped(tmp_path: Path):
    run = RunData("<b>x</b>", tmp_path, ({"step": 1, "reward/total_mean": 0.5},),
                  ("line 3 <script>alert(1)</script>",), report_md="<img src=x onerror=alert(1)>")
    html = render.training_section(run, b"")
    assert "<script>" not in html and "<img src=x" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
