"""``looprl serve --engine vllm`` as a user runs it: the agent server in a real process whose turns
vLLM samples (its CPU build, in `make vllm`'s venv), sessions over HTTP in real sandboxes: the
policies dir's candidate A/B-tested on a second vLLM worker (arm B), a promotion going live on
arm A's running worker, and SIGTERM ending the server (exit 0) and every vLLM process under it.

The policies dir holds two versions of a tiny model taught (``tests/inference/taught.py``) the one
turn a session takes here: on the server's own prompt (the harness's system prompt and tools, the
user's request) v1 fixes calc.py with one ``edit_file`` call and v2 with another. Their leads are
large enough that sampling at the server's temperature 1 gives exactly the taught tokens — what
greedy decoding in PyTorch gives — so the diff a session returns says whose weights vLLM sampled
from, and the stored tokens carry that version. The vLLM tests skip without `make vllm`'s venv
(and fail under CI: ``tests/vllm_support.py``); the last test, of the engine specs, needs none.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import torch

from looprl.chat import ChatFormat
from looprl.feedback.policies import offer_candidate, promote, withdraw_candidate
from looprl.feedback.store import FeedbackStore
from looprl.harness.agent import AgentConfig, initial_messages
from looprl.harness.tools import make_tools, tool_schemas
from looprl.models.tokenizer import build_tokenizer
from looprl.sandbox.server import free_port
from looprl.serve.api import ServeConfig
from looprl.types import Grader, Task
from tests.inference.taught import teach
from tests.vllm_support import require_vllm

PROMPT = "add(2, 3) returns -1 instead of 5"
FIXES = {1: ("a - b", "a + b"), 2: ("a - b", "b + a")}
"""Version -> the (old_string, new_string) of its one edit_file call."""
CONTEXT = 4096


def _call(old: str, new: str) -> str:
    args = {"path": "calc.py", "old_string": old, "new_string": new}
    return f"<tool_call>{json.dumps({'name': 'edit_file', 'arguments': args})}</tool_call>"


def _served_prompt(fmt: ChatFormat, repo: Path) -> list[int]:
    """The ids the server renders for a session's first turn (``Server._run_agent``)."""
    cfg = ServeConfig(token="-")
    task = Task(id="t", repo=str(repo), prompt=PROMPT, grader=Grader(cfg.test_command))
    tools = make_tools(cfg.tools, test_command=cfg.test_command)
    return fmt.prompt_ids(initial_messages(task, AgentConfig()), tool_schemas(tools))


