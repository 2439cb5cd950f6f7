"""``looprl dashboard export`` writes one self-contained HTML file; bad invocations are explained."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from typer.testing import CliRunner

from looprl.dashboard.cli import app
from looprl.dashboard.data import fmt

from .conftest import rows

runner = CliRunner()


def test_export_is_self_contained(grpo_run: Path, feedback_db: Path, tmp_path: Path):
    out = tmp_path / "ci" / "report.html"
    r = runner.invoke(app, ["export", "--run", str(grpo_run), "--store", str(feedback_db),
                            "--min-sessions", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert "http://" not in page and "https://" not in page
    # every resource is inline: no src/href pointing anywhere, no <link>/<script>
    assert re.findall(r'(?:src|href)="(?!data:)[^"]*"', page) == []
    assert "<script" not in page and "<link" not in page and "http-equiv" not in page
    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(pngs) == 2 and all(base64.b64decode(p)[:4] == b"\x89PNG" for p in pngs)
    last = rows(grpo_run)[-1]
    assert f'<div class="v">{fmt(last["reward/total_mean"])}</div>' in page
    assert "report.md" in page and "feedback and A/B" in page


def test_serve_refuses_bad_invocations(grpo_run: Path):
    r = runner.invoke(app, [])
    assert r.exit_code != 0 and "nothing to show" in r.output
    r = runner.invoke(app, ["--run", str(grpo_run), "--host", "0.0.0.0"])
    assert r.exit_code != 0 and "--token" in r.output
