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
from looprl.harness.hinted import turn_messages
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import make_tools
from looprl.models.tokenizer import build_tokenizer
from looprl.types import Grader, Group, Task, Trajectory
from tests.bwrap_support import needs_bwrap, skip_without_sandbox
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


THREE_TURNS = [call("edit_file", path="pkg/calc.py", old_string="def sub(a, b):\n    return a - b",
                    new_string="def sub(a, b):\n    return b - a"),
               call("edit_file", path="pkg/calc.py",
                    old_string="def add(a, b):\n    return a - b",
                    new_string="def add(a, b):\n    return a * b"),
               call("finish", summary="done")]
AT_TURN_2 = "no, that is wrong: the second edit broke add, it still fails"


def three_turns(repo, fmt: ChatFormat, sid: str) -> Trajectory:
    """A served 3-turn session: edit sub, edit add (wrongly), finish."""
    task = Task("serve", str(repo), "fix add", Grader("python -m pytest"))
    sb = DirSandbox(task.repo)
    traj = asyncio.run(run_agent(task, sb, ScriptedPolicy(fmt.tokenizer, THREE_TURNS), fmt,
                                 make_tools(), agent_config(context_window=100_000),
                                 group_id=sid, trajectory_id=sid))
    asyncio.run(sb.close())
    assert len(traj.segments[0].model_turns()) == 3
    return traj


def test_a_follow_up_naming_a_turn_is_the_hint_for_that_turn_and_checked_when_stored(
        repo, fmt, tmp_path):
    from looprl.feedback.store import FeedbackStore

    traj = three_turns(repo, fmt, "s1")
    store = FeedbackStore(tmp_path / "fb.db")
    sid = store.add_session(user="u", arm="A", policy_version=0, prompt="fix add",
                            repo=str(repo), trajectory=traj, latency_s=1.0)
    for bad in (0, 4, True, "2"):
        with pytest.raises(ConfigError, match="'turn'"):
            store.add_event(sid, "follow_up", {"text": AT_TURN_2, "turn": bad})
    with pytest.raises(ConfigError, match="unexpected field"):  # only a follow-up answers a turn
        store.add_event(sid, "kept", {"turn": 2})
    ev = store.add_event(sid, "follow_up", {"text": AT_TURN_2, "turn": 2}).event
    assert ev.payload == {"text": AT_TURN_2, "turn": 2} and ev.sentiment == "dissatisfied"
    hint = follow_up_hint(traj, store.events(sid))
    assert hint is not None and (hint.turn, hint.text) == (2, AT_TURN_2)
    last = Event(1, sid, "follow_up", {"text": AT_TURN_2}, 0.0, sentiment="dissatisfied")
    assert follow_up_hint(traj, [last]).turn == 3  # none named: the reply the session returned
    store.close()


def _cycle_store(tmp_path, repo, fmt, follow_up: dict | None):
    """A store with two served 3-turn sessions of v0: one reverted (with ``follow_up``), one
    kept (a different request, so the rows differ)."""
    from looprl.feedback.store import FeedbackStore

    store = FeedbackStore(tmp_path / "fb.db")
    sids = [store.add_session(user=f"u{i}", arm="A", policy_version=0, prompt=f"fix add {i}",
                              repo=str(repo), trajectory=three_turns(repo, fmt, f"s{i}"),
                              latency_s=1.0) for i in range(2)]
    store.add_event(sids[0], "reverted")
    store.add_event(sids[1], "kept")
    if follow_up is not None:
        store.add_event(sids[0], "follow_up", follow_up)
    return store, sids


