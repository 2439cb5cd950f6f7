"""Chart data and markup: every logged metric of a panel is a line, skipped steps are gaps on grey
bands, run data cannot inject markup or script, small A/B samples carry a warning."""

from __future__ import annotations

import doctest
import json
import re
from pathlib import Path

from looprl.dashboard import markdown, render, trajview
from looprl.dashboard.data import TRAINED_ONLY, RunData, load_feedback, load_run
from looprl.feedback.ab import ABReport, ArmMetrics, Decision, Diff

from .conftest import SKIPPED_STEP, STEPS


def test_doctests():
    for mod in (render, markdown):
        assert doctest.testmod(mod).failed == 0


def _chart_data(html: str) -> list[dict]:
    return [json.loads(b) for b in re.findall(
        r'<script type="application/json" id="[^"]+">(.*?)</script>', html)]


def test_every_logged_metric_of_a_panel_is_a_line(grpo_run: Path):
    run = load_run(grpo_run)
    for panels in (render.TRAINING_PANELS, render.THROUGHPUT_PANELS):
        charts = {c.title: c for c in render.run_charts(run.rows, panels)}
        for title, keys in panels:
            want = [k for k in keys if k in run.last] if "reward/*" not in keys else [
                k for k in run.last if k.startswith("reward/") and k != "reward/total_mean"]
            if not want:
                assert title not in charts
                continue
            c = charts[title]
            assert c.x == [float(s) for s in range(1, STEPS + 1)]
            assert c.skipped == (float(SKIPPED_STEP),)
            assert len(c.series) == len(want), (title, list(c.series))
            for key, ys in zip(want, c.series.values(), strict=True):
                assert len(ys) == STEPS
                assert (ys[SKIPPED_STEP - 1] is None) == (key in TRAINED_ONLY), (key, ys)
    (c,) = [c for c in render.run_charts(run.rows, render.THROUGHPUT_PANELS) if "tokens/s" in c.title]
    assert c.series["train/tokens_per_s"][-1] == run.last["train/tokens_per_s"]


def test_run_section_embeds_chart_data_with_gaps(grpo_run: Path):
    html = render.run_section(load_run(grpo_run), "r0")
    data = {d["title"]: d for d in _chart_data(html)}
    ratio = data["IS ratio trainer/engine"]
    assert ratio["skipped"] == [SKIPPED_STEP]
    assert [s["values"][SKIPPED_STEP - 1] for s in ratio["series"]] == [None, None]
    assert data["pass rate (hidden tests)"]["unit"] is True
    assert f"1 of {STEPS} steps trained on no token" in html
    # the IS ratio card shows the newest measured value, not the skipped step's 0
    assert re.search(r'<div class="k">IS ratio</div><div class="v">0\.0\d+</div>', html)


def test_strings_from_files_are_escaped(tmp_path: Path):
    evil = "</script><script>alert(1)</script>"
    run = RunData("<b>x</b>", tmp_path, ({"step": 1, "reward/total_mean": 0.5, evil: 1.0},),
                  ("line 3 <script>alert(1)</script>",),
                  report_md="<img src=x onerror=alert(1)>\n\n[a](javascript:alert(1)) **b**",
                  config={"name": evil})
    html = (render.run_section(run, "r0") + render.report_section(run, None)
            + render.config_section(run.config) + render.runs_table([run], None))
    assert "<script>" not in html and "<img src=x" not in html and "javascript:" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<strong>b</strong>" in html
    # a metric name that tries to close the data block stays inside it, as JSON
    blocks = re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', html, re.S)
    assert blocks and all("</script" not in b for b in blocks)


def test_trajectory_view_escapes_and_shows_everything(grpo_run: Path):
    from looprl.dashboard.data import TrajectoryIndex

    t = TrajectoryIndex(grpo_run / "trajectories" / "eval_rl.jsonl").read(0)
    html = trajview.trajectory_view(t, None, title="x", prev_href=None, next_href=None,
                                    list_href="/l")
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)" in html
    assert html.count('class="msg ') == len(t.messages)
    assert '<span class="flag">broken_tool_calls</span>' in html
    assert '<span class="add">+    return a + b</span>' in html
    assert "sampled by policy v1" in html and "sampled by policy v2" in html
    assert html.count('class="tok" style') == sum(s.num_model_tokens for s in t.segments) + 2


