"""The feedback store: served sessions and what users did with their edits, in one SQLite file.

    store = FeedbackStore("feedback.db")                     # schema created (or checked) on open
    sid = store.add_session(user="u1", arm="A", policy_version=3, prompt="fix mean()",
                            repo="/srv/repos/app", trajectory=traj, latency_s=12.5)
    store.add_event(sid, "partially_kept", {"files": ["src/app/core.py"]}, event_id="e1", at=t)
    store.add_event(sid, "follow_up", {"text": "still failing on empty lists"}, event_id="e2")
    store.session(sid).files, store.events(sid)

Sessions hold the whole ``Trajectory`` (token-exact: it is training data), its diff and the files
it touched. Events are appended, never rewritten or deleted (only their replay count grows): a
user who keeps an edit and reverts it later leaves both events, and the signal functions
(``signals.py``) decide what counts.
Cycles (``cycle.py``) record which sessions they trained on, so a session is trained on once.

Events stay true under retries and reordering:

- idempotent: each carries the client's ``event_id`` (unique per session); the same event sent
  again is not stored again, only counted (``Event.replays``, ``stats()``), and an id reused for
  a different event is refused (``EventConflictError``);
- ordered by ``at``, when the user acted (the client's clock, within ``MAX_CLOCK_SKEW_S`` of the
  session and of now; the arrival time when absent), not by arrival (``signals.in_order``);
- bounded: a follow-up holds at most ``MAX_TEXT_CHARS`` characters and a session at most
  ``MAX_EVENTS_PER_SESSION`` events (``FeedbackTooLargeError``); text that is not valid Unicode is
  refused before anything is written; a follow-up is classified once, when stored
  (``Event.sentiment``), so scoring a session costs the same whatever its texts' length.

One connection guarded by a lock serves every thread (the API's worker threads, a cycle); WAL mode
lets other processes read while one writes. The schema carries a version (``PRAGMA user_version``):
a file written by a newer schema is refused with a message rather than misread.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprl.diffs import changed_files
from looprl.errors import ConfigError
from looprl.feedback.sentiment import follow_up_sentiment
from looprl.harness.hinted import turn_messages
from looprl.types import JSONScalar, StopReason, Trajectory

SCHEMA_VERSION = 2
"""v2: events carry ``at``, the client's ``client_id`` (unique per session), ``sentiment`` and
``replays``; a v1 file is migrated in place when opened."""
MAX_TEXT_CHARS = 20_000
"""A follow-up's text, in characters: a long message with a pasted traceback fits."""
MAX_EVENTS_PER_SESSION = 1_000
"""Feedback events one session may hold (a user acts on one run a handful of times)."""
MAX_CLOCK_SKEW_S = 300.0
"""How far a client's ``at`` may lie before the session began or after the server's now."""
_EVENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
EVENT_KINDS = ("kept", "reverted", "partially_kept", "follow_up")
"""kept / reverted: the user kept or reverted the session's edits (optionally naming files);
partially_kept: ``files`` lists the kept ones; follow_up: the user's next message (``text``),
optionally naming the agent reply it answers (``turn``: 1-based, in assistant turns; default
the last)."""
EDIT_KINDS = ("kept", "reverted", "partially_kept")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, user TEXT NOT NULL, arm TEXT NOT NULL, policy_version INTEGER NOT NULL,
    prompt TEXT NOT NULL, repo TEXT NOT NULL, trajectory TEXT, diff TEXT NOT NULL,
    files TEXT NOT NULL, stop_reason TEXT NOT NULL, created_at REAL NOT NULL,
    latency_s REAL NOT NULL, experiment TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS sessions_version ON sessions(policy_version, created_at);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
    kind TEXT NOT NULL, payload TEXT NOT NULL, created_at REAL NOT NULL,
    at REAL NOT NULL DEFAULT 0, client_id TEXT NOT NULL DEFAULT '',
    sentiment TEXT NOT NULL DEFAULT '', replays INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS events_session ON events(session_id, id);
