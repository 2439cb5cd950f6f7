"""Simulated users against a real ``looprl serve`` app (real uvicorn on loopback, real harness in
real bubblewrap sandboxes, SQLite store), over two tasks with real hidden tests: the agent (a
scripted engine at the Engine seam) fixes one task and makes a wrong edit on the other."""

from __future__ import annotations

import asyncio
import dataclasses
import doctest
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from looprl.diffs import unified_diff
from looprl.feedback import simulate as sim_mod
from looprl.feedback.sentiment import follow_up_sentiment, load_follow_ups
from looprl.feedback.signals import session_reward
from looprl.feedback.simulate import (
    FOLLOW_UP_KINDS,
    SimConfig,
    follow_up_texts,
    plan_sessions,
    simulate_users,
)
from looprl.feedback.store import FeedbackStore
from looprl.harness.agent import AgentConfig
from looprl.harness.policies import ScriptedPolicy
from looprl.models.tokenizer import build_tokenizer
from looprl.serve.api import ServeConfig, make_app
from looprl.tasks.taskset import load_tasks, write_tasks
from looprl.types import Generation, Grader, SamplingParams, Task
from tests.bwrap_support import needs_bwrap
from tests.example_package import write_example_package
from tests.serve.conftest import running

TOKEN = "sim-token"
CORE = "src/minicalc/core.py"
CMD = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=src python -m "
       "pytest -p no:cacheprovider -q -rA --tb=short --color=no -o addopts=")
T = "tests/test_core.py::"
AGENT = AgentConfig(max_turns=4, max_new_tokens=1 << 16, max_total_new_tokens=1 << 20,
                    context_window=1 << 20)
CLAMP_PROMPT = "clamp ignores the upper bound"
MEAN_PROMPT = "the average from mean() is off"


def with_bwrap(f):
    for mark in needs_bwrap:
        f = mark(f)
    return f


def call(name: str, **arguments: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


FIX_CLAMP = [call("edit_file", path=CORE, old_string="    if x < hi:\n",
                  new_string="    if x > hi:\n"), call("finish", summary="fixed clamp")]
WRONG_MEAN = [call("edit_file", path=CORE, old_string="    total = 0\n",
                   new_string="    total = 0.0\n"), call("finish", summary="mean sums floats")]


class ByPrompt:
    """An Engine that plays, per session, the script of the first prompt it finds in the
    session's first context (the agent fixes clamp and gets mean wrong)."""

    def __init__(self, tok, scripts: dict[str, list[str]]) -> None:
        self.tokenizer, self.tok = tok, tok
        self.scripts = {p: ScriptedPolicy(tok, s) for p, s in scripts.items()}
        self.route: dict[str | None, ScriptedPolicy] = {}

    @property
    def policy_version(self) -> int:
        return 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation:
        if session_id not in self.route:
            text = self.tok.decode(prompt_ids)
            self.route[session_id] = next(s for p, s in self.scripts.items() if p in text)
        return await self.route[session_id].generate(prompt_ids, params, session_id=session_id)

    async def update_weights(self, state_dict, version: int) -> None:
        pass

    async def release(self, session_id: str) -> None:
        pass


def buggy_task(root: Path, name: str, prompt: str, bug: tuple[str, str],
               fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...]) -> Task:
    repo = write_example_package(root / name)
    core = repo / CORE
    original = core.read_text()
    assert bug[0] in original
    core.write_text(original.replace(bug[0], bug[1]))
    return Task(f"minicalc-{name}", str(repo), prompt, venv=sys.prefix,
                gold_patch=unified_diff(CORE, core.read_text(), original),
                grader=Grader(CMD, fail_to_pass, pass_to_pass,
                              ("tests/test_core.py", "pyproject.toml"), timeout_s=60))


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> list[Task]:
    root = tmp_path_factory.mktemp("sim")
    ts = [buggy_task(root, "clamp", CLAMP_PROMPT, ("if x > hi:", "if x < hi:"),
                     (T + "test_clamp_low", T + "test_clamp_high"), (T + "test_mean",)),
          buggy_task(root, "mean", MEAN_PROMPT, ("total / len(values)", "total / (len(values) + 1)"),
                     (T + "test_mean",), (T + "test_clamp_inside",))]
    return load_tasks(write_tasks(ts, root / "heldout.jsonl"))  # as the CLI reads them


@pytest.fixture(scope="module")
def served(tmp_path_factory, tasks):
    tok = build_tokenizer(None)
    store = FeedbackStore(tmp_path_factory.mktemp("db") / "fb.db")
    engine = ByPrompt(tok, {CLAMP_PROMPT: FIX_CLAMP, MEAN_PROMPT: WRONG_MEAN})
    cfg = ServeConfig(token=TOKEN, agent=AGENT, max_concurrent=2,
                      allowed_roots=(str(Path(tasks[0].repo).parent), sys.prefix))
    with running(make_app({"A": engine}, tok, store, cfg)) as srv:
        yield srv.url, store
    store.close()


def run(url: str, tasks: list[Task], tmp: Path, *args: str) -> dict:
    """``looprl feedback simulate`` in its own process, as a user runs it beside the server (one
    process holds one sandbox event loop: ``sandbox.bwrap`` reaps sandboxes process-wide)."""
    task_file, out = tmp / f"tasks-{len(list(tmp.iterdir()))}.jsonl", tmp / "summary.json"
    write_tasks(tasks, task_file)
    r = subprocess.run([sys.executable, "-c", "from looprl.cli import app; app()", "feedback",
                        "simulate", "--url", url, "--tasks", str(task_file), "--rate", "600",
                        "--out", str(out), *args], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "LOOPRL_SERVE_TOKEN": TOKEN})
    assert r.returncode == 0, r.stdout + r.stderr
    printed, summary = json.loads(r.stdout), json.loads(out.read_text())
    assert "sessions" not in printed and printed["event_ids"] == summary["event_ids"]
    return summary


def check_sent_is_stored(summary: dict, store: FeedbackStore, prefix: str) -> None:
    """Every session sent is stored once with exactly the events sent; nothing else of this run."""
    mine = [s for s in store.sessions() if s.user.startswith(prefix + "-")]
    assert sorted(s.id for s in mine) == sorted(summary["session_ids"])
    assert len(summary["session_ids"]) == len(set(summary["session_ids"])) == summary["sent"]
    for s in summary["sessions"]:
        stored = store.events(s["session_id"])
        assert [e.client_id for e in stored] == s["event_ids"], s
        want = ([s["action"]] if s["action"] else []) + (["follow_up"] if s["follow_up"] else [])
        assert [e.kind for e in stored] == want and all(e.replays == 0 for e in stored)
    kinds = Counter(e.kind for s in mine for e in store.events(s.id))
    assert (kinds["kept"], kinds["reverted"]) == (summary["kept"], summary["reverted"])
    assert kinds["follow_up"] == sum(summary["follow_ups"].values())
    assert sum(kinds.values()) == summary["events"] == len(summary["event_ids"])


@pytest.mark.slow
@with_bwrap
def test_users_keep_passing_edits_and_revert_failing_ones(served, tasks, tmp_path):
    url, store = served
    plans = plan_sessions(tasks, SimConfig(sessions=6, seed=3, population=3))
    assert {p.task.id for p in plans} == {t.id for t in tasks}  # both tasks are drawn
    summary = run(url, tasks, tmp_path, "--sessions", "6", "--seed", "3", "--population", "3",
                  "--complain", "1", "--thank", "1", "--user-prefix", "clean")
    errors = [s["error"] for s in summary["sessions"] if s.get("error")]
    assert (summary["sent"], summary["served"], summary["graded"]) == (6, 6, 6), errors
    for s in summary["sessions"]:  # the hidden tests decide, no noise
        right = s["task_id"] == "minicalc-clamp"
        assert s["passed"] is right and s["files"] == 1
        assert (s["action"], s["follow_up"]) == (("kept", "thanks") if right
                                                 else ("reverted", "dissatisfied"))
        assert s["latency_s"] > 0 and s["server_latency_s"] > 0
    assert summary["kept_wrong"] == summary["reverted_right"] == 0
    check_sent_is_stored(summary, store, "clean")
    # the store classified each follow-up: complaints as complaints (measured: 41 of the 48
    # complaint texts, 19 of the 21 thanks texts say so), never a thanks as a complaint
    for s in summary["sessions"]:
        (fu,) = [e for e in store.events(s["session_id"]) if e.kind == "follow_up"]
        assert fu.sentiment == follow_up_sentiment(s["follow_up_text"])
        if s["follow_up"] == "thanks":
            assert fu.sentiment != "dissatisfied"
    # the store's reward follows what the users did: keep +1, revert -1, a complaint after a
    # keep -0.5 (after a revert it says nothing new)
    for s in summary["sessions"]:
        rec = store.session(s["session_id"], with_trajectory=False)
        events = store.events(s["session_id"])
        assert rec.user.startswith("clean-") and rec.prompt in (CLAMP_PROMPT, MEAN_PROMPT)
        want = 1.0 if s["action"] == "kept" else -1.0
        want -= 0.5 if want > 0 and events[-1].sentiment == "dissatisfied" else 0.0
        assert session_reward(rec, events).total == pytest.approx(want), s


@pytest.mark.slow
@with_bwrap
def test_noise_keeps_wrong_edits_and_silences_users(served, tasks, tmp_path):
    url, store = served
    clamp, mean = ([t for t in tasks if t.id == f"minicalc-{n}"] for n in ("clamp", "mean"))
    noisy = run(url, mean, tmp_path, "--sessions", "3", "--seed", "5", "--keep-wrong", "1",
                "--thank", "0", "--user-prefix", "noisy")
    assert [(s["passed"], s["action"]) for s in noisy["sessions"]] == [(False, "kept")] * 3, \
        [(s["status"], s["error"]) for s in noisy["sessions"]]
    assert noisy["kept_wrong"] == 3 and noisy["follow_ups"] == {"dissatisfied": 0, "thanks": 0}
    check_sent_is_stored(noisy, store, "noisy")
    picky = run(url, clamp, tmp_path, "--sessions", "2", "--seed", "9", "--revert-right", "1",
                "--complain", "1", "--user-prefix", "picky")
    assert [(s["passed"], s["action"], s["follow_up"]) for s in picky["sessions"]] == [
        (True, "reverted", "dissatisfied")] * 2, [(s["status"], s["error"]) for s in picky["sessions"]]
    assert picky["reverted_right"] == 2
    check_sent_is_stored(picky, store, "picky")
    quiet = run(url, tasks, tmp_path, "--sessions", "2", "--seed", "6", "--silent", "1",
                "--user-prefix", "quiet")
    assert (quiet["served"], quiet["silent"], quiet["answered"], quiet["events"]) == (2, 2, 0, 0)
    check_sent_is_stored(quiet, store, "quiet")


@with_bwrap
def test_sigterm_stops_arrivals_and_the_sessions_already_sent_finish(served, tasks, tmp_path):
    """``looprl feedback simulate`` gets SIGTERM once its first session is stored: the users who
    have not arrived are never sent, the one in flight is graded and answers, the summary is
    written, and every session it says it sent is stored."""
    url, store = served
    plans = {s: plan_sessions(tasks, SimConfig(sessions=4, rate_per_min=1, seed=s))
             for s in range(2000)}  # a seed whose first user comes at once and the next late
    seed = next(s for s, p in plans.items() if p[0].arrival_s < 2 and p[1].arrival_s > 90)
    task_file, out = tmp_path / "tasks.jsonl", tmp_path / "summary.json"
    write_tasks(tasks, task_file)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from looprl.cli import app; app()", "feedback", "simulate",
         "--url", url, "--tasks", str(task_file), "--sessions", "4", "--rate", "1", "--seed",
         str(seed), "--complain", "1", "--thank", "1", "--user-prefix", "stopped",
         "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "LOOPRL_SERVE_TOKEN": TOKEN})
    try:
        deadline = time.monotonic() + 300
        while not any(s.user.startswith("stopped-") for s in store.sessions()):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "no session arrived"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # the first session is answered, not yet acted on
        assert proc.wait(timeout=300) == 0, proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    summary = json.loads(out.read_text())
    assert summary["planned"] == 4 and summary["not_sent"] >= 1, summary
    assert summary["sent"] == 4 - summary["not_sent"] == len(summary["sessions"])
    assert summary["served"] == summary["graded"] == summary["answered"] == summary["sent"], \
        [(s["status"], s["error"]) for s in summary["sessions"]]
    assert summary["events"] == 2 * summary["sent"]  # an edit event and a follow-up each
    check_sent_is_stored(summary, store, "stopped")  # sent = stored, events included


def test_a_stop_before_anyone_arrives_sends_nothing(served, tasks):
    url, store = served
    before = len(store.sessions())
    stop = asyncio.Event()
    stop.set()
    summary = asyncio.run(simulate_users(url, TOKEN, tasks, SimConfig(
        sessions=3, rate_per_min=600, user_prefix="never"), stop=stop))
    c = summary.counts()
    assert (c["planned"], c["sent"], c["not_sent"], c["stored"]) == (3, 0, 3, 0)
    assert [o.status for o in summary.outcomes] == ["not_sent"] * 3
    assert summary.to_dict()["sessions"] == [] and len(store.sessions()) == before


def test_the_cli_needs_a_token(tasks, monkeypatch):
    from typer.testing import CliRunner

    from looprl.cli import app

    monkeypatch.delenv("LOOPRL_SERVE_TOKEN", raising=False)
    r = CliRunner().invoke(app, ["feedback", "simulate", "--tasks",
                                 str(Path(tasks[0].repo).parent / "heldout.jsonl")])
    assert r.exit_code == 2 and "--token" in r.output


def test_cli_args_rebuild_the_config_through_the_real_cli(tasks, monkeypatch):
    """``SimConfig.cli_args`` (how the loop starts its users) names every field, and the CLI
    turns the flags back into the same config."""
    from typer.testing import CliRunner

    from looprl.cli import app

    seen = []

    async def capture(url, token, ts, cfg, stop=None):
        seen.append(cfg)
        return sim_mod.SimSummary(cfg, [], 0.0)

    monkeypatch.setattr(sim_mod, "simulate_users", capture)
    want = SimConfig(sessions=7, rate_per_min=12.5, population=3, seed=4, keep_wrong=0.1,
                     revert_right=0.2, silent=0.3, complain=0.4, thank=0.6, user_prefix="p",
                     request_timeout_s=30.0, grade_concurrency=3)
    default = SimConfig()
    assert all(getattr(want, f.name) != getattr(default, f.name)
               for f in dataclasses.fields(SimConfig))  # a dropped flag would show as a default
    r = CliRunner().invoke(app, ["feedback", "simulate", "--token", "t", "--tasks",
                                 str(Path(tasks[0].repo).parent / "heldout.jsonl"),
                                 *want.cli_args()])
    assert r.exit_code == 0, r.output
    assert seen == [want]


def test_templates_are_not_the_classifiers_labelled_texts():
    labelled = [r["text"].lower() for r in load_follow_ups()]
    for kind in FOLLOW_UP_KINDS:
        texts = follow_up_texts(kind)
        assert len(set(texts)) == len(texts) >= 20
        for t in texts:
            assert not any(t.lower() in x for x in labelled), t  # neither equal nor contained


def test_the_classifier_reads_the_templates_as_meant():
    """Measured once and pinned: most complaint templates are dissatisfied for the shipped
    classifier, no thanks template is; a template change that breaks this shows here."""
    said = {k: Counter(follow_up_sentiment(t) for t in follow_up_texts(k)) for k in FOLLOW_UP_KINDS}
    complaints, thanks = said["dissatisfied"], said["thanks"]
    assert complaints["dissatisfied"] / sum(complaints.values()) >= 0.8, complaints
    assert thanks["dissatisfied"] == 0 and thanks["satisfied"] / sum(thanks.values()) >= 0.85


def test_same_seed_same_plan_and_noise_validated(tasks):
    a = plan_sessions(tasks, SimConfig(sessions=20, seed=1))
    assert a == plan_sessions(tasks, SimConfig(sessions=20, seed=1))
    assert a != plan_sessions(tasks, SimConfig(sessions=20, seed=2))
    gaps = [b.arrival_s - x.arrival_s for x, b in zip(a, a[1:], strict=False)]
    assert all(g > 0 for g in gaps)
    with pytest.raises(Exception, match="probability"):
        SimConfig(keep_wrong=1.5)


def test_doctests():
    res = doctest.testmod(sim_mod)
    assert res.attempted > 0 and res.failed == 0
