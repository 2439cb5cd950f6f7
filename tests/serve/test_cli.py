"""``looprl serve`` as a user runs it: a real process on a free port, driven over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from looprl.sandbox.server import free_port
from tests.example_package import write_example_package
from tests.feedback.test_cycle import save_tiny

SERVE = "from looprl.serve.cli import app; app()"


@pytest.mark.slow
def test_serve_command_runs_sessions(tmp_path):
    model = save_tiny(tmp_path / "m", max_positions=16384)  # bytes tokenizer: long prompts
    repo = write_example_package(tmp_path / "minicalc")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, "--model", str(model), "--store", str(tmp_path / "fb.db"),
         "--port", str(port), "--token", "tk", "--max-turns", "1", "--max-new-tokens", "8",
         "--context-window", "16384"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "server did not come up"
            time.sleep(0.2)
        assert httpx.get(url + "/healthz").json()["arms"] == {"A": 0}
        r = httpx.post(url + "/v1/sessions", headers={"Authorization": "Bearer tk"}, timeout=120,
                       json={"user": "u", "prompt": "fix mean", "repo": str(repo)})
        if r.status_code == 503:
            pytest.skip(f"no sandbox here: {r.json()['message']}")
        assert r.status_code == 200, r.text
        assert r.json()["turns"] == 1 and r.json()["policy_version"] == 0
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_serve_rejects_a_path_that_is_no_model(tmp_path):
    from typer.testing import CliRunner

    from looprl.serve.cli import app

    r = CliRunner().invoke(app, ["--model", str(tmp_path), "--store", str(tmp_path / "fb.db")])
    assert r.exit_code != 0 and "neither a model directory" in str(r.exception)
