"""Feedback -> reward: named signal functions in a dict, and a baseline dissatisfaction classifier.

    rb = session_reward(session, store.events(session.id), "edit_outcome")   # or None: no signal

A signal function maps one session and its events (oldest first) to a ``RewardBreakdown``, or
``None`` when the session says nothing yet (no events) or must never be scored (an infrastructure
failure). ``edit_outcome``:

- the LAST edit event decides the outcome (a keep later reverted counts as reverted):
  kept +1, reverted -1, partially_kept ``2 * share - 1`` with ``share`` = kept files / edited
  files (a linear path from reverted to kept); a ``kept``/``reverted`` naming only some files is
  treated the same way by share;
- every dissatisfied follow-up costs 0.5 (at most one penalty per session: the user's second
  complaint about the same run is not new information); a satisfied or neutral follow-up is 0.

``edit_outcome_latency`` adds ``-0.1 * min(1, latency_s / 120)``: users wait for the agent, and a
slow run is worth a little less. Add a variant by writing a function and one registry line.

The dissatisfaction classifier is a transparent rule set (``DISSATISFIED``) — a baseline to beat
with a learned classifier, not a claim of accuracy. It looks for complaint phrases ("that's wrong",
"didn't work", "revert", "undo", "still failing", ...) and for thanks / works-now phrases; when a
message has both, the one that comes last wins ("thanks, the undo works now" is satisfied).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from looprl.errors import ConfigError
from looprl.feedback.store import EDIT_KINDS, Event, SessionRecord
from looprl.types import RewardBreakdown

DISSATISFIED: tuple[str, ...] = (
    r"\bthat'?s (?:wrong|incorrect|broken|not (?:it|right|what i (?:asked|wanted)))\b",
    r"\b(?:is|was|it'?s|still) (?:wrong|broken|incorrect)\b",
    r"\b(?:didn'?t|doesn'?t|did not|does not|won'?t|still doesn'?t) (?:work|help|fix|compile|run|pass)\b",
    r"\bnot (?:working|fixed|what i (?:asked|wanted|meant))\b",
    r"\bstill (?:failing|fails|broken|crash(?:es|ing)?|the same|erroring|errors|wrong|not)\b",
    r"\b(?:revert|undo|roll ?back|rollback)\b",
    r"\b(?:broke|breaks|you broke)\b",
    r"\bwhy did you\b",
    r"\b(?:no|nope),? (?:that|this|it)\b",
    r"\b(?:wrong|incorrect) (?:file|fix|function|answer|change)\b",
    r"\b(?:useless|garbage|makes no sense)\b",
)
"""Complaint phrases (lower-cased text, regex). Each is a rule a reader can check by eye."""

SATISFIED: tuple[str, ...] = (
    r"\b(?:thanks|thank you|thx|perfect|great|nice|lgtm|looks good)\b",
    r"\b(?:works|working|passes|passing|fixed) now\b",
    r"\bthat (?:works|worked|did it|fixed it)\b",
)
"""Thanks / works-now phrases: a message with one of these and no complaint is satisfied; one with
both is judged by which comes last ("undo broke it... ok fixed now, thanks" is satisfied)."""

_DISSATISFIED = [re.compile(p) for p in DISSATISFIED]
_SATISFIED = [re.compile(p) for p in SATISFIED]


def _last_match(patterns: list[re.Pattern[str]], text: str) -> int:
    return max((m.start() for p in patterns for m in p.finditer(text)), default=-1)


def follow_up_sentiment(text: str) -> str:
    """``dissatisfied`` | ``satisfied`` | ``neutral`` for one follow-up message.

    >>> follow_up_sentiment("That's wrong, the test is still failing")
    'dissatisfied'
    >>> follow_up_sentiment("thanks, works now")
    'satisfied'
    >>> follow_up_sentiment("now also add a docstring")
    'neutral'
    """
    t = " ".join(text.lower().replace("\u2019", "'").split())
    bad, good = _last_match(_DISSATISFIED, t), _last_match(_SATISFIED, t)
    if bad < 0 and good < 0:
        return "neutral"
    return "dissatisfied" if bad > good else "satisfied"


def is_dissatisfied(text: str) -> bool:
    """True when the follow-up message complains about the agent's last run."""
    return follow_up_sentiment(text) == "dissatisfied"


def edit_share(event: Event, files: Sequence[str]) -> float:
    """Share of the session's edited files this edit event keeps (kept 1, reverted 0, by files)."""
    named = event.payload.get("files")
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
    edits = [e for e in events if e.kind in EDIT_KINDS]
    follow = [e for e in events if e.kind == "follow_up"]
    if not edits and not follow:
        return None
    terms: dict[str, float] = {}
    if edits:
        terms["edit"] = 2.0 * edit_share(edits[-1], session.files) - 1.0
    if follow:
        bad = any(is_dissatisfied(e.payload["text"]) for e in follow)
        terms["follow_up"] = -0.5 if bad else 0.0
    return terms


def edit_outcome(session: SessionRecord, events: Sequence[Event]) -> RewardBreakdown | None:
    """Kept +1, reverted -1, partially kept 2*share-1; a dissatisfied follow-up -0.5."""
    terms = outcome_terms(session, events)
    return None if terms is None else RewardBreakdown.of(terms, details=_details(session, events))


def edit_outcome_latency(session: SessionRecord, events: Sequence[Event]) -> RewardBreakdown | None:
    """``edit_outcome`` plus ``-0.1 * min(1, latency_s / 120)``."""
    terms = outcome_terms(session, events)
    if terms is None:
        return None
    terms["latency"] = -0.1 * min(1.0, max(0.0, session.latency_s) / 120.0)
    return RewardBreakdown.of(terms, details=_details(session, events))


def _details(session: SessionRecord, events: Sequence[Event]) -> dict[str, str | int | float]:
    return {"session_id": session.id, "events": len(events),
            "last_edit": next((e.kind for e in reversed(events) if e.kind in EDIT_KINDS), ""),
            "latency_s": session.latency_s}


SignalFn = Callable[[SessionRecord, Sequence[Event]], RewardBreakdown | None]

SIGNALS: dict[str, SignalFn] = {
    "edit_outcome": edit_outcome,
    "edit_outcome_latency": edit_outcome_latency,
}


def get_signal(name: str) -> SignalFn:
    if name not in SIGNALS:
        raise ConfigError(f"unknown feedback signal {name!r}; choose one of {sorted(SIGNALS)}")
    return SIGNALS[name]


def session_reward(session: SessionRecord, events: Sequence[Event],
                   signal: str = "edit_outcome") -> RewardBreakdown | None:
    """The named signal's reward for one session (None: not scored)."""
    return get_signal(signal)(session, events)
