"""FeedbackStore over a real SQLite file: round trips, validation, append-only events, threads."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from looprl.errors import ConfigError
from looprl.feedback.store import (
    MAX_TEXT_CHARS,
    SCHEMA_VERSION,
    EventConflictError,
    FailedSessionError,
    FeedbackStore,
    FeedbackTooLargeError,
    UnknownSessionError,
)
from looprl.types import StopReason

from .conftest import add, make_traj


def test_session_round_trip_survives_reopen(tmp_path):
    s = FeedbackStore(tmp_path / "fb.db")
    sid = add(s, user="alice", arm="B", version=3, latency_s=2.5)
    s.add_event(sid, "kept")
    s.close()
    s2 = FeedbackStore(tmp_path / "fb.db")
    rec = s2.session(sid)
    assert (rec.user, rec.arm, rec.policy_version, rec.latency_s) == ("alice", "B", 3, 2.5)
    assert rec.files == ("pkg/a.py", "pkg/b.py")
    assert rec.trajectory == make_traj()  # token-exact: it is training data
    assert [e.kind for e in s2.events(sid)] == ["kept"]
    assert sqlite3.connect(tmp_path / "fb.db").execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path):
    db = sqlite3.connect(tmp_path / "fb.db")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(ConfigError, match="upgrade looprl"):
        FeedbackStore(tmp_path / "fb.db")


def test_not_a_database_is_a_clear_error(tmp_path):
    (tmp_path / "x.db").write_text("this is not sqlite" * 100)
    with pytest.raises(ConfigError, match="cannot open feedback store"):
        FeedbackStore(tmp_path / "x.db")


def test_events_are_appended_never_overwritten(store):
    sid = add(store)
    store.add_event(sid, "kept")
    store.add_event(sid, "follow_up", {"text": "that's wrong"})
    store.add_event(sid, "reverted", {"files": ["pkg/b.py"]})
    evs = store.events(sid)
    assert [e.kind for e in evs] == ["kept", "follow_up", "reverted"]
    assert evs[1].payload == {"text": "that's wrong"} and evs[2].payload == {"files": ["pkg/b.py"]}
    assert evs[0].id < evs[1].id < evs[2].id


@pytest.mark.parametrize("kind, payload, match", [
    ("liked", {}, r"unknown feedback kind 'liked'; use one of \['kept', 'reverted'"),
    ("follow_up", {}, "needs 'text'"),
    ("follow_up", {"text": "   "}, "needs 'text'"),
    ("partially_kept", {}, r"needs 'files': the kept subset of \['pkg/a.py', 'pkg/b.py'\]"),
    ("kept", {"files": ["nope.py"]}, r"not among the session's edited files"),
    ("kept", {"files": "pkg/a.py"}, "must be a list"),
    ("kept", {"text": "hi"}, r"unexpected field\(s\) \['text'\]"),
])
def test_bad_feedback_says_what_is_valid(store, kind, payload, match):
    sid = add(store)
    with pytest.raises(ConfigError, match=match):
        store.add_event(sid, kind, payload)
    assert store.events(sid) == []


def test_unknown_session(store):
    with pytest.raises(UnknownSessionError, match="unknown session 'nope'"):
        store.add_event("nope", "kept")


def test_edit_feedback_needs_edits(store):
    sid = add(store, diff="")
    with pytest.raises(ConfigError, match="changed none"):
        store.add_event(sid, "kept")
    store.add_event(sid, "follow_up", {"text": "you did nothing"})  # still accepted


def test_infra_failed_session_takes_no_feedback(store):
    sid = add(store, stop=StopReason.INFRA_ERROR)
    with pytest.raises(FailedSessionError, match="infrastructure"):
        store.add_event(sid, "kept")


def test_filters_and_cycle_bookkeeping(store):
    a = add(store, version=0)
    b = add(store, version=1)
    c = add(store, version=1, arm="B")
    assert [s.id for s in store.sessions(policy_version=1)] == [b, c]
    assert [s.id for s in store.sessions(arm="B")] == [c]
    cid = store.add_cycle(policy_version=1, candidate_version=2, status="candidate", reason="r",
                          metrics={"sessions": 1}, trained={b: 0.5})
    assert [s.id for s in store.sessions(policy_version=1, untrained=True)] == [c]
    assert [s.id for s in store.sessions(untrained=True)] == [a, c]
    (rec,) = store.cycles()
    assert (rec.id, rec.status, rec.session_ids, rec.metrics) == (cid, "candidate", (b,), {"sessions": 1})


def test_concurrent_writers_lose_nothing(store):
    sids = [add(store, user=f"u{i}") for i in range(4)]

    def work(sid: str) -> None:
        for i in range(25):
            store.add_event(sid, "follow_up", {"text": f"msg {i}"})

    threads = [threading.Thread(target=work, args=(s,)) for s in sids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sid in sids:
        assert [e.payload["text"] for e in store.events(sid)] == [f"msg {i}" for i in range(25)]


def test_a_replayed_event_is_stored_once_and_counted(store):
    sid = add(store)
    first = store.add_event(sid, "kept", event_id="e-1")
    again = [store.add_event(sid, "kept", event_id="e-1") for _ in range(3)]
    assert not first.duplicate and all(r.duplicate for r in again)
    assert [r.event.id for r in again] == [first.event.id] * 3
    (ev,) = store.events(sid)
    assert (ev.client_id, ev.replays) == ("e-1", 3)
    assert store.stats() == {"sessions": 1, "events": 1, "replays_ignored": 3}
    other = add(store)  # ids are per session: another session may use the same one
    assert not store.add_event(other, "kept", event_id="e-1").duplicate


def test_an_event_id_reused_for_another_event_is_refused(store):
    sid = add(store)
    store.add_event(sid, "kept", event_id="e-1", at=time.time() - 5)
    with pytest.raises(EventConflictError, match="already used"):
        store.add_event(sid, "reverted", event_id="e-1")
    with pytest.raises(EventConflictError, match="already used"):
        store.add_event(sid, "kept", event_id="e-1", at=time.time())
    assert [e.kind for e in store.events(sid)] == ["kept"]


@pytest.mark.parametrize("kwargs, match", [
    ({"event_id": ""}, "must be 1-128 characters"),
    ({"event_id": "a b"}, "must be 1-128 characters"),
    ({"event_id": "x" * 129}, "must be 1-128 characters"),
    ({"at": float("nan")}, "unix timestamp"),
    ({"at": float("inf")}, "unix timestamp"),
    ({"at": 1.0}, "not between the session's start"),
    ({"at": 1e12}, "not between the session's start"),
])
def test_bad_event_ids_and_times(store, kwargs, match):
    sid = add(store)
    with pytest.raises(ConfigError, match=match):
        store.add_event(sid, "kept", **kwargs)
    assert store.events(sid) == []


def test_events_are_ordered_by_when_the_user_acted(store):
    sid = add(store)
    t = store.session(sid).created_at
    store.add_event(sid, "reverted", event_id="late", at=t + 20)  # arrives first
    store.add_event(sid, "kept", event_id="early", at=t + 10)
    store.add_event(sid, "follow_up", {"text": "ok"}, event_id="same-time", at=t + 10)
    assert [e.client_id for e in store.events(sid)] == ["early", "same-time", "late"]


def test_text_limits_and_invalid_unicode_store_nothing(store):
    sid = add(store)
    with pytest.raises(FeedbackTooLargeError, match="over the limit of 20000"):
        store.add_event(sid, "follow_up", {"text": "x" * (MAX_TEXT_CHARS + 1)})
    with pytest.raises(ConfigError, match="invalid Unicode"):
        store.add_event(sid, "follow_up", {"text": "still failing \ud800"})
    assert store.events(sid) == []
    store.add_event(sid, "follow_up", {"text": "x" * MAX_TEXT_CHARS})  # the limit itself is fine


def test_a_session_holds_a_bounded_number_of_events(store, monkeypatch):
    import looprl.feedback.store as mod

    monkeypatch.setattr(mod, "MAX_EVENTS_PER_SESSION", 3)
    sid = add(store)
    for i in range(3):
        store.add_event(sid, "follow_up", {"text": f"m{i}"})
    with pytest.raises(FeedbackTooLargeError, match="already has 3 feedback events"):
        store.add_event(sid, "kept")
    assert store.add_event(sid, "follow_up", {"text": "m0"}, event_id=store.events(sid)[0]
                           .client_id).duplicate  # a replay still answers


def test_follow_ups_are_classified_once_when_stored(store):
    sid = add(store)
    ev = store.add_event(sid, "follow_up", {"text": "that didn't work"}).event
    assert ev.sentiment == "dissatisfied" and store.events(sid)[0].sentiment == "dissatisfied"
    assert store.add_event(sid, "kept").event.sentiment == ""


V1_SCHEMA = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, user TEXT NOT NULL, arm TEXT NOT NULL, policy_version INTEGER NOT NULL,
    prompt TEXT NOT NULL, repo TEXT NOT NULL, trajectory TEXT, diff TEXT NOT NULL,
    files TEXT NOT NULL, stop_reason TEXT NOT NULL, created_at REAL NOT NULL,
    latency_s REAL NOT NULL, experiment TEXT NOT NULL DEFAULT '');
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
    kind TEXT NOT NULL, payload TEXT NOT NULL, created_at REAL NOT NULL);
CREATE INDEX events_session ON events(session_id, id);
PRAGMA user_version=1;
"""


def test_a_v1_store_is_migrated_in_place(tmp_path):
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute("INSERT INTO sessions VALUES ('s1','u','A',0,'p','/r',NULL,'',"
               "'[\"pkg/a.py\"]','finished',100.0,1.0,'')")
    db.executemany("INSERT INTO events (session_id, kind, payload, created_at) VALUES (?,?,?,?)", [
        ("s1", "reverted", '{"at": 300.0}', 150.0),
        ("s1", "kept", "{}", 200.0),
        ("s1", "follow_up", '{"text": "still failing"}', 250.0)])
    db.commit()
    db.close()
    s = FeedbackStore(path)
    evs = s.events("s1")
    assert [(e.kind, e.at) for e in evs] == [("kept", 200.0), ("follow_up", 250.0),
                                             ("reverted", 300.0)]
    assert evs[2].payload == {} and evs[1].sentiment == "dissatisfied"
    assert len({e.client_id for e in evs}) == 3
    s.add_event("s1", "kept", event_id="new", at=400.0)  # the migrated store takes new events
    s.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
