"""A/B: deterministic assignment, per-arm metrics from a real store, intervals and decisions."""

from __future__ import annotations

import random

import pytest

from looprl.errors import ConfigError
from looprl.feedback.ab import ab_report, assign_arm, bootstrap_diff, compare_arms

from .conftest import TWO_FILE_DIFF, add


def test_assignment_is_deterministic_and_follows_the_split():
    users = [f"user-{i}" for i in range(4000)]
    arms = [assign_arm(u, "exp1", 0.2) for u in users]
    assert arms == [assign_arm(u, "exp1", 0.2) for u in users]
    assert 0.17 < arms.count("B") / len(arms) < 0.23
    # a user on B at 20% stays on B at 50% (ramping up only moves users A -> B)
    assert all(assign_arm(u, "exp1", 0.5) == "B" for u, a in zip(users, arms, strict=True)
               if a == "B")
    # another experiment reshuffles
    other = [assign_arm(u, "exp2", 0.2) for u in users]
    assert other != arms
    with pytest.raises(ConfigError, match="split_b"):
        assign_arm("u", "e", 1.5)


def test_bootstrap_interval_covers_the_true_difference():
    rng = random.Random(0)
    a = [1.0 if rng.random() < 0.5 else -1.0 for _ in range(400)]
    b = [1.0 if rng.random() < 0.7 else -1.0 for _ in range(400)]
    lo, hi = bootstrap_diff(a, b, n_boot=2000, seed=1)
    assert lo < 0.4 < hi and lo > 0  # true diff 0.4, clearly positive
    lo0, hi0 = bootstrap_diff(a, a, n_boot=2000, seed=1)
    assert lo0 < 0 < hi0


def _arms(p_kept_a: float, p_kept_b: float, n: int, seed: int = 0):
    rng = random.Random(seed)

    def vals(p):
        out = []
        for _ in range(n):
            k = rng.random() < p
            out.append({"reward": 1.0 if k else -1.0, "resolved": float(k), "kept": float(k),
                        "reverted": float(not k), "dissatisfied": 0.0})
        return out

    return {"A": vals(p_kept_a), "B": vals(p_kept_b)}, {"A": n, "B": n}


def test_decisions():
    vals, served = _arms(0.5, 0.8, 300)
    assert compare_arms(vals, served, min_sessions=100).decision.action == "promote"
    vals, served = _arms(0.8, 0.5, 300)
    assert compare_arms(vals, served, min_sessions=100).decision.action == "rollback"
    vals, served = _arms(0.6, 0.6, 300, seed=3)
    assert compare_arms(vals, served, min_sessions=100).decision.action == "keep"
    def no_edits(vals):  # nothing resolved or reverted on either arm: the follow-ups decide
        for v in (x for arm in vals.values() for x in arm):
            v["resolved"] = 0.0
            del v["kept"], v["reverted"]
        return vals

    assert compare_arms(no_edits(vals), served, min_sessions=100).decision.action == "keep"
    vals, served = _arms(0.8, 0.5, 300)
    d = compare_arms(no_edits(vals), served, min_sessions=100).decision
    assert d.action == "rollback" and d.reason.startswith("reward dropped")
    vals, served = _arms(0.5, 0.8, 300)
    assert compare_arms(no_edits(vals), served, min_sessions=100).decision.action == "promote"
    vals, served = _arms(0.1, 0.9, 20)  # a huge effect, but too few sessions
    d = compare_arms(vals, served, min_sessions=100).decision
    assert d.action == "keep" and "need >= 100" in d.reason


def test_report_from_store(store):
    # arm A: 2 kept, 1 reverted, 1 silent; arm B: 3 kept (one with a complaint); 1 infra failure
    a = [add(store, user=f"a{i}", arm="A") for i in range(4)]
    b = [add(store, user=f"b{i}", arm="B", version=1) for i in range(3)]
    from looprl.types import StopReason
    add(store, user="x", arm="B", version=1, stop=StopReason.INFRA_ERROR)
    for sid, kind in zip(a[:3], ["kept", "kept", "reverted"], strict=True):
        store.add_event(sid, kind)
    for sid in b:
        store.add_event(sid, "kept")
    store.add_event(b[0], "follow_up", {"text": "still failing"})
    rep = ab_report(store, min_sessions=2, n_boot=500)
    A, B = rep.arms["A"], rep.arms["B"]
    assert (A.sessions, A.scored, B.sessions, B.scored) == (4, 3, 3, 3)
    assert A.kept == pytest.approx(2 / 3) and A.reverted == pytest.approx(1 / 3)
    assert B.kept == 1.0 and B.dissatisfied == pytest.approx(1 / 3)
    assert A.reward == pytest.approx(1 / 3) and B.reward == pytest.approx((0.5 + 2) / 3)
    assert rep.diffs["reward"].diff == pytest.approx(B.reward - A.reward)
    assert rep.decision.action in ("keep", "promote")
    assert A.edited == 1.0 and B.edited == 1.0  # every scored session had an edit event
    c = add(store, user="a9", arm="A")  # no edit, only a complaint: scored, not in kept's count
    store.add_event(c, "follow_up", {"text": "you did nothing"})
    A = ab_report(store, experiment="", min_sessions=2, n_boot=500).arms["A"]
    assert A.scored == 4 and A.edited == pytest.approx(3 / 4) and A.kept == pytest.approx(2 / 3)
    assert A.resolved == pytest.approx(2 / 4)
    # filtering by version: arm B sessions were served by v1, not v2
    rep2 = ab_report(store, policy_versions={"A": 0, "B": 2}, min_sessions=2)
    assert "B" not in rep2.arms and rep2.decision.action == "keep"
    # filtering by experiment: sessions of another experiment are not counted
    from .conftest import make_traj
    other = store.add_session(user="o", arm="A", policy_version=0, prompt="p", repo="/r",
                              trajectory=make_traj(), latency_s=1.0, experiment="exp9")
    store.add_event(other, "reverted")
    assert ab_report(store, min_sessions=2).arms["A"].scored == 5
    assert ab_report(store, experiment="", min_sessions=2).arms["A"].scored == 4
    assert ab_report(store, experiment="exp9", min_sessions=2).arms["A"].scored == 1
    d = rep.to_dict()
    assert set(d) == {"arms", "diffs", "decision"} and d["arms"]["B"]["scored"] == 3


def test_kept_within_requests_sees_through_editing_only_easy_requests(store):
    """A edits both requests (keeps the easy fix, reverts the hard one); B edits only the easy one
    and changes nothing on the hard one. B's kept rate is higher, but within the one request both
    edited nothing changed; once B also fixes the hard request, within-request kept rises."""
    from .conftest import make_traj

    def session(arm: str, prompt: str, kind: str | None, i: int) -> None:
        sid = store.add_session(user=f"{arm}{prompt}{i}", arm=arm, policy_version=int(arm == "B"),
                                prompt=prompt, repo="/srv/repo", latency_s=1.0,
                                trajectory=make_traj("" if kind is None else TWO_FILE_DIFF))
        if kind is None:
            store.add_event(sid, "follow_up", {"text": "you did nothing"})
        else:
            store.add_event(sid, kind)

    for i in range(4):
        session("A", "easy", "kept", i)
        session("A", "hard", "reverted", i)
        session("B", "easy", "kept", i)
        session("B", "hard", None, i)
    rep = ab_report(store, min_sessions=2, n_boot=500)
    assert rep.diffs["kept"].diff == pytest.approx(0.5)
    w = rep.diffs["kept_within_requests"]
    assert (w.diff, w.lo, w.hi, w.strata) == (0.0, 0.0, 0.0, 1)
    assert rep.diffs["edited"].diff == pytest.approx(-0.5)
    assert rep.arms["A"].resolved == rep.arms["B"].resolved == pytest.approx(0.5)  # no one better off
    for i in range(4, 8):
        session("B", "hard", "kept", i)
    w = ab_report(store, min_sessions=2, n_boot=500).diffs["kept_within_requests"]
    # easy: 0 on 8 edited sessions; hard: 1 - 0 on 8: weighted +0.5, and every resample agrees
    assert (w.diff, w.strata) == (pytest.approx(0.5), 2) and w.lo == pytest.approx(0.5)


def test_silence_after_no_edit_hides_no_failure_from_resolved(store):
    """A edits every request (40% kept, the rest reverted); B edits only the requests it gets right
    and changes nothing on the others, about which half its users complain and half stay silent.
    Over the scored sessions B's reward is higher (the silent failures drop out); ``resolved``
    counts them, shows B resolving fewer requests, and the decision follows it."""
    def session(arm: str, i: int, edit: str | None, complain: bool = False) -> None:
        sid = add(store, user=f"{arm}{i}", arm=arm, version=int(arm == "B"),
                  diff="" if edit is None else TWO_FILE_DIFF)
        if edit is not None:
            store.add_event(sid, edit)
        if complain:
            store.add_event(sid, "follow_up", {"text": "that did not fix anything"})

    for i in range(200):
        session("A", i, "kept" if i % 5 < 2 else "reverted", complain=i % 5 >= 2)
        if i % 4 == 0:
            session("B", i, "kept")
        else:  # B: no edit; a complaint on one third of them
            session("B", i, None, complain=i % 4 == 1)
    rep = ab_report(store, min_sessions=50, n_boot=500)
    A, B = rep.arms["A"], rep.arms["B"]
    assert B.reward > A.reward and B.kept == 1.0  # what the scored sessions alone say
    assert (A.scored, B.scored) == (200, 100) and (A.sessions, B.sessions) == (200, 200)
    assert A.resolved == pytest.approx(0.4) and B.resolved == pytest.approx(0.25)
    assert rep.diffs["resolved"].hi < 0
    assert rep.decision.action == "rollback" and "fewer requests resolved" in rep.decision.reason
