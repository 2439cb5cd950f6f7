"""The real-time RL loop (``feedback.loop``): its decisions, its groups, and one real run.

The end-to-end test runs ``looprl feedback loop`` as a user would (its own process, which starts
``looprl serve`` on a tiny default model with real sandboxes) and plays the users itself at the
HTTP seam: it sends sessions and answers each by the arm it landed on, so that the first
candidate is better on live traffic (it must be promoted and then served) and the second, the
deliberately broken one, is worse (it must be rolled back while the promoted one keeps serving).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from looprl.config import load_config
from looprl.errors import ConfigError
from looprl.feedback.ab import ABReport, Diff
from looprl.feedback.gate import ab_decision
from looprl.feedback.realtime_config import RealtimeConfig
from looprl.feedback.store import FeedbackStore
from looprl.feedback.window import window_groups
from looprl.tasks.taskset import write_tasks
from looprl.types import Grader, RewardBreakdown, Task, Trajectory
from tests.bwrap_support import needs_bwrap
from tests.example_package import write_example_package

from .conftest import make_traj


def report(resolved: tuple[float, float, float], reverted: tuple | None = None,
           reward: tuple = (0.5, 0.4, 0.6)) -> ABReport:
    diffs = {m: Diff(m, None, None, None) for m in ("kept", "dissatisfied", "latency")}
    diffs["resolved"] = Diff("resolved", *resolved)
    diffs["reward"] = Diff("reward", *reward)
    diffs["reverted"] = Diff("reverted", *(reverted or (None, None, None)))
    return ABReport({}, diffs, None)  # type: ignore[arg-type]


def test_ab_decision_promotes_only_what_the_interval_supports():
    assert ab_decision(report((0.1, -0.05, 0.25)), 0.2, 0.05)[0] == "promote"
    assert ab_decision(report((0.1, -0.3, 0.5)), 0.2, 0.05)[0] == "rollback"  # too uncertain
    assert ab_decision(report((-0.01, -0.1, 0.08)), 0.2, 0.05)[0] == "rollback"  # lower
    assert ab_decision(report((0.2, 0.1, 0.3), (0.2, 0.1, 0.3)), 0.2, 0.05)[0] == "rollback"
    action, why = ab_decision(report((None, None, None)), 0.2, 0.05)
    assert action == "rollback" and "no resolved" in why
    # the reward is up, but fewer requests were resolved (the candidate edits less): rolled back
    action, why = ab_decision(report((-0.05, -0.15, 0.05), reward=(0.3, 0.0, 0.6)), 0.2, 0.05)
    assert action == "rollback" and why.startswith("resolved") and "lower" in why
    # as many resolved (none edit), but users complain more: rolled back on the reward
    action, why = ab_decision(report((0.0, 0.0, 0.0), reward=(-0.3, -0.6, 0.0)), 0.2, 0.05)
    assert action == "rollback" and why.startswith("reward") and "lower" in why
    # the reward's margin is twice the share's: -0.35 is within 0.4
    assert ab_decision(report((0.0, 0.0, 0.0), reward=(0.05, -0.35, 0.45)), 0.2, 0.05)[0] \
        == "promote"


def traj(i: str, request: str, r: float) -> Trajectory:
    return dataclasses.replace(make_traj(), id=i, reward=RewardBreakdown(components={}, total=r),
                               metadata={"request": request})


def test_repeated_requests_form_groups_and_single_ones_get_a_baseline():
    trajs = [traj("a", "x", 1.0), traj("b", "x", -1.0), traj("c", "y", 1.0),
             traj("d", "z", -1.0), traj("e", "w", 0.0)]
    groups = window_groups(trajs, {"y": [0.0, -1.0]}, "c1")
    by_req = {g.metadata["request"]: g for g in groups}
    assert [t.id for t in by_req["x"].trajectories] == ["a", "b"]
    assert "baseline" not in by_req["x"].metadata  # the group's own mean
    assert by_req["y"].metadata["baseline"] == -0.5  # the request's past
    assert by_req["y"].metadata["baseline_from"] == "request"
    # a new request: the window's mean without the session itself (1 - 1 + 1 + 0) / 4
    assert by_req["z"].metadata["baseline"] == pytest.approx(0.25)
    assert by_req["z"].metadata["baseline_from"] == "window"


def test_single_sessions_train_against_their_baseline():
    """trainer.batch takes A = r - baseline for a group of one (not a skipped zero-variance one)."""
    from looprl.trainer.batch import Credit, _rows
    from looprl.types import Group

    t = dataclasses.replace(make_traj(), id="a", reward=RewardBreakdown(components={}, total=1.0))
    rows, zero_var, *_ = _rows([Group("s", "g", (t,), {"baseline": 0.25})], Credit())
    assert [r.advantage for r in rows] == [0.75] and zero_var == 0
    rows, zero_var, *_ = _rows([Group("s", "g", (t,), {"baseline": 1.0})], Credit())
    assert rows == [] and zero_var == 1  # equal to its baseline: no signal
    rows, zero_var, *_ = _rows([Group("s", "g", (t,))], Credit())
    assert rows == [] and zero_var == 1  # a group of one without a baseline has none


def test_config_errors_say_what_to_fix(tmp_path):
    with pytest.raises(ConfigError, match="model"):
        load_config(RealtimeConfig, None, [])
    with pytest.raises(ConfigError, match="users.tasks"):
        load_config(RealtimeConfig, None, ["model=m"])
    with pytest.raises(ConfigError, match="did you mean window"):
        load_config(RealtimeConfig, None, ["model=m", "users.simulate=false", "windw=3"])


def test_the_gate_may_share_the_users_file_only_past_the_tasks_they_send(tmp_path):
    from looprl.feedback.realtime_config import gate_tasks

    grader = Grader(CMD, ("tests/test_core.py::test_mean",), (), ("tests/test_core.py",))
    tasks = write_tasks([Task(f"t{i}", str(tmp_path), f"fix {i}", grader=grader) for i in range(10)],
                        tmp_path / "heldout.jsonl")

    def gate(**over: str) -> list[str]:
        ovs = [f"{k}={v}" for k, v in over.items()]
        cfg = load_config(RealtimeConfig, None, ["model=m", f"users.tasks={tasks}", "users.limit=4",
                                                 f"gate.tasks={tasks}", *ovs])
        return [t.id for t in gate_tasks(cfg)]

    assert gate(**{"gate.skip": "4"}) == [f"t{i}" for i in range(4, 10)]
    assert gate(**{"gate.skip": "5", "gate.limit": "2"}) == ["t5", "t6"]
    with pytest.raises(ConfigError, match=r"share 1 .*t3.*gate.skip"):
        gate(**{"gate.skip": "3"})
    with pytest.raises(ConfigError, match="no tasks after skipping 10"):
        gate(**{"gate.skip": "10"})
    with pytest.raises(ConfigError, match=r"gate.skip must be in \[0, "):
        gate(**{"gate.skip": "-5"})


CMD = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=src python -m "
       "pytest -p no:cacheprovider -q -rA --tb=short --color=no -o addopts=")


@pytest.mark.slow
@needs_bwrap[0]
def test_a_run_promotes_a_better_candidate_and_rolls_back_a_broken_one(tmp_path):
    from looprl.models.tiny import init_default_model

    model = init_default_model(tmp_path / "m", size="tiny", corpus_chars=50_000, vocab_size=512)
    repo = write_example_package(tmp_path / "repos" / "minicalc")
    gate = write_tasks([Task("minicalc-mean", str(repo), "mean is wrong", venv=sys.prefix,
                             grader=Grader(CMD, ("tests/test_core.py::test_mean",), (),
                                           ("tests/test_core.py",)))], tmp_path / "gate.jsonl")
    cfg = tmp_path / "loop.toml"
    cfg.write_text(f"""