def _descendants(pid: int) -> dict[int, str]:
    """``pid``'s child processes and theirs, all the way down: pid -> command line."""
    out: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:  # the thread or the process ended meanwhile
            continue
        for child in map(int, children):
            try:
                out[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            out.update(_descendants(child))
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped by its parent, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_serve_on_vllm_ab_tests_a_candidate_takes_a_promotion_and_exits_0_on_sigterm(tmp_path):
    """Arm A serves the current policy, arm B (a second vLLM worker) the candidate the real-time
    loop offers (``candidate.json``); a promotion goes live on A; SIGTERM drains the server, which
    closes both engines and exits 0, and no vLLM process outlives it."""
    require_vllm()
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    tok = build_tokenizer(None)
    fmt = ChatFormat(tok)
    prompt = _served_prompt(fmt, repo)
    turns = {v: tok.encode(_call(*fix)) + [fmt.eot_id] for v, fix in FIXES.items()}
    policies = tmp_path / "policies"
    torch.set_num_threads(1)
    for v, turn in turns.items():
        teach(tok, [(prompt, turn)], policies / f"v{v:04d}", max_positions=CONTEXT, hidden=64,
              heads=2, margin=20.0)
    promote(policies, 1)

    port, db = free_port(), tmp_path / "fb.db"
    log = tempfile.NamedTemporaryFile(prefix="looprl-serve-vllm-", suffix=".log", delete=False)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "looprl", "serve", "--engine", "vllm", "--model", str(policies),
         "--store", str(db), "--port", str(port), "--token", "tk", "--max-turns", "1",
         "--max-new-tokens", "160", "--context-window", str(CONTEXT), "--watch", "0",
         "--allowed-root", str(tmp_path), "--drain", "2"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer tk"}

    def session() -> dict:
        r = httpx.post(url + "/v1/sessions", headers=auth, timeout=300,
                       json={"user": "u", "prompt": PROMPT, "repo": str(repo)})
        if r.status_code == 503 and "sandbox" in r.json()["message"]:
            pytest.skip(f"no sandbox here: {r.json()['message']}")
        assert r.status_code == 200, r.text
        return r.json()

    def sampled(sid: str) -> tuple[list[int], set[int]]:
        """The stored session's sampled tokens and the versions they carry."""
        [seg] = FeedbackStore(db).session(sid).trajectory.segments
        ids = [t for t, m in zip(seg.token_ids_T, seg.loss_mask_T, strict=True) if m]
        return ids, {v for v, m in zip(seg.policy_version_T, seg.loss_mask_T, strict=True) if m}

    def reload() -> dict:
        r = httpx.post(url + "/v1/reload", headers=auth, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    try:
        while True:
            assert proc.poll() is None, Path(log.name).read_text()[-3000:]
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() - t0 < 900, Path(log.name).read_text()[-3000:]
            time.sleep(1)
        print(f"looprl serve --engine vllm (arms A and B) up in {time.monotonic() - t0:.0f} s")
        assert httpx.get(url + "/healthz").json()["arms"] == {"A": 1}  # B: no candidate yet
        vllm = _descendants(proc.pid)
        workers = [pid for pid, cmd in vllm.items() if "vllm_worker.py" in cmd]
        assert len(workers) == 2, vllm  # one per arm

        first = session()
        assert (first["arm"], first["policy_version"], first["tool_calls"]) == ("A", 1, 1), first
        assert "-    return a - b\n+    return a + b" in first["diff"], first["diff"]
        assert sampled(first["session_id"]) == (turns[1], {1})

        offer_candidate(policies, 2, "v2-vs-v1", 1.0)  # every user on B
        r = reload()
        assert r["B"]["changed"] and r["arms"] == {"A": 1, "B": 2} and r["candidate"], r
        on_b = session()
        assert (on_b["arm"], on_b["policy_version"]) == ("B", 2), on_b
        assert "-    return a - b\n+    return b + a" in on_b["diff"], on_b["diff"]
        assert sampled(on_b["session_id"]) == (turns[2], {2})

        withdraw_candidate(policies)
        promote(policies, 2)
        r = reload()
        assert r["A"]["changed"] and r["arms"] == {"A": 2}, r
        second = session()
        assert (second["arm"], second["policy_version"]) == ("A", 2), second
        assert "-    return a - b\n+    return b + a" in second["diff"], second["diff"]
        assert sampled(second["session_id"]) == (turns[2], {2})

        vllm = _descendants(proc.pid)  # the workers and vLLM's engine processes under them
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, Path(log.name).read_text()[-3000:]
        print(f"SIGTERM: exit 0 after {time.monotonic() - t_term:.1f} s; vLLM processes {sorted(vllm)}")
        deadline = time.monotonic() + 30  # helpers of vLLM's (a resource tracker) end on EOF
        while left := {pid: cmd for pid, cmd in vllm.items() if _alive(pid)}:
            assert time.monotonic() < deadline, f"outlived looprl serve: {left}"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_vllm_option_vllm_refuses_is_one_line_naming_it(tmp_path):
    """vLLM checks its engine arguments itself (looprl's venv has no vllm to check them
    against): its refusal comes back as a config error the CLI prints in one line."""
    from typer.testing import CliRunner

    from looprl.cli import app

    require_vllm()
    tok = build_tokenizer(None)
    model = teach(tok, [([1, 2, 3], tok.encode("ok") + [ChatFormat(tok).eot_id])], tmp_path / "m",
                  hidden=64, heads=2)
    r = CliRunner().invoke(app, ["serve", "--engine", "vllm", "--model", str(model),
                                 "--store", str(tmp_path / "fb.db"), "-E", "bogus_option=1"])
    assert r.exit_code == 2, r.output
    [line] = r.output.strip().splitlines()
    assert "vLLM refused its engine arguments" in line and "'bogus_option'" in line, line


def test_local_engines_start_on_their_policys_version_and_vllm_on_the_served_context(tmp_path):
    """What ``looprl serve`` builds each arm's engine from: a built-in engine starts labelled with
    the version it serves (its tokens carry it), and vLLM reserves ``--context-window`` tokens,
    no more than the model has positions, unless ``-E max_model_len`` says otherwise."""
    from looprl.commands.serve import _local_specs
    from looprl.feedback.policies import PolicyRef
    from tests.feedback.test_cycle import save_tiny

    model = save_tiny(tmp_path / "m", max_positions=2048)
    refs = {"A": PolicyRef(model, 3)}
    specs, _ = _local_specs("vllm", refs, {}, model, False, 8192)
    assert specs["A"] == {"model_path": str(model), "policy_version": 3, "max_model_len": 2048}
    specs, _ = _local_specs("vllm", refs, {"max_model_len": 1024}, model, False, 512)
    assert specs["A"]["max_model_len"] == 1024
    assert _local_specs("vllm", refs, {}, model, False, 512)[0]["A"]["max_model_len"] == 512
    specs, _ = _local_specs("torch", refs, {}, model, True, 8192)
    assert specs == {arm: {"path": str(model), "policy_version": 3} for arm in ("A", "B")}