def _run_cycle(tmp_path, store, follow_ups: bool, monkeypatch):
    """``feedback.cycle.run_cycle`` as ``looprl feedback cycle --follow-ups`` runs it, on a
    tiny random model, with the distillation term's inputs recorded."""
    import looprl.trainer.step as step_mod
    from looprl.feedback.cycle import CycleConfig, run_cycle
    from looprl.harness.run_state import AgentConfig
    from looprl.trainer.config import FeedbackDistill

    from .test_cycle import save_tiny

    seen = []
    real = step_mod.hint_distillation

    def spy(model, pairs, **kw):
        out = real(model, pairs, **kw)
        seen.append((list(pairs), out))
        return out

    monkeypatch.setattr(step_mod, "hint_distillation", spy)
    model = save_tiny(tmp_path / "base", max_positions=16_384)
    cfg = CycleConfig(min_sessions=2, micro_batch_tokens=32_768,
                      feedback=FeedbackDistill(coef=0.5, max_per_group=4, follow_ups=follow_ups),
                      agent=AgentConfig(max_turns=3, max_new_tokens=8, context_window=100_000))
    res = run_cycle(store, model, tmp_path / "out", cfg)
    hinted = tmp_path / "out" / "hinted.jsonl"
    conts = ([Trajectory.from_json(x) for x in hinted.read_text().splitlines()]
             if hinted.exists() else [])
    return res, conts, seen


@needs_bwrap[0]
@skip_without_sandbox
def test_the_cycle_distils_a_follow_up_after_the_turn_it_answers_never_as_model_tokens(
        repo, fmt, tmp_path, monkeypatch):
    store, (s0, s1) = _cycle_store(tmp_path, repo, fmt, {"text": AT_TURN_2, "turn": 2})
    res, conts, seen = _run_cycle(tmp_path, store, True, monkeypatch)
    assert res.status == "candidate" and res.step is not None
    assert res.step["sequences"] == 2  # the sessions; the continuation is no GRPO row
    assert res.step["hints"] == 1 and res.step["hint_kl"] > 0
    (cont,) = conts
    session = store.session(s0)
    assert session.trajectory is not None
    (seg,), (cseg,) = session.trajectory.segments, cont.segments
    h = cont.hint
    assert cont.metadata["hinted_from"] == s0 and cont.metadata["candidate_version"] == 1
    assert h is not None and (h.turn, h.kind, h.text) == (2, "follow_up", AT_TURN_2)
    spans = seg.model_turns()
    assert h.start == spans[1][1]  # after turn 2's tokens, not after the last turn's
    assert cseg.token_ids_T[:h.start] == seg.token_ids_T[:h.start]
    assert AT_TURN_2 in fmt.decode(cseg.token_ids_T[h.start:h.end])
    # the student saw what the session saw after turn 2: turn 2's tool results, then turn 3
    assert list(h.student_ids_T) == list(seg.token_ids_T[spans[1][1]:spans[2][0]])
    past = turn_messages(session.trajectory.messages)[1][1]  # one past turn 2's tool results
    assert cont.messages[:past] == session.trajectory.messages[:past]
    assert cont.messages[past] == {"role": "user", "content": AT_TURN_2}
    assert cont.messages[past + 1]["role"] == "assistant"
    # the hint and everything before it carry no loss; the continuation alone is distilled
    model_pos = [i for i, m in enumerate(cseg.loss_mask_T) if m]
    assert model_pos and not any(cseg.loss_mask_T[:h.end]) and min(model_pos) >= h.end
    ((pair,), out), = seen
    assert pair.teacher_ids_T.tolist() == list(cseg.token_ids_T)
    assert pair.teacher_pos_N.tolist() == model_pos
    shift = len(h.student_ids_T) - (h.end - h.start)
    assert pair.student_pos_N.tolist() == [p + shift for p in model_pos]
    assert pair.student_ids_T.tolist()[:spans[2][0]] == list(seg.token_ids_T[:spans[2][0]])
    assert out.tokens == len(model_pos) and float(out.loss) > 0
    store.close()


@needs_bwrap[0]
@skip_without_sandbox
@pytest.mark.parametrize("follow_up, on", [({"text": "thanks, works now"}, True),
                                           ({"text": AT_TURN_2, "turn": 2}, False)])
def test_the_cycle_hints_nothing_without_a_dissatisfied_follow_up_or_the_switch(
        repo, fmt, tmp_path, monkeypatch, follow_up, on):
    store, _ = _cycle_store(tmp_path, repo, fmt, follow_up)
    res, conts, seen = _run_cycle(tmp_path, store, on, monkeypatch)
    assert res.status == "candidate" and res.step is not None
    assert res.step["hints"] == 0 and res.step["hint_kl"] == 0.0 and res.step["sequences"] == 2
    assert conts == [] and seen == []
    store.close()