name = "e2e"
model = "{model}"
cycles = 2
window = 6
steps = 1
inject_bad_cycle = 2
window_timeout_min = 5
[grpo]
lr = 1e-3
[grpo.experimental.credit]
skip_groups_without_pass = false
[users]
simulate = false
[serve]
max_concurrent = 2
max_turns = 1
max_new_tokens = 8
context_window = 4096
watch_s = 0.5
allowed_roots = ["{tmp_path / 'repos'}"]
[gate]
tasks = "{gate}"
max_turns = 1
max_new_tokens = 8
max_drop = 0.5
concurrency = 2
[ab]
sessions = 4
margin = 0.2
timeout_min = 5
""")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "looprl", "feedback", "loop", "-c", str(cfg),
                             "--runs", str(tmp_path / "runs")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    run = tmp_path / "runs" / "e2e"
    sent: list[str] = []
    seen: list[tuple[str, int]] = []
    try:
        deadline = time.time() + 300
        while not (run / "server.json").is_file():
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
            time.sleep(0.5)
        server = json.loads((run / "server.json").read_text())
        auth = {"Authorization": f"Bearer {server['token']}"}
        with httpx.Client(base_url=server["url"], headers=auth, timeout=120) as c:
            i = 0
            while proc.poll() is None:
                try:
                    r = c.post("/v1/sessions", json={"user": f"u{i}", "prompt": "mean is wrong",
                                                     "repo": str(repo)})
                except httpx.HTTPError:
                    break  # the loop stopped its server
                if r.status_code != 200 and (proc.poll() is not None
                                             or r.json().get("error") == "shutting_down"):
                    break  # the server drains as the loop ends
                assert r.status_code == 200, r.text
                body = r.json()
                sent.append(body["session_id"])
                seen.append((body["arm"], body["policy_version"]))
                # v1 (cycle 1's candidate) pleases; the start (v0) and the broken v2 disappoint
                bad = body["policy_version"] != 1
                if i % 3 == 0:
                    bad = i % 2 == 0  # some variance on every arm: windows carry a signal
                try:
                    c.post(f"/v1/sessions/{body['session_id']}/feedback", json={
                        "event_id": f"e{i}", "kind": "follow_up",
                        "text": "that's wrong, still failing" if bad else "thanks, works now"}
                           ).raise_for_status()
                except httpx.HTTPError:
                    assert proc.poll() is not None or proc.wait(60) is not None
                    break  # the loop ended and stopped its server between the two calls
                i += 1
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    rows = [json.loads(line) for line in (run / "cycles.jsonl").read_text().splitlines()]
    assert [(r["status"], r["injected"]) for r in rows] == [("promoted", False),
                                                          ("rolled_back", True)], out
    assert ("B", 1) in seen and ("A", 1) in seen and ("B", 2) in seen
    assert json.loads((run / "policies" / "current.json").read_text())["version"] == 1
    line = out.strip().splitlines()[-1]
    assert line.startswith("cycles=2 ") and "rollback_ok=1" in line and " lost=0 " in line
    store = FeedbackStore(run / "feedback.db")
    stored = [s.id for s in store.sessions()]
    assert sorted(stored) == sorted(sent)  # every session sent is stored, once
    trained = [sid for c in store.cycles() for sid in c.session_ids]
    assert len(trained) == len(set(trained)) == 12  # two windows of 6, none trained twice
    assert {s.policy_version for s in store.sessions() if s.id in set(trained)} == {0, 1}
    assert (run / "report.md").is_file() and (run / "ab.png").is_file()
    assert "rolled_back" in (run / "report.md").read_text()


@pytest.mark.slow
@needs_bwrap[0]
def test_a_stopped_run_reports_its_finished_cycles_without_a_traceback(tmp_path):
    """SIGTERM while the loop waits for its first window: users and server stop, and the run
    still ends with its report, its accounting and a one-line reason (exit 1, not a traceback)."""
    import signal

    from looprl.models.tiny import init_default_model

    model = init_default_model(tmp_path / "m", size="tiny", corpus_chars=50_000, vocab_size=512)
    repo = write_example_package(tmp_path / "repos" / "minicalc")
    cfg = tmp_path / "loop.toml"
    cfg.write_text(f"""
