"""Reward signals from feedback events, and the baseline dissatisfaction classifier."""

from __future__ import annotations

import time

import pytest

from looprl.errors import ConfigError
from looprl.feedback.sentiment import follow_up_sentiment, is_dissatisfied
from looprl.feedback.signals import SIGNALS, session_reward
from looprl.types import StopReason

from .conftest import add, make_traj

DISSATISFIED_EXAMPLES = [
    "that's wrong", "That’s not what I asked for", "it didn't work", "Still failing on CI",
    "please revert that", "undo the last change", "you broke the parser", "nope, that is wrong",
    "the tests are still broken", "why did you delete the config?", "wrong file, it's in utils",
    "doesn't compile", "not working at all",
]
OTHER_EXAMPLES = [
    "thanks!", "great, works now", "now add a docstring to mean()", "can you also handle None?",
    "looks good, ship it", "that worked", "what does this function return?",
    "thanks, the undo button works now",  # a complaint word, then thanks: satisfied
    "rename it to total",
]


@pytest.mark.parametrize("text", DISSATISFIED_EXAMPLES)
def test_dissatisfied_follow_ups(text):
    assert is_dissatisfied(text)


@pytest.mark.parametrize("text", OTHER_EXAMPLES)
def test_not_dissatisfied_follow_ups(text):
    assert not is_dissatisfied(text)


def test_sentiment_three_ways():
    assert follow_up_sentiment("thanks") == "satisfied"
    assert follow_up_sentiment("add tests") == "neutral"
    assert follow_up_sentiment("undo broke it... ok fixed now, thanks") == "satisfied"
    assert follow_up_sentiment("thanks but it still fails") == "dissatisfied"


def _reward(store, sid, signal="edit_outcome"):
    return session_reward(store.session(sid), store.events(sid), signal)


def test_no_events_no_reward(store):
    assert _reward(store, add(store)) is None


@pytest.mark.parametrize("events, total", [
    ([("kept", {})], 1.0),
    ([("reverted", {})], -1.0),
    ([("partially_kept", {"files": ["pkg/a.py"]})], 0.0),  # 1 of 2 files: 2 * 0.5 - 1
    ([("kept", {"files": ["pkg/b.py"]})], 0.0),
    ([("reverted", {"files": ["pkg/b.py"]})], 0.0),
    ([("kept", {}), ("reverted", {})], -1.0),  # the last edit event decides
    ([("reverted", {}), ("kept", {})], 1.0),
    ([("kept", {}), ("follow_up", {"text": "still failing"})], 0.5),
    ([("kept", {}), ("follow_up", {"text": "thanks!"})], 1.0),
    # a complaint after a revert says nothing new: every failure scores the same
    ([("reverted", {}), ("follow_up", {"text": "still failing"})], -1.0),
    ([("partially_kept", {"files": ["pkg/a.py"]}), ("follow_up", {"text": "still failing"})], -0.5),
    ([("follow_up", {"text": "that's wrong"})], -0.5),
    ([("follow_up", {"text": "that's wrong"}), ("follow_up", {"text": "still wrong"})], -0.5),
    ([("follow_up", {"text": "add a docstring"})], 0.0),
])
def test_edit_outcome(store, events, total):
    sid = add(store)
    for kind, payload in events:
        store.add_event(sid, kind, payload)
    rb = _reward(store, sid)
    assert rb is not None and rb.total == pytest.approx(total)
    assert rb.total == pytest.approx(sum(rb.components.values()))


@pytest.mark.parametrize("follow_up, total", [
    ("that's wrong", -1.0),   # asked for a fix, got nothing: as bad as a reverted edit
    ("thanks!", 0.0),
    ("what does this function return?", 0.0),
    (None, None),             # silence after no change: nothing to score
])
def test_no_change_then_a_complaint_counts_as_reverted(store, follow_up, total):
    sid = add(store, diff="")
    if follow_up is not None:
        store.add_event(sid, "follow_up", {"text": follow_up})
    rb = _reward(store, sid)
    assert (rb is None) if total is None else rb.total == pytest.approx(total)


def test_partial_share_with_three_files(store):
    diff = "".join(f"--- a/{f}\n+++ b/{f}\n@@ -1 +1 @@\n-a\n+b\n" for f in ("x", "y", "z"))
    sid = add(store, diff=diff)
    store.add_event(sid, "partially_kept", {"files": ["x", "y"]})
    assert _reward(store, sid).components["edit"] == pytest.approx(2 * 2 / 3 - 1)


def test_latency_variant(store):
    fast, slow = add(store, latency_s=0.0), add(store, latency_s=600.0)
    for sid in (fast, slow):
        store.add_event(sid, "kept")
    assert _reward(store, fast, "edit_outcome_latency").total == pytest.approx(1.0)
    assert _reward(store, slow, "edit_outcome_latency").total == pytest.approx(0.9)


def test_infra_sessions_are_never_scored(store):
    sid = add(store, stop=StopReason.INFRA_ERROR)
    for fn in SIGNALS.values():
        assert fn(store.session(sid), []) is None


def test_unknown_signal(store):
    with pytest.raises(ConfigError, match="choose one of"):
        session_reward(store.session(add(store)), [], "vibes")


def test_the_order_users_acted_in_wins_over_arrival(store):
    """A `reverted` at t=2000 that arrives before a `kept` at t=1000: the edit ended reverted."""
    t0 = time.time() - 3000  # the session ran 50 minutes ago; t counts seconds from then
    sid = store.add_session(user="u", arm="A", policy_version=0, prompt="p", repo="/r",
                            trajectory=make_traj(), latency_s=1.0, created_at=t0)
    store.add_event(sid, "reverted", event_id="r", at=t0 + 2000)
    store.add_event(sid, "kept", event_id="k", at=t0 + 1000)
    rb = _reward(store, sid)
    assert rb.total == pytest.approx(-1.0) and rb.details["last_edit"] == "reverted"
    shuffled = list(reversed(store.events(sid)))  # a caller's own order does not matter either
    assert session_reward(store.session(sid), shuffled).total == pytest.approx(-1.0)


def test_scoring_never_reclassifies_texts(store, monkeypatch):
    """The cost of a reward does not grow with what users typed: the classifier ran when each
    follow-up was stored, and scoring reads its verdict."""
    import looprl.feedback.sentiment as sentiment

    sid = add(store)
    store.add_event(sid, "follow_up", {"text": "still failing " * 1000})

    def boom(text: str) -> str:
        raise AssertionError("classified again while scoring")

    monkeypatch.setattr(sentiment, "follow_up_sentiment", boom)
    monkeypatch.setattr(sentiment, "is_dissatisfied", boom)
    for fn in SIGNALS.values():
        assert fn(store.session(sid), store.events(sid)).components["follow_up"] == -0.5
