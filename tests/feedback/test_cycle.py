"""The real-time RL cycle: windows of scored sessions -> a real GRPO step -> candidate -> gate.

The fast tests use a tiny random Llama saved in HF format (built in ~0.1 s) and stored sessions;
the slow one serves a tiny default model through the API in real sandboxes, so the tokens and
logprobs it trains on are the engine's own, then gates the candidate with the bench."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.errors import ConfigError
from looprl.feedback.cycle import CycleConfig, run_cycle
from looprl.feedback.policies import (
    CANDIDATE,
    POINTER,
    POLICY_META,
    PolicyRef,
    init_policies,
    offer_candidate,
    promote,
    read_candidate,
    read_policy,
    withdraw_candidate,
)
from looprl.feedback.window import window
from looprl.models.tokenizer import build_tokenizer
from tests.bwrap_support import skip_without_sandbox

from .conftest import add


def save_tiny(path: Path, max_positions: int = 256) -> Path:
    tok = build_tokenizer(None)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def weights(path: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(path / "model.safetensors"))


@pytest.fixture
def model_dir(tmp_path) -> Path:
    return save_tiny(tmp_path / "base")


def feedback(store, n: int, version: int = 0) -> list[str]:
    """``n`` sessions, every other one kept; a kept session's reply differs from a reverted one's
    (sessions with the same tokens and opposite advantages would cancel in the step)."""
    sids = [add(store, user=f"u{i}", version=version, tokens=(5, 6, 7, 8) if i % 2 else (5, 6, 9, 10))
            for i in range(n)]
    for i, sid in enumerate(sids):
        store.add_event(sid, "kept" if i % 2 else "reverted")
    return sids


def test_too_few_sessions_skips_and_keeps_them(store, model_dir, tmp_path):
    sids = feedback(store, 3)
    add(store, user="silent")  # no feedback yet: not in the window
    res = run_cycle(store, model_dir, tmp_path / "out", CycleConfig(min_sessions=4))
    assert res.status == "skipped" and "3 scored untrained sessions" in res.reason
    assert {s.id for s in store.sessions(untrained=True)} >= set(sids)
    assert store.cycles()[-1].status == "skipped"


def test_equal_rewards_carry_no_signal(store, model_dir, tmp_path):
    for i in range(4):
        store.add_event(add(store, user=f"u{i}"), "kept")
    res = run_cycle(store, model_dir, tmp_path / "out", CycleConfig(min_sessions=2))
    assert res.status == "skipped" and "all 4 rewards equal" in res.reason


def test_window_baseline_is_the_batch_mean(store):
    feedback(store, 4)
    trajs = window(store, 0, "edit_outcome")
    assert sorted(t.reward.total for t in trajs) == [-1.0, -1.0, 1.0, 1.0]
    from looprl.feedback.window import window_group
    from looprl.trainer.batch import build_batch

    b = build_batch([window_group(trajs, "w")])
    adv = sorted(float(a) for mb in b.micro_batches for a in mb.advantages_B)
    assert adv == [-1.0, -1.0, 1.0, 1.0]  # r - mean(r), mean = 0


def test_cycle_trains_saves_candidate_and_records(store, model_dir, tmp_path):
    sids = feedback(store, 4)
    feedback(store, 2, version=7)  # another policy's sessions: not trained on
    out = tmp_path / "out"
    res = run_cycle(store, model_dir, out, CycleConfig(min_sessions=4, lr=1e-2))
    assert res.status == "candidate" and "looprl feedback promote" in res.reason
    assert (res.policy_version, res.candidate_version, res.sessions) == (0, 1, 4)
    assert res.step["updates"] == 1 and res.step["tokens"] == 8  # 2 model tokens x 4 sessions
    cand = Path(res.candidate_path)
    assert cand == out / "v0001" and json.loads((cand / "looprl_policy.json").read_text())[
        "parent_version"] == 0
    before, after = weights(model_dir), weights(cand)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not (out / POINTER).exists()  # not promoted without a gate
    rec = store.cycles()[-1]
    assert set(rec.session_ids) == set(sids) and rec.candidate_version == 1
    assert window(store, 0, "edit_outcome") == []  # trained: no later window takes them
    assert {t.id for t in window(store, 0, "edit_outcome", untrained=False)} == set(sids)
    # trained once: the next cycle has nothing new from v0
    assert run_cycle(store, model_dir, out, CycleConfig(min_sessions=1)).status == "skipped"
    # promotion makes v1 current; its sessions are the next window
    assert promote(out, 1).version == 1 and read_policy(out).path == cand.resolve()
    feedback(store, 2, version=1)
    res2 = run_cycle(store, model_dir, out, CycleConfig(min_sessions=2, promote_ungated=True))
    assert (res2.status, res2.policy_version, res2.candidate_version) == ("promoted", 1, 2)
    assert read_policy(out).version == 2


def test_sessions_from_another_tokenizer_are_refused(store, model_dir, tmp_path):
    from .conftest import make_traj

    for i, kind in enumerate(("kept", "reverted")):
        sid = store.add_session(user=f"u{i}", arm="A", policy_version=0, prompt="p", repo="/r",
                                trajectory=make_traj(tokens=(1, 2, 3, 99_999)), latency_s=1.0)
        store.add_event(sid, kind)
    with pytest.raises(ConfigError, match="another tokenizer"):
        run_cycle(store, model_dir, tmp_path / "out", CycleConfig(min_sessions=2))


def test_policy_paths_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="neither a model directory"):
        read_policy(tmp_path)
    with pytest.raises(ConfigError, match="no candidate"):
        promote(tmp_path, 3)


def test_candidate_pointer_is_offered_read_and_withdrawn(tmp_path, model_dir):
    out = tmp_path / "policies"
    save_tiny(out / "v0002")
    with pytest.raises(ConfigError, match=r"no candidate .*v0003.*\['v0002'\]"):
        offer_candidate(out, 3, "exp", 0.5)
    with pytest.raises(ConfigError, match="split_b must be in"):
        offer_candidate(out, 2, "exp", 1.5)
    assert read_candidate(out) is None
    ref = offer_candidate(out, 2, "exp-7", 0.25)
    assert read_candidate(out) == (ref, "exp-7", 0.25)
    assert ref == PolicyRef((out / "v0002").resolve(), 2)
    assert json.loads((out / CANDIDATE).read_text())["path"] == "v0002"  # relative: dir moves
    assert not (out / POINTER).exists()  # offering promotes nothing
    withdraw_candidate(out)
    assert read_candidate(out) is None
    withdraw_candidate(out)  # nothing offered: nothing to do
    (out / CANDIDATE).write_text('{"version": 2, "path": "v0002"}')  # no experiment
    with pytest.raises(ConfigError, match="not a candidate pointer.*KeyError"):
        read_candidate(out)


def test_init_policies_points_at_the_model_until_a_promotion(tmp_path, model_dir):
    (model_dir / POLICY_META).write_text(json.dumps({"version": 7}))
    out = tmp_path / "runs" / "policies"
    assert init_policies(out, model_dir) == PolicyRef(model_dir.resolve(), 7)
    ptr = json.loads((out / POINTER).read_text())
    assert ptr["version"] == 7 and Path(ptr["path"]).is_absolute()
    assert read_policy(out) == PolicyRef(model_dir.resolve(), 7)  # an absolute path stays so
    save_tiny(out / "v0008")
    promote(out, 8)
    assert init_policies(out, model_dir).version == 8  # never overwrites a current policy
    assert init_policies(tmp_path / "p2", out) == PolicyRef((out / "v0008").resolve(), 8)


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_served_sessions_train_and_gate_end_to_end(tmp_path):
    """Sessions served by a real model engine through the API, user follow-ups as feedback, one
    cycle: a real GRPO step on the engine's own tokens/logprobs, then the bench gate."""
    from fastapi.testclient import TestClient

    from looprl.feedback.store import FeedbackStore
    from looprl.harness.agent import AgentConfig
    from looprl.inference import make_engine
    from looprl.models.tiny import init_default_model
    from looprl.serve.api import ServeConfig, make_app
    from looprl.types import Grader, Task
    from tests.example_package import write_example_package

    model = init_default_model(tmp_path / "m", size="tiny", corpus_chars=50_000, vocab_size=512)
    repo = write_example_package(tmp_path / "minicalc")
    store = FeedbackStore(tmp_path / "fb.db")
    engine = make_engine("torch", path=model, kv_budget_mb=64, max_len=4096)
    agent = AgentConfig(max_turns=2, max_new_tokens=24, context_window=4096)
    app = make_app({"A": engine}, engine.tokenizer, store,
                   ServeConfig(token="t", agent=agent, allowed_roots=(str(tmp_path),)),
                   policy_versions={"A": 0})
    auth = {"Authorization": "Bearer t"}
    texts = ["thanks", "that's wrong", "still failing", "great, works now"]
    try:
        with TestClient(app) as c:
            for i, text in enumerate(texts):
                r = c.post("/v1/sessions", headers=auth,
                           json={"user": f"u{i}", "prompt": "make mean() handle floats",
                                 "repo": str(repo)})
                assert r.status_code == 200, r.text
                sid = r.json()["session_id"]
                c.post(f"/v1/sessions/{sid}/feedback", headers=auth,
                       json={"event_id": f"e{i}", "kind": "follow_up", "text": text}
                       ).raise_for_status()
    finally:
        engine.close()
    lps = [lp for s in store.sessions(with_trajectory=True) for seg in s.trajectory.segments
           for lp, m in zip(seg.logprobs_T, seg.loss_mask_T, strict=True) if m]
    assert lps and all(lp < 0 for lp in lps)  # the engine's real sampled-token logprobs

    task = Task("minicalc-mean", str(repo), "mean is wrong", venv=sys.prefix,
                grader=Grader("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 "
                              "PYTHONPATH=src python -m pytest -p no:cacheprovider -q -rA "
                              "--tb=short --color=no -o addopts=",
                              ("tests/test_core.py::test_mean",), (), ("tests/test_core.py",)))
    cfg = CycleConfig(min_sessions=4, lr=1e-2, bench_max_turns=1, bench_max_new_tokens=8)
    res = run_cycle(store, model, tmp_path / "out", cfg, tasks=[task])
    assert res.sessions == 4 and res.step["updates"] == 1 and res.step["tokens"] == len(lps)
    assert res.gate is not None and res.gate["n_tasks"] == 1
    assert res.status == ("promoted" if res.gate["passed"] else "rejected")
    assert (Path(res.candidate_path) / "bench_candidate.json").is_file()
    if res.status == "promoted":
        assert read_policy(tmp_path / "out").version == 1
    store.close()