name = "stopped"
model = "{model}"
window = 6
[users]
simulate = false
[serve]
max_turns = 1
max_new_tokens = 8
context_window = 4096
allowed_roots = ["{repo.parent}"]
""")
    proc = subprocess.Popen([sys.executable, "-m", "looprl", "feedback", "loop", "-c", str(cfg),
                             "--runs", str(tmp_path / "runs")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    run = tmp_path / "runs" / "stopped"
    try:
        deadline = time.time() + 300
        while not (run / "server.json").is_file():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, (out, err)
    assert err.strip().splitlines()[-1] == "stopped early: stopped by signal 15 during cycle 1", err
    assert "Traceback" not in out + err
    assert out.strip().splitlines()[-1].startswith("cycles=0 sessions=0 ")
    assert " lost=0 " in (run / "result.txt").read_text()
    assert "**Stopped early** (stopped by signal 15 during cycle 1)" in (run / "report.md").read_text()


def test_windows_continue_one_adam_state(tmp_path, store):
    """The first window continues the Adam state of the run that trained the start model (the
    newest checkpoint under ``optimizer``); each candidate keeps the state its window left and
    the next window continues it, at the loop's own learning rate."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from looprl.feedback.policies import OPTIMIZER_FILE, PolicyRef, save_candidate
    from looprl.feedback.update import optimizer_state, train_groups
    from looprl.feedback.window import window
    from looprl.models.loading import load_model
    from looprl.trainer.checkpoint import save_checkpoint
    from looprl.trainer.config import GRPOConfig, GRPOExperimental
    from looprl.trainer.losses import LossParams
    from looprl.trainer.step import make_optimizer

    from .test_cycle import feedback, save_tiny

    start = save_tiny(tmp_path / "start")
    feedback(store, 4)
    groups = window_groups(window(store, 0, "edit_outcome"), {}, "c1")
    grpo = GRPOConfig(lr=3e-4, experimental=GRPOExperimental(objective=LossParams(norm_tokens=64)))
    # the run that trained the start model: two checkpoints, the newest with 7 Adam steps
    model = load_model(start, dtype="float32").model
    opt = make_optimizer(model, GRPOConfig(lr=1e-2))
    for n in range(1, 8):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        if n in (3, 7):
            save_checkpoint(tmp_path / "ckpt", n, model, opt)
    assert optimizer_state(start) is None  # no state of its own, none named: a fresh Adam
    first = optimizer_state(start, str(tmp_path / "ckpt"))
    assert first == tmp_path / "ckpt" / "step_00000007" / OPTIMIZER_FILE

    assert len(groups) == 1  # one request: one group, one step a window
    _, tok, m, state = train_groups(PolicyRef(start, 0), groups, grpo, 4, 0, first)
    steps = {int(s["step"]) for s in state["state"].values()}
    assert m["updates"] == 1 and steps == {8}  # 7 of the run's + this window's
    assert state["param_groups"][0]["lr"] == 3e-4  # the loop's, not the run's 1e-2
    cand = save_candidate(load_model(start, dtype="float32").model, tok, tmp_path / "policies",
                          1, {}, optimizer_state=state)
    assert optimizer_state(cand, str(tmp_path / "ckpt")) == cand / OPTIMIZER_FILE  # its own
    *_, state2 = train_groups(PolicyRef(cand, 1), groups, grpo, 4, 0, optimizer_state(cand))
    assert {int(s["step"]) for s in state2["state"].values()} == {9}

    # momentum=False: the run's second moments, its first zeroed before the window's step, so
    # the step's first moment is that with momentum less beta1 times the run's.
    run = torch.load(first, weights_only=True)["state"]
    *_, state3 = train_groups(PolicyRef(start, 0), groups, grpo, 4, 0, first, momentum=False)
    for i, st in state3["state"].items():
        with_run = state["state"][i]
        assert torch.equal(st["exp_avg_sq"], with_run["exp_avg_sq"])
        assert torch.count_nonzero(run[i]["exp_avg"]) > 0
        torch.testing.assert_close(st["exp_avg"],
                                   with_run["exp_avg"]
                                   - grpo.experimental.adam_beta1 * run[i]["exp_avg"])

    # the loop's choice per window: the start model's run's state, its momentum as the config
    # says; a candidate's own state, always with its momentum
    from looprl.feedback.realtime_config import RealtimeConfig, UsersSection
    from looprl.feedback.update import window_optimizer

    for keep in (True, False):
        cfg = RealtimeConfig(model=str(start), optimizer=str(tmp_path / "ckpt"),
                             optimizer_momentum=keep, users=UsersSection(simulate=False))
        assert window_optimizer(cfg, start) == (first, keep)
        assert window_optimizer(cfg, cand) == (cand / OPTIMIZER_FILE, True)

    with pytest.raises(ConfigError, match="no complete checkpoint"):
        optimizer_state(start, str(tmp_path / "policies"))
    other = save_tiny(tmp_path / "other", max_positions=128)
    big = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=48, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=2))
    bad = make_optimizer(big, GRPOConfig())
    torch.save(bad.state_dict(), tmp_path / "bad.pt")
    with pytest.raises(ConfigError, match="does not fit the model"):
        train_groups(PolicyRef(other, 0), groups, grpo, 1, 0, tmp_path / "bad.pt")


