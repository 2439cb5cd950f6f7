"""``looprl dashboard export`` writes one self-contained HTML file; bad invocations are explained."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from typer.testing import CliRunner

from looprl.commands.dashboard import app
from looprl.dashboard.data import fmt

from .conftest import rows

runner = CliRunner()


def test_export_is_self_contained(grpo_run: Path, feedback_db: Path, tmp_path: Path):
    out = tmp_path / "ci" / "report.html"
    r = runner.invoke(app, ["export", "--run", str(grpo_run), "--store", str(feedback_db),
                            "--min-sessions", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    # nothing is fetched: no src/href but data: URIs and in-page anchors, no <link>
    assert re.findall(r'(?:src|href)="(?![#]|data:)[^"]*"', page) == []
    assert "<link rel=\"stylesheet" not in page and 'data-refresh="0"' in page
    # the chart library and the dashboard script are inline, and the CSP allows exactly them
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(scripts) == 2 and "uPlot" in scripts[0]
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    for s in scripts:
        digest = base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp
    # charts as data, report.md rendered with its picture inlined
    assert page.count('<figure class="chart"') >= 10
    m = re.search(r'<img alt="reward curve" src="data:image/png;base64,([^"]+)"', page)
    assert m and base64.b64decode(m.group(1)) == (grpo_run / "reward_curve.png").read_bytes()
    last = rows(grpo_run)[-1]
    assert f'<div class="v">{fmt(last["reward/total_mean"])}</div>' in page
    assert "feedback and A/B" in page and "resolved config" in page


def test_serve_refuses_bad_invocations(grpo_run: Path):
    r = runner.invoke(app, [])
    assert r.exit_code != 0 and "nothing to show" in r.output
    r = runner.invoke(app, ["--run", str(grpo_run), "--host", "0.0.0.0"])
    assert r.exit_code != 0 and "--token" in r.output


def test_export_shows_one_experiment_when_asked(tmp_path: Path):
    """A loop's store holds every cycle's A/B; ``--experiment`` shows one of them alone."""
    from looprl.feedback.store import FeedbackStore

    from .conftest import make_traj

    db = tmp_path / "fb.db"
    store = FeedbackStore(db)
    for exp, n in (("rt-c2", 3), ("rt-final", 5)):
        for i in range(n):
            for arm in ("A", "B"):
                sid = store.add_session(user=f"{exp}{arm}{i}", arm=arm, policy_version=0,
                                        prompt="fix it", repo="/srv/repo", trajectory=make_traj(),
                                        latency_s=1.0, experiment=exp)
                store.add_event(sid, "kept")
    store.close()
    pages = {}
    for extra in ([], ["--experiment", "rt-final"], ["--experiment", "rt-fnal"]):
        out = tmp_path / f"report{len(pages)}.html"
        r = runner.invoke(app, ["export", "--store", str(db), "--out", str(out), *extra])
        assert r.exit_code == 0, r.output
        pages[len(pages)] = out.read_text()
    assert "16 sessions stored (every experiment" in pages[0]
    assert '<section id="runs"' not in pages[0]  # no run given: no empty runs list
    assert "10 sessions of experiment rt-final" in pages[1]
    # a misspelt experiment: what the store holds, not an empty A/B
    assert "no sessions of experiment &#x27;rt-fnal&#x27;" in pages[2]
    assert "it holds: rt-c2, rt-final" in pages[2] and "<td>A</td>" not in pages[2]
    # per arm: sessions served, 5 an arm in rt-final against 8 over both experiments
    assert re.search(r"<td>A</td><td>5</td>", pages[1]) and re.search(r"<td>A</td><td>8</td>",
                                                                       pages[0])