def test_small_ab_samples_are_flagged(feedback_db: Path):
    html = render.feedback_section(load_feedback(feedback_db, min_sessions=3))
    assert "small sample (A: 6 vs B: 6 scored sessions)" in html
    assert 'class="intervals small-sample"' in html
    arms = {a: ArmMetrics(a, 200, 180, 0.5, 0.4, 0.8, 0.5, 0.2, 0.1, 9.0) for a in "AB"}
    rep = ABReport(arms, {"reward": Diff("reward", 0.1, 0.02, 0.18)}, Decision("promote", "B wins"))
    from looprl.dashboard.data import FeedbackData

    html = render.feedback_section(FeedbackData(feedback_db, rep, (), 400))
    assert "small sample" not in html and 'class="intervals"' in html


def test_a_moe_run_charts_router_disagreement_per_layer():
    rows = [{"step": s, "train/router_disagree": 0.01 * s, "train/router_disagree_l0": 0.02 * s,
             "train/router_disagree_l1": 0.0, "train/engine_kl": 1e-4} for s in (1, 2)]
    charts = {c.title: c for c in render.run_charts(rows, render.TRAINING_PANELS)}
    moe = charts["MoE router disagreement with the engine, per layer"]
    assert list(moe.series) == ["train/router_disagree", "train/router_disagree_l0",
                                "train/router_disagree_l1"]
    assert moe.series["train/router_disagree_l0"] == [0.02, 0.04]
    assert "train-inference KL (engine || trainer)" in charts


def test_a_hinted_continuation_shows_its_hint_where_it_was_inserted(hinted_run: Path):
    from looprl.dashboard.data import TrajectoryIndex
    from looprl.harness.hinted import turn_messages

    from .conftest import HINT

    t = TrajectoryIndex(hinted_run / "trajectories" / "hinted.jsonl").read(0)
    assert t.hint is not None
    html = trajview.trajectory_view(t, None, title="x", prev_href=None, next_href=None,
                                    list_href="/l")
    # one block per message; the hint's is labelled a hint, not a user or model turn
    assert html.count('class="msg ') == len(t.messages)
    (block,) = re.findall(r'<div class="msg hint" id="m(\d+)">(.*?)</div></div>', html, re.S)
    at = turn_messages(t.messages)[2][1]  # right after turn 3's tool results
    assert int(block[0]) == at and t.messages[at]["content"] == HINT
    assert '<span class="role">hint</span> · broken call · inserted after turn 3' in block[1]
    assert HINT in block[1]
    order = [int(i) for i in re.findall(r'<div class="msg [a-z]+" id="m(\d+)">', html)]
    assert order == list(range(len(t.messages)))  # in place, not appended
    assert html.index(f'id="m{at - 1}"') < html.index(f'id="m{at}"') < html.index(f'id="m{at + 1}"')
    assert f'<div class="msg user" id="m{at}">' not in html
    # the hinted observation's tokens are marked, and none of them is drawn as a sampled token
    assert html.count('class="tok ctx hint"') == t.hint.end - t.hint.start + 1  # + the legend
    assert "hinted from" in html


def test_hint_metrics_are_charted_once_a_step_distilled_one(grpo_run: Path, hinted_run: Path):
    assert "targeted feedback" not in render.run_section(load_run(grpo_run), "r0")  # all 0
    html = render.run_section(load_run(hinted_run), "r0")
    data = {d["title"]: d for d in _chart_data(html)}
    kl = data["hint KL (teacher with hint || student without)"]
    assert [s["values"] for s in kl["series"]] == [[None] + [0.05] * (STEPS - 1)]  # a gap at 1
    assert data["hinted continuations' pass rate"]["unit"] is True
    assert data["hinted continuations distilled"]["series"][0]["values"][0] == 0.0
    assert '<div class="k">hints</div><div class="v">2</div>' in html


def test_a_cycle_with_follow_up_hints_says_what_they_gave():
    from looprl.dashboard.loop_view import cycles_table

    plain = {"cycle": 1, "policy_version": 0, "status": "promoted", "window": {"sessions": 32}}
    hinted = {**plain, "window": {"sessions": 32, "follow_up_hints": 9, "hinted": 8},
              "train": {"hints": 8.0, "hint_kl": 0.0123}}
    assert "follow-ups as hints" not in cycles_table([plain])
    html = cycles_table([hinted])
    assert "9 follow-ups as hints · 8 continued · 8 distilled, hint KL 0.012" in html