def test_a_cycle_starts_only_if_it_and_the_final_ab_fit_the_budget(tmp_path):
    """The run's ``max_minutes`` covers the final A/B: estimated at the rate users answered."""
    import time

    from looprl.feedback.loop_cycle import Loop

    from .conftest import add

    def loop(max_minutes: float) -> Loop:
        cfg = load_config(RealtimeConfig, None, ["model=m", "users.simulate=false",
                                                 f"max_minutes={max_minutes}",
                                                 "ab.final_sessions=50", "ab.split_b=0.5"])
        lp = Loop(cfg, tmp_path / f"run{max_minutes}", lambda _: None)
        for i in range(100):  # 100 answered sessions in 10 minutes: 5 a minute per arm
            lp.store.add_event(add(lp.store, user=f"u{i}"), "kept")
        add(lp.store, user="silent")  # not answered: not in the rate
        lp.t0 = time.monotonic() - 600
        return lp

    assert loop(60).fits([])[0]  # nothing measured yet: the first cycle starts
    fits, why = loop(60).fits([6.0, 8.0])  # 50 left >= a cycle (8) + the final A/B (10)
    assert fits, why
    fits, why = loop(27).fits([6.0, 8.0])  # 17 left < 18
    assert not fits and "17 of 27 min left" in why and "final A/B ~10" in why, why
