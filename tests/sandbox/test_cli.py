"""``looprl sandbox run``: one command in a fresh sandbox, its exit code passed through."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from looprl.commands.sandbox import app

from .conftest import needs_bwrap

pytestmark = needs_bwrap


def test_run_passes_output_and_exit_code(base_repo: Path) -> None:
    r = CliRunner().invoke(app, ["run", "--base", str(base_repo), "--", "sh", "-c",
                                 "cat README.md; echo x > new.txt; exit 7"])
    assert r.exit_code == 7 and "# repo" in r.output
    assert not (base_repo / "new.txt").exists()


def test_run_timeout_exits_124(base_repo: Path) -> None:
    r = CliRunner().invoke(app, ["run", "--base", str(base_repo), "--timeout", "0.3", "--",
                                 "sleep", "5"])
    assert r.exit_code == 124


def test_run_bad_base_is_a_sandbox_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["run", "--base", str(tmp_path / "missing"), "--", "true"])
    assert r.exit_code == 125 and "does not exist" in r.output
