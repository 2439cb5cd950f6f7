"""Feedback -> reward: named signal functions in a dict.

    rb = session_reward(session, store.events(session.id), "edit_outcome")   # or None: no signal

A signal function maps one session and its events to a ``RewardBreakdown``, or ``None`` when the
session says nothing yet (no events) or must never be scored (an infrastructure failure).

Order: events count in the order the user did them — by ``Event.at`` (when the user acted, as
the client reports it; the arrival time if it does not), ties broken by arrival. A ``reverted``
at t=2000 that reaches the server before a ``kept`` at t=1000 is the final state: -1, however the
network ordered them. Every signal sees its events through ``in_order``.

``edit_outcome``:

- the LAST edit event decides the outcome (a keep later reverted counts as reverted):
  kept +1, reverted -1, partially_kept ``2 * share - 1`` with ``share`` = kept files / edited
  files (a linear path from reverted to kept); a ``kept``/``reverted`` naming only some files is
  treated the same way by share;
- a session whose agent changed nothing and whose user then complained failed the request as
  surely as a reverted edit: its edit term is -1 too. Without this, doing nothing cost only the
  complaint, and a policy learned that abstaining pays wherever it was less than ~40% sure
  (docs/experiments.md, stop 33, R2). Silence after no change stays unscored on the edit: the
  user may not have wanted one;
- a dissatisfied follow-up costs 0.5 (at most one penalty per session: the user's second
  complaint about the same run is not new information), unless the edit term already scored the
  session -1: a complaint after a revert says again that the run failed. Were it counted there,
  failures would differ by whether the user also complained, which says nothing about the run,
  and a failure that drew no complaint would beat its group's baseline and be reinforced
  (docs/experiments.md, stop 34, R2'). A satisfied or neutral follow-up is 0.
  Whether a follow-up is dissatisfied was decided when it was stored (``Event.sentiment``, by
  ``sentiment.follow_up_sentiment``), so a reward costs the same whatever the texts' length.

``edit_outcome_latency`` adds ``-0.1 * min(1, latency_s / 120)``: users wait for the agent, and a
slow run is worth a little less. Add a variant by writing a function and one registry line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from looprl.feedback.store import EDIT_KINDS, Event, SessionRecord
from looprl.plugins import find
from looprl.types import Metadata, RewardBreakdown


def in_order(events: Sequence[Event]) -> list[Event]:
    """Events in the order the user did them: by ``at``, then by arrival (``id``).

    >>> from looprl.feedback.store import Event
    >>> late_first = [Event(1, "s", "reverted", {}, 5.0, at=2000.0), Event(2, "s", "kept", {}, 6.0, at=1000.0)]
    >>> [e.kind for e in in_order(late_first)]
    ['kept', 'reverted']
    """
    return sorted(events, key=lambda e: (e.at, e.id))


def edit_share(event: Event, files: Sequence[str]) -> float:
    """Share of the session's edited files this edit event keeps (kept 1, reverted 0, by files)."""
    named = event.payload.get("files") or []  # partially_kept always names them (store checks)
    if event.kind == "partially_kept":
        return len(named) / len(files) if files else 0.0
    if named:  # kept/reverted of some files: the others are in the opposite state
        part = len(named) / len(files)
        return part if event.kind == "kept" else 1.0 - part
    return 1.0 if event.kind == "kept" else 0.0


def outcome_terms(session: SessionRecord, events: Sequence[Event]) -> dict[str, float] | None:
    """The reward components every signal shares; None when there is no signal or it must not be
    scored (infrastructure failure)."""
    if session.is_infra_error:
        return None
    ordered = in_order(events)
    edits = [e for e in ordered if e.kind in EDIT_KINDS]
    follow = [e for e in ordered if e.kind == "follow_up"]
    if not edits and not follow:
        return None
    complained = any(e.sentiment == "dissatisfied" for e in follow)
    terms: dict[str, float] = {}
    if edits:
        terms["edit"] = 2.0 * edit_share(edits[-1], session.files) - 1.0
    elif complained and not session.files:
        terms["edit"] = -1.0
    if follow:
        failed = terms.get("edit", 0.0) <= -1.0
        terms["follow_up"] = -0.5 if complained and not failed else 0.0
    return terms


def edit_outcome(session: SessionRecord, events: Sequence[Event]) -> RewardBreakdown | None:
    """Kept +1, reverted -1 (so is no change followed by a complaint), partially kept 2*share-1;
    a dissatisfied follow-up -0.5 unless the edit already scored -1."""
    terms = outcome_terms(session, events)
    return None if terms is None else RewardBreakdown.of(terms, details=_details(session, events))


def edit_outcome_latency(session: SessionRecord, events: Sequence[Event]) -> RewardBreakdown | None:
    """``edit_outcome`` plus ``-0.1 * min(1, latency_s / 120)``."""
    terms = outcome_terms(session, events)
    if terms is None:
        return None
    terms["latency"] = -0.1 * min(1.0, max(0.0, session.latency_s) / 120.0)
    return RewardBreakdown.of(terms, details=_details(session, events))


def _details(session: SessionRecord, events: Sequence[Event]) -> Metadata:
    return {"session_id": session.id, "events": len(events),
            "last_edit": next((e.kind for e in reversed(in_order(events)) if e.kind in EDIT_KINDS),
                              ""),
            "latency_s": session.latency_s}


SignalFn = Callable[[SessionRecord, Sequence[Event]], RewardBreakdown | None]

SIGNALS: dict[str, SignalFn] = {
    "edit_outcome": edit_outcome,
    "edit_outcome_latency": edit_outcome_latency,
}


def get_signal(name: str) -> SignalFn:
    """The signal called ``name``: a built-in (``SIGNALS``) or a plugin (``looprl.plugins``)."""
    return find("signals", name, SIGNALS)


def session_reward(session: SessionRecord, events: Sequence[Event],
                   signal: str = "edit_outcome") -> RewardBreakdown | None:
    """The named signal's reward for one session (None: not scored)."""
    return get_signal(signal)(session, events)
