"""FeedbackStore over a real SQLite file: round trips, validation, append-only events, threads."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from looprl.errors import ConfigError
from looprl.feedback.store import (
    SCHEMA_VERSION,
    FailedSessionError,
    FeedbackStore,
    UnknownSessionError,
    diff_files,
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


def test_diff_files_handles_new_and_deleted_files():
    d = ("--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n"
         "--- a/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
    assert diff_files(d) == ("new.py", "old.py")
    assert diff_files("") == ()


def test_diff_files_is_not_fooled_by_header_like_hunk_lines():
    d = ("--- a/notes.md\n+++ b/notes.md\n@@ -1 +1 @@\n--- a/fake\n+++ b/fake\n"
         "--- a/real.py\n+++ b/real.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert diff_files(d) == ("notes.md", "real.py")
