"""The follow-up classifier: is a user's next message a complaint about the agent's last run?

    follow_up_sentiment("that didn't work, still failing")   # 'dissatisfied'

A transparent rule set (``DISSATISFIED``) — a baseline to beat with a learned classifier, not a
claim of accuracy. It looks for complaint phrases ("that's wrong", "didn't work", "revert", "undo",
"still failing", ...) and for thanks / works-now phrases; when a message has both, the one that
comes last wins ("thanks, the undo works now" is satisfied).

The store classifies a follow-up once, when it is recorded (``Event.sentiment``), so scoring a
session never re-reads its texts: its cost does not grow with what users type. A changed rule set
applies to follow-ups recorded after the change.
"""

from __future__ import annotations

import re

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
