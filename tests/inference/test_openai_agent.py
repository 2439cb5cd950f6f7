"""A real agent harness from PyPI (mini-swe-agent, through litellm) drives ``looprl model serve``
end to end on a repository with a bug: both as real processes, the harness's commands in its own
bubblewrap sandbox.

The served model is a tiny one taught the two turns this task takes (``taught.py``): a fix with
``sed``, then mini-swe-agent's submit command. The test checks the protocol round trip, not the
model: the harness gets parsed tool calls as its actions, runs them, sends the results back as
``role: "tool"`` messages, gets the next call (which the model only gives when it sees that
result), and ends cleanly with its ``Submitted`` status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from looprl.chat import ChatFormat
from looprl.inference.openai_chat import conversation_ids
from looprl.inference.openai_params import chat_messages
from looprl.models.tokenizer import build_tokenizer
from looprl.sandbox.server import free_port

from .taught import teach

KEY = "agent-key"
SYSTEM = "You are a helpful assistant that can interact with a computer."
TASK = "add(2, 3) returns -1 instead of 5 in calc.py."
INSTANCE = "Please solve this issue: {{task}}"
OBSERVATION = "<returncode>{{output.returncode}}</returncode>\n<output>\n{{output.output}}</output>"
FIX = "sed -i 's/a - b/a + b/' calc.py"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
THOUGHT = "The sum uses the wrong operator."


def bash(command: str) -> str:
    return json.dumps({"name": "bash", "arguments": {"command": command}})


def taught_model(out: Path, mini: Any) -> Path:
    """The tiny model, taught what mini-swe-agent (``mini``: its tool-call module) will send:
    its system and task messages with its bash tool, then the same with the fix's call and its
    rendering of the result (return code 0, no output)."""
    tok = build_tokenizer(None)
    fmt = ChatFormat(tok)
    first = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": INSTANCE.replace("{{task}}", TASK)}]
    [observation] = mini.format_toolcall_observation_messages(
        actions=[{"command": FIX, "tool_call_id": "x"}],
        outputs=[{"output": "", "returncode": 0, "exception_info": ""}],
        observation_template=OBSERVATION)
    second = first + [
        {"role": "assistant", "content": THOUGHT, "tool_calls": [
            {"id": "x", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": FIX})}}]},
        {"role": "tool", "tool_call_id": "x", "content": observation["content"]}]
    turns = [THOUGHT + f"<tool_call>{bash(FIX)}</tool_call>",
             f"<tool_call>{bash(SUBMIT)}</tool_call>"]
    examples = [(conversation_ids(fmt, chat_messages(msgs), [mini.BASH_TOOL]),
                 tok.encode(turn) + [fmt.eot_id])
                for msgs, turn in zip((first, second), turns, strict=True)]
    torch.set_num_threads(1)
    return teach(tok, examples, out)


def write_repo(root: Path) -> Path:
    root.mkdir()
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n"
                                       "    assert add(2, 3) == 5\n")
    return root


def mini_config(path: Path, repo: Path, port: int) -> Path:
    path.write_text(json.dumps({  # YAML is a superset of JSON
        "agent": {"system_template": SYSTEM, "instance_template": INSTANCE, "step_limit": 6,
                  "cost_limit": 0},
        "environment": {"environment_class": "bubblewrap", "cwd": str(repo), "timeout": 30},
        "model": {"model_class": "litellm", "model_name": "openai/taught",
                  "cost_tracking": "ignore_errors", "observation_template": OBSERVATION,
                  "model_kwargs": {"api_base": f"http://127.0.0.1:{port}/v1", "api_key": KEY,
                                   "temperature": 0.0}}}))
    return path


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"the server exited: {proc.stdout.read()}"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.3)


def mini_env(home: Path) -> dict[str, str]:
    """mini-swe-agent unattended: no first-run questions or banner, its config under ``home``,
    litellm's price table from its package (no download)."""
    return {"MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": str(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@pytest.mark.slow
def test_mini_swe_agent_fixes_a_bug_through_looprl_model_serve(tmp_path, monkeypatch):
    for name, value in mini_env(tmp_path / "mini-home").items():
        monkeypatch.setenv(name, value)
    mini = pytest.importorskip("minisweagent.models.utils.actions_toolcall",
                               reason="mini-swe-agent is a test dependency: pip install -e '.[test]'")
    model = taught_model(tmp_path / "model", mini)
    repo = write_repo(tmp_path / "repo")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, "-c", "from looprl.cli import app; app()", "model", "serve", str(model),
         "--port", str(port), "--name", "taught", "--api-key", KEY, "--drain", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    traj_file = tmp_path / "traj.json"
    try:
        wait_healthy(f"http://127.0.0.1:{port}", server)
        run = subprocess.run(
            [sys.executable, "-m", "minisweagent.run.mini", "-c",
             str(mini_config(tmp_path / "mini.yaml", repo, port)), "-t", TASK, "-y",
             "--exit-immediately", "-o", str(traj_file)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=env)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    traj = json.loads(traj_file.read_text())
    assert traj["info"]["exit_status"] == "Submitted", traj["info"]
    steps = [m for m in traj["messages"] if m["role"] == "assistant"]
    assert [[a["command"] for a in m["extra"]["actions"]] for m in steps] == [[FIX], [SUBMIT]]
    assert steps[0]["content"] == THOUGHT
    results = [m for m in traj["messages"] if m["role"] == "tool"]
    assert results[0]["tool_call_id"] == steps[0]["tool_calls"][0]["id"]
    assert "<returncode>0</returncode>" in results[0]["content"]
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                           cwd=repo, capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout
