"""Users' follow-ups as hints (``feedback.follow_ups``): a dissatisfied follow-up is inserted
after the turn it answers (the session's last), redacted against the gold patch, never a model
token; the serving policy's continuation is the teacher the window's groups carry."""

from __future__ import annotations

import asyncio
import dataclasses
import sys

import pytest

from looprl.chat import ChatFormat
from looprl.config import load_config
from looprl.errors import ConfigError
from looprl.feedback.follow_ups import (
    attach_hinted,
    continue_follow_ups,
    follow_up_hint,
    follow_up_hints,
)
from looprl.feedback.realtime_config import RealtimeConfig
from looprl.feedback.store import Event
from looprl.harness.agent import run_agent
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import make_tools
from looprl.models.tokenizer import build_tokenizer
from looprl.types import Grader, Group, Task, Trajectory
from tests.bwrap_support import needs_bwrap
from tests.harness.conftest import agent_config, calc_repo, call
from tests.harness.dir_sandbox import DirSandbox

GOLD = ("--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
        "-    return a - b\n+    return a + b\n")
SESSION = [call("edit_file", path="pkg/calc.py", old_string="def sub(a, b):\n    return a - b",
                new_string="def sub(a, b):\n    return b - a"),
           call("finish", summary="done")]
CONTINUATION = [call("edit_file", path="pkg/calc.py", old_string="def add(a, b):\n    return a - b",
                     new_string="def add(a, b):\n    return a + b"),
                call("finish", summary="fixed add")]
COMPLAINT = "no, add is still wrong: it should be return a + b"


def event(i: int, text: str, sentiment: str, at: float) -> Event:
    return Event(i, "s1", "follow_up", {"text": text}, 0.0, at=at, sentiment=sentiment)


@pytest.fixture
def repo(tmp_path):
    return calc_repo(tmp_path / "repo")


@pytest.fixture
def fmt():
    return ChatFormat(build_tokenizer(None))


def served(task: Task, fmt: ChatFormat):
    """A session as ``looprl serve`` stores it (id = the session's), run on the DirSandbox."""
    sb = DirSandbox(task.repo)
    traj = asyncio.run(run_agent(task, sb, ScriptedPolicy(fmt.tokenizer, SESSION), fmt,
                                 make_tools(), agent_config(context_window=100_000),
                                 group_id="s1", trajectory_id="s1"))
    asyncio.run(sb.close())
    return traj


def test_the_first_dissatisfied_follow_up_is_the_hint_for_the_last_turn_redacted(repo, fmt):
    task = Task("calc", str(repo), "fix add", Grader("python -m pytest"), gold_patch=GOLD)
    traj = served(task, fmt)
    events = [event(3, "thanks, works now", "satisfied", at=1.0),
              event(2, "still failing, this is wrong", "dissatisfied", at=5.0),
              event(1, COMPLAINT, "dissatisfied", at=2.0)]  # arrived first, acted on second
    hint = follow_up_hint(traj, events, GOLD)
    assert hint is not None and (hint.turn, hint.kind) == (2, "follow_up")  # 2 turns: the last
    assert hint.text == "no, add is still wrong: it should be …"  # the gold line cut out
    assert "return a + b" not in hint.text
    assert follow_up_hint(traj, [event(1, "thanks", "satisfied", 1.0)]) is None
    assert follow_up_hints([traj], {"s1": events}, {"s1": None})["s1"].text == COMPLAINT


def _continued(task: Task, fmt: ChatFormat, events: list[Event]):
    traj = served(task, fmt)
    hints = follow_up_hints([traj], {"s1": events}, {"s1": task.gold_patch})
    policy = ScriptedPolicy(fmt.tokenizer, CONTINUATION)

    async def dir_sandbox(repo: str, venv: str | None):
        return DirSandbox(repo)

    (teacher,) = asyncio.run(continue_follow_ups(
        policy, fmt, [traj], hints, {"s1": task}, agent_config(context_window=100_000),
        sandbox_factory=dir_sandbox))
    return traj, teacher, policy


def test_the_continuation_sits_after_the_answered_turn_and_the_follow_up_is_never_trained(
        repo, fmt):
    task = Task("serve-s1", str(repo), "fix add", Grader("python -m pytest"))  # a real user's
    traj, teacher, policy = _continued(task, fmt, [event(1, COMPLAINT, "dissatisfied", 1.0)])
    (seg,), (tseg,) = traj.segments, teacher.segments
    h = teacher.hint
    assert h is not None and (h.turn, h.kind, h.text) == (2, "follow_up", COMPLAINT)
    # after the last model turn's tokens: the recorded session, token-exact, then the follow-up
    assert h.start == seg.model_turns()[-1][1]
    assert tseg.token_ids_T[:h.start] == seg.token_ids_T[:h.start]
    assert COMPLAINT in fmt.decode(tseg.token_ids_T[h.start:h.end])
    assert COMPLAINT not in fmt.decode(h.student_ids_T)
    assert all(m == 0 for m in tseg.loss_mask_T[:h.end])  # the follow-up is context, never a
    assert min(i for i, m in enumerate(tseg.loss_mask_T) if m) == h.end  # model token
    assert policy.prompts[0] == list(tseg.token_ids_T[:h.end])
    # the messages: the session, the answered turn's tool results, the follow-up, the teacher's
    n = len(traj.messages)
    assert teacher.messages[:n] == traj.messages
    assert teacher.messages[n] == {"role": "user", "content": COMPLAINT}
    assert teacher.messages[n + 1]["role"] == "assistant"
    assert "return a + b" in teacher.diff and "return b - a" in teacher.diff  # session replayed
    assert teacher.metadata["hinted_from"] == "s1" and teacher.reward is None  # no test to run


def test_a_session_that_cannot_be_continued_is_left_out(repo, fmt):
    task = Task("serve-s1", str(repo), "fix add", Grader("python -m pytest"))
    traj = served(task, fmt)
    seg = traj.segments[0]
    broken = dataclasses.replace(traj, segments=(dataclasses.replace(  # no run of model tokens
        seg, loss_mask_T=(0,) * len(seg.loss_mask_T)),))
    hints = follow_up_hints([broken], {"s1": [event(1, COMPLAINT, "dissatisfied", 1.0)]},
                            {"s1": None})

    async def dir_sandbox(repo: str, venv: str | None):
        return DirSandbox(repo)

    assert asyncio.run(continue_follow_ups(
        ScriptedPolicy(fmt.tokenizer, CONTINUATION), fmt, [broken], hints, {"s1": task},
        agent_config(context_window=100_000), sandbox_factory=dir_sandbox)) == []


@needs_bwrap[0]
def test_a_known_tasks_continuation_is_graded_by_its_hidden_tests(repo, fmt):
    task = Task("calc", str(repo), "fix add", venv=sys.prefix, gold_patch=GOLD, grader=Grader(
        "python -m pytest -q", fail_to_pass=("tests/test_calc.py::test_add",)))
    _, teacher, _ = _continued(task, fmt, [event(1, "add is still wrong", "dissatisfied", 1.0)])
    assert teacher.reward is not None and teacher.passed


def test_groups_carry_at_most_per_group_continuations_of_their_own_sessions(repo, fmt):
    traj = served(Task("calc", str(repo), "fix add", Grader("python -m pytest")), fmt)
    a, b, c = (dataclasses.replace(traj, id=i) for i in ("a", "b", "c"))
    cont = {i: dataclasses.replace(traj, id=f"{i}+follow_up", metadata={"hinted_from": i})
            for i in ("a", "b", "c")}
    groups = [Group("r0", "g0", (a, b)), Group("r1", "g1", (c,))]
    out = attach_hinted(groups, list(cont.values()), per_group=1)
    assert [[h.id for h in g.hinted] for g in out] == [["a+follow_up"], ["c+follow_up"]]
    assert [g.trajectories for g in out] == [g.trajectories for g in groups]  # no advantage
    assert attach_hinted(groups, [], per_group=1) == groups


def test_follow_ups_without_a_distillation_weight_are_refused():
    base = ["model=m", "users.simulate=false", "grpo.experimental.feedback.follow_ups=true"]
    with pytest.raises(ConfigError, match=r"grpo.experimental.feedback.coef .*set it > 0"):
        load_config(RealtimeConfig, None, base)
    cfg = load_config(RealtimeConfig, None, [*base, "grpo.experimental.feedback.coef=0.5"])
    assert cfg.grpo.experimental.feedback.follow_ups


@pytest.mark.slow
@needs_bwrap[0]
def test_the_benchmark_arm_distils_follow_ups_after_the_turn_they_answer(tmp_path):
    """``benchmarks/realtime.py --arm follow-up-hints`` as a user runs it: simulated users over
    ``looprl serve`` on a tiny model; arm B's window carries the follow-ups' continuations (A's
    does not), each inserted after its session's last turn, and the last line reports both."""
    import json
    import os
    import subprocess
    from pathlib import Path

    from looprl.feedback.store import FeedbackStore
    from looprl.models.tiny import init_default_model
    from looprl.tasks.taskset import write_tasks
    from tests.example_package import write_example_package

    from .test_loop import CMD

    model = init_default_model(tmp_path / "m", size="tiny", corpus_chars=50_000, vocab_size=512)
    repo = write_example_package(tmp_path / "repos" / "minicalc")
    core = repo / "src" / "minicalc" / "core.py"  # a bug the users see: they complain
    core.write_text(core.read_text().replace("total / len(values)", "total / (len(values) + 1)"))
    users = write_tasks([Task(f"minicalc-mean-{i}", str(repo), f"mean is wrong ({i})",
                              venv=sys.prefix, grader=Grader(
                                  CMD, ("tests/test_core.py::test_mean",), (),
                                  ("tests/test_core.py",)))
                         for i in range(3)], tmp_path / "users.jsonl")
    cfg = tmp_path / "arm.toml"
    cfg.write_text(f"""
name = "arm"
model = "{model}"
window = 4
steps = 1
window_timeout_min = 5
[grpo.experimental.credit]
skip_groups_without_pass = false
[grpo.experimental.feedback]
coef = 0.5
max_per_group = 4
follow_ups = true
[users]
tasks = "{users}"
rate_per_min = 60.0
silent = 0.0
complain = 1.0
[serve]
max_concurrent = 2
max_turns = 1
max_new_tokens = 8
[ab]
timeout_min = 5
final_sessions = 2
""")
    root = Path(__file__).parents[2]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "realtime.py"), "-c", str(cfg),
                        "--runs", str(tmp_path / "runs"), "--arm", "follow-up-hints"],
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = dict(kv.split("=") for kv in r.stdout.strip().splitlines()[-1].split())
    assert line["arm"] == "follow_up_hints" and int(line["hints"]) >= 1
    assert int(line["hinted"]) == int(line["hints"]) and int(line["updates_b"]) >= 1
    assert "kept_ci_low" in line and float(line["hint_kl"]) > 0
    run = tmp_path / "runs" / "arm"
    store = FeedbackStore(run / "feedback.db")
    hinted = [Trajectory.from_json(x) for x in (run / "trajectories" / "hinted.jsonl").read_text()
              .splitlines()]
    assert len(hinted) == int(line["hinted"])
    for h in hinted:
        session = store.session(str(h.metadata["hinted_from"]))
        assert session.trajectory is not None and h.hint is not None
        n = len(session.trajectory.messages)
        assert h.hint.turn == sum(m["role"] == "assistant" for m in session.trajectory.messages)
        assert h.messages[:n] == session.trajectory.messages  # after the turn it answers
        assert h.messages[n]["role"] == "user" and h.messages[n]["content"] == h.hint.text
        assert not any(h.segments[0].loss_mask_T[:h.hint.end])  # the follow-up: context only
    arms = json.loads((run / "arms.json").read_text())
    assert arms["A"]["hints"] == 0 and arms["B"]["hints"] == int(line["hinted"])