CREATE UNIQUE INDEX IF NOT EXISTS events_client ON events(session_id, client_id);
CREATE INDEX IF NOT EXISTS events_order ON events(session_id, at, id);
CREATE TABLE IF NOT EXISTS cycles (
    id INTEGER PRIMARY KEY AUTOINCREMENT, created_at REAL NOT NULL, policy_version INTEGER NOT NULL,
    candidate_version INTEGER, status TEXT NOT NULL, reason TEXT NOT NULL,
    metrics TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cycle_sessions (
    cycle_id INTEGER NOT NULL REFERENCES cycles(id), session_id TEXT NOT NULL REFERENCES sessions(id),
    reward REAL NOT NULL, PRIMARY KEY (cycle_id, session_id));
CREATE INDEX IF NOT EXISTS cycle_sessions_session ON cycle_sessions(session_id);
"""


class UnknownSessionError(ConfigError):
    """No session has this id (a feedback request for a session the store never saw)."""


class FailedSessionError(ConfigError):
    """Feedback on a session that failed for infrastructure reasons (never scored)."""


class FeedbackTooLargeError(ConfigError):
    """A follow-up's text, or a session's number of events, is over its limit."""


class EventConflictError(ConfigError):
    """An ``event_id`` already used on this session for a different event."""


@dataclass(frozen=True)
class SessionRecord:
    """One served agent run. ``trajectory`` is None only if the caller stored none."""

    id: str
    user: str
    arm: str
    policy_version: int
    prompt: str
    repo: str
    diff: str
    files: tuple[str, ...]
    """Workspace-relative files the diff changes (the unit of kept / reverted)."""
    stop_reason: str
    created_at: float
    latency_s: float
    trajectory: Trajectory | None = None
    experiment: str = ""
    """The A/B experiment the arm was assigned in (``serve.api.ServeConfig.experiment``)."""

    @property
    def is_infra_error(self) -> bool:
        return self.stop_reason == StopReason.INFRA_ERROR.value

    @property
    def request(self) -> str:
        """What the session asked for (``request_key``): sessions of one request form a group."""
        return request_key(self.repo, self.prompt)


def request_key(repo: str, prompt: str) -> str:
    """A request: the same repo and prompt is the same request."""
    return f"{repo}\0{prompt}"


@dataclass(frozen=True)
class Event:
    """One thing a user did with a session's edits; ``payload`` is already validated."""

    id: int
    """Arrival order in this store."""
    session_id: str
    kind: str
    payload: dict[str, Any]
    created_at: float
    """When it arrived (server clock)."""
    at: float = 0.0
    """When the user did it (the client's clock; the arrival time if it gave none): the order
    that counts (``signals.in_order``)."""
    client_id: str = ""
    """The client's event id: the same id sent again is a replay, not a new event."""
    sentiment: str = ""
    """A follow-up's ``sentiment.follow_up_sentiment``, decided when stored ("" otherwise)."""
    replays: int = 0
    """Times the same event arrived again (ignored, counted)."""


@dataclass(frozen=True)
class Recorded:
    """What ``add_event`` did: stored ``event``, or found it stored already (``duplicate``)."""

    event: Event
    duplicate: bool


@dataclass(frozen=True)
class CycleRecord:
    id: int
    created_at: float
    policy_version: int
    candidate_version: int | None
    status: str
    reason: str
    metrics: dict[str, JSONScalar] = field(default_factory=dict)
    session_ids: tuple[str, ...] = ()


def validate_payload(kind: str, payload: dict[str, Any], files: tuple[str, ...],
                     turns: int | None = None) -> dict[str, Any]:
    """The payload of a ``kind`` event on a session that changed ``files`` in ``turns`` agent
    replies (None: not known, a ``turn`` is not accepted), checked and normalised.

    Raises ``ConfigError`` saying what is valid.
    """
    if kind not in EVENT_KINDS:
        raise ConfigError(f"unknown feedback kind {kind!r}; use one of {list(EVENT_KINDS)}")
    if not isinstance(payload, dict):
        raise ConfigError(f"feedback payload must be a JSON object, got {type(payload).__name__}")
    allowed = {"files", "text", "turn"} if kind == "follow_up" else {"files"}
    extra = sorted(set(payload) - allowed)
    if extra:
        raise ConfigError(f"unexpected field(s) {extra} for {kind!r} feedback; "
                          f"allowed: {sorted(allowed)}")
    out: dict[str, Any] = {}
    if kind == "follow_up":
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ConfigError("follow_up feedback needs 'text': the user's next message")
        if len(text) > MAX_TEXT_CHARS:
            raise FeedbackTooLargeError(f"'text' has {len(text)} characters, over the limit of "
                                        f"{MAX_TEXT_CHARS}; send the message's first part")
        if not _is_unicode(text):
            raise ConfigError("'text' holds invalid Unicode (a lone surrogate); send UTF-8 text")
        out["text"] = text
        if payload.get("turn") is not None:
            out["turn"] = _check_turn(payload["turn"], turns)
    elif not files:
        raise ConfigError(f"{kind!r} feedback needs a session that edited files; this session "
                          "changed none (send a 'follow_up' with the user's message instead)")
    if "files" in payload and payload["files"] is not None:
        named = payload["files"]
        if not isinstance(named, list) or not all(isinstance(f, str) for f in named):
            raise ConfigError("'files' must be a list of workspace-relative paths")
        unknown = sorted(set(named) - set(files))
        if unknown:
            raise ConfigError(f"file(s) {unknown} are not among the session's edited files "
                              f"{list(files)}")
        out["files"] = sorted(set(named))
    if kind == "partially_kept" and not out.get("files"):
        raise ConfigError(f"partially_kept feedback needs 'files': the kept subset of {list(files)}")
    return out


def _check_turn(turn: Any, turns: int | None) -> int:
    """A follow-up's ``turn`` if the session has that agent reply."""
    if isinstance(turn, bool) or not isinstance(turn, int) or not 1 <= turn <= (turns or 0):
        raise ConfigError(f"'turn' {turn!r} must name one of the session's {turns or 0} agent "
                          "replies (1-based; leave it out for the last)")
    return turn


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_event_id(event_id: str) -> str:
    """``event_id`` if it is a valid client event id, else ``ConfigError`` saying what is."""
    if not isinstance(event_id, str) or not _EVENT_ID.fullmatch(event_id):
        raise ConfigError(f"'event_id' {event_id!r} must be 1-128 characters of letters, digits and "
                          "'._:-' (e.g. a uuid4 made when the user acted; resend the same id on "
                          "retry)")
    return event_id


def check_at(at: float, session_start: float, now: float) -> float:
    """``at`` if it is a plausible time for feedback on a session that began at ``session_start``.

    >>> check_at(1000.0, 990.0, 2000.0)
    1000.0
    """
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise ConfigError(f"'at' must be a unix timestamp in seconds, got {at!r}")
    lo, hi = session_start - MAX_CLOCK_SKEW_S, now + MAX_CLOCK_SKEW_S
    if not lo <= at <= hi:
        raise ConfigError(f"'at' {at} is not between the session's start ({session_start:.0f}) and "
                          f"now ({now:.0f}), give or take {MAX_CLOCK_SKEW_S:g} s; send the unix time "
                          "when the user acted")
    return float(at)


class FeedbackStore:
    """Sessions, feedback events and cycle records in one SQLite file (see module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise ConfigError(f"cannot open feedback store {self.path}: {e}; pass a new file "
                              "path or a store written by looprl") from None

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ConfigError(f"feedback store {self.path} has schema v{version}, newer than this "
                              f"looprl's v{SCHEMA_VERSION}; upgrade looprl to read it")
        with self._lock:  # one transaction: a crash mid-migration leaves the v1 file as it was
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if version == 1:
                    self._v1_to_v2()
                for stmt in _SCHEMA.split(";"):  # idempotent (IF NOT EXISTS)
                    if stmt.strip():
                        self._db.execute(stmt)
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _v1_to_v2(self) -> None:
        """v1 kept an optional ``at`` in the payload and no client id: ``at`` moves to its column
        (the arrival time where absent), each old event gets a unique id, follow-ups are
        classified."""
        db = self._db
        for col in ("at REAL NOT NULL DEFAULT 0", "client_id TEXT NOT NULL DEFAULT ''",
                    "sentiment TEXT NOT NULL DEFAULT ''", "replays INTEGER NOT NULL DEFAULT 0"):
            db.execute(f"ALTER TABLE events ADD COLUMN {col}")
        db.execute("UPDATE events SET at = COALESCE(json_extract(payload, '$.at'), created_at), "
                   "client_id = 'v1-' || id, payload = json_remove(payload, '$.at')")
        rows = db.execute("SELECT id, json_extract(payload, '$.text') FROM events "
                          "WHERE kind = 'follow_up'").fetchall()
        db.executemany("UPDATE events SET sentiment = ? WHERE id = ?",
                       [(follow_up_sentiment(text or ""), eid) for eid, text in rows])

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- sessions ----------------------------------------------------------------------------
    def add_session(self, *, user: str, arm: str, policy_version: int, prompt: str, repo: str,
                    trajectory: Trajectory | None, latency_s: float, diff: str | None = None,
                    session_id: str | None = None, created_at: float | None = None,
                    experiment: str = "") -> str:
        """Store one served run and return its id (a new uuid unless ``session_id`` is given)."""
        sid = session_id or uuid.uuid4().hex
        diff = diff if diff is not None else (trajectory.diff if trajectory else "")
        stop = trajectory.stop_reason.value if trajectory else StopReason.INFRA_ERROR.value
        with self._tx() as db:
            db.execute("INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", (
                sid, user, arm, int(policy_version), prompt, repo,
                trajectory.to_json() if trajectory else None, diff, json.dumps(changed_files(diff)),
                stop, created_at if created_at is not None else time.time(), float(latency_s),
                experiment))
        return sid

    def session(self, session_id: str, *, with_trajectory: bool = True) -> SessionRecord:
        cols = "*" if with_trajectory else _COLS_NO_TRAJ
        rows = self._query(f"SELECT {cols} FROM sessions WHERE id=?", (session_id,))
        if not rows:
            raise UnknownSessionError(f"unknown session {session_id!r}; use the session_id that "
                                      "POST /v1/sessions returned")
        return _session(rows[0])

    def sessions(self, *, policy_version: int | None = None, arm: str | None = None,
                 experiment: str | None = None, untrained: bool = False,
                 with_trajectory: bool = False) -> list[SessionRecord]:
        """Sessions in creation order, filtered by version / arm / experiment; ``untrained``: not
        yet used by a cycle."""
        where: list[str] = []
        args: list[str | int] = []
        if experiment is not None:
            where.append("experiment=?")
            args.append(experiment)
        if policy_version is not None:
            where.append("policy_version=?")
            args.append(policy_version)
        if arm is not None:
            where.append("arm=?")
            args.append(arm)
        if untrained:
            where.append("id NOT IN (SELECT session_id FROM cycle_sessions)")
        cols = "*" if with_trajectory else _COLS_NO_TRAJ
        sql = f"SELECT {cols} FROM sessions" + (" WHERE " + " AND ".join(where) if where else "")
        return [_session(r) for r in self._query(sql + " ORDER BY created_at, rowid", tuple(args))]

    # -- events ------------------------------------------------------------------------------
    def add_event(self, session_id: str, kind: str, payload: dict[str, Any] | None = None, *,
                  event_id: str | None = None, at: float | None = None) -> Recorded:
        """Record one feedback event (validated against the session's edited files), once.

        ``event_id``: the client's id for it (default: a new one, for callers that never retry);
        the same id with the same content again is a replay: counted, not stored. ``at``: when the
        user acted (default: now)."""
        named_turn = kind == "follow_up" and (payload or {}).get("turn") is not None
        s = self.session(session_id, with_trajectory=named_turn)
        if s.is_infra_error:
            raise FailedSessionError(f"session {session_id} failed for infrastructure reasons and is never "
                              "scored; its feedback is not recorded")
        turns = len(turn_messages(s.trajectory.messages)) if s.trajectory is not None else None
        clean = validate_payload(kind, payload or {}, s.files, turns)
        cid = check_event_id(event_id) if event_id is not None else uuid.uuid4().hex
        now = time.time()
        when = check_at(at, s.created_at, now) if at is not None else now
        sentiment = follow_up_sentiment(clean["text"]) if kind == "follow_up" else ""
        body = json.dumps(clean)
        with self._tx() as db:
            old = db.execute(f"SELECT {_EVENT_COLS} FROM events WHERE session_id=? AND client_id=?",
                             (session_id, cid)).fetchone()
            if old is not None:
                prev = _event(old)
                if (prev.kind, prev.payload) != (kind, clean) or (at is not None and prev.at != when):
                    raise EventConflictError(
                        f"event_id {cid!r} was already used on session {session_id} for a different "
                        f"event ({prev.kind} at {prev.at}); make a new id for each user action")
                db.execute("UPDATE events SET replays = replays + 1 WHERE id=?", (prev.id,))
                return Recorded(dataclasses.replace(prev, replays=prev.replays + 1), True)
            (n,) = db.execute("SELECT COUNT(*) FROM events WHERE session_id=?",
                              (session_id,)).fetchone()
            if n >= MAX_EVENTS_PER_SESSION:
                raise FeedbackTooLargeError(f"session {session_id} already has {n} feedback events, "
                                            f"the limit ({MAX_EVENTS_PER_SESSION})")
            cur = db.execute("INSERT INTO events (session_id, kind, payload, created_at, at, "
                             "client_id, sentiment) VALUES (?,?,?,?,?,?,?)",
                             (session_id, kind, body, now, when, cid, sentiment))
            eid = int(cur.lastrowid or 0)
        return Recorded(Event(eid, session_id, kind, clean, now, when, cid, sentiment), False)

    def events(self, session_id: str | None = None) -> list[Event]:
        """Events of one session (or all), in the order the users acted: by ``at``, then arrival."""
        sql = f"SELECT {_EVENT_COLS} FROM events"
        rows = self._query(sql + (" WHERE session_id=?" if session_id else "") + " ORDER BY at, id",
                           (session_id,) if session_id else ())
        return [_event(r) for r in rows]

    def stats(self) -> dict[str, int]:
        """Stored sessions and events, and replays of events that were ignored."""
        (sessions,) = self._query("SELECT COUNT(*) FROM sessions")[0]
        n, replays = self._query("SELECT COUNT(*), COALESCE(SUM(replays), 0) FROM events")[0]
        return {"sessions": int(sessions), "events": int(n), "replays_ignored": int(replays)}

    def events_by_session(self) -> dict[str, list[Event]]:
        out: dict[str, list[Event]] = {}
        for e in self.events():
            out.setdefault(e.session_id, []).append(e)
        return out

    # -- cycles ------------------------------------------------------------------------------
    def add_cycle(self, *, policy_version: int, candidate_version: int | None, status: str,
                  reason: str, metrics: dict[str, JSONScalar],
                  trained: dict[str, float] | None = None) -> int:
        """Record one cycle; ``trained`` (session id -> reward) marks those sessions as used."""
        with self._tx() as db:
            cur = db.execute("INSERT INTO cycles (created_at, policy_version, candidate_version, "
                             "status, reason, metrics) VALUES (?,?,?,?,?,?)",
                             (time.time(), policy_version, candidate_version, status, reason,
                              json.dumps(metrics)))
            cid = int(cur.lastrowid or 0)
            db.executemany("INSERT INTO cycle_sessions VALUES (?,?,?)",
                           [(cid, s, float(r)) for s, r in (trained or {}).items()])
        return cid

    def cycles(self) -> list[CycleRecord]:
        rows = self._query("SELECT id, created_at, policy_version, candidate_version, status, "
                           "reason, metrics FROM cycles ORDER BY id")
        used: dict[int, list[str]] = {}
        for cid, sid in self._query("SELECT cycle_id, session_id FROM cycle_sessions "
                                    "ORDER BY session_id"):
            used.setdefault(int(cid), []).append(sid)
        return [CycleRecord(int(r[0]), float(r[1]), int(r[2]), r[3], r[4], r[5], json.loads(r[6]),
                            tuple(used.get(int(r[0]), ()))) for r in rows]


_EVENT_COLS = "id, session_id, kind, payload, created_at, at, client_id, sentiment, replays"


def _event(r: tuple[Any, ...]) -> Event:
    return Event(int(r[0]), r[1], r[2], json.loads(r[3]), float(r[4]), float(r[5]), r[6], r[7],
                 int(r[8]))


_COLS_NO_TRAJ = ("id, user, arm, policy_version, prompt, repo, NULL, diff, files, stop_reason, "
                 "created_at, latency_s, experiment")


def _session(r: tuple[Any, ...]) -> SessionRecord:
    traj = Trajectory.from_json(r[6]) if r[6] else None
    return SessionRecord(id=r[0], user=r[1], arm=r[2], policy_version=int(r[3]), prompt=r[4],
                         repo=r[5], diff=r[7], files=tuple(json.loads(r[8])), stop_reason=r[9],
                         created_at=float(r[10]), latency_s=float(r[11]), trajectory=traj,
                         experiment=r[12])
