"""``looprl feedback``: cycle, ab, promote, sessions on a real store and a tiny saved model."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from looprl.commands.feedback import app

from .conftest import add
from .test_cycle import save_tiny

runner = CliRunner()


def test_cycle_ab_promote_sessions(tmp_path, store):
    model = save_tiny(tmp_path / "m")
    for i in range(4):
        store.add_event(add(store, user=f"u{i}", arm="AB"[i % 2]), "kept" if i < 2 else "reverted")
    db, out = str(store.path), str(tmp_path / "out")
    r = runner.invoke(app, ["cycle", "--store", db, "--model", str(model), "--out", out,
                            "--min-sessions", "4", "--lr", "1e-3"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{"):])
    assert (res["status"], res["candidate_version"], res["sessions"]) == ("candidate", 1, 4)

    r = runner.invoke(app, ["ab", "--store", db, "--min-sessions", "1"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["arms"]["A"]["scored"] == 2 and rep["arms"]["B"]["scored"] == 2

    r = runner.invoke(app, ["promote", "--out", out, "--version", "1"])
    assert r.exit_code == 0 and "current policy: v1" in r.output
    r = runner.invoke(app, ["promote", "--out", out, "--version", "9"])
    assert r.exit_code != 0 and "no candidate" in str(r.exception)

    r = runner.invoke(app, ["sessions", "--store", db])
    assert r.exit_code == 0 and r.output.count("reward=") == 4 and "reward=-1.00" in r.output
