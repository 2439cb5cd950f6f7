"""The follow-up classifier: is a user's next message a complaint about the agent's last run?

    follow_up_sentiment("that didn't work, still failing")   # 'dissatisfied'

Three classifiers, in ``CLASSIFIERS``; ``follow_up_sentiment`` is the one named by ``SHIPPED``:

- ``rules``: a transparent rule set, the baseline. It looks for complaint phrases (``DISSATISFIED``:
  "that's wrong", "didn't work", "revert", "still failing", ...) and thanks / works-now phrases
  (``SATISFIED``); when a message has both, the one that comes last wins ("thanks, the undo works
  now" is satisfied).
- ``learned``: logistic regression over the words, word pairs and 3-5 character pieces of the
  message (``features``; the character pieces carry typos such as "stil broken"), trained on the
  train split of ``data/follow_ups.jsonl`` by ``scripts/train_sentiment.py``. Its weights are
  ``data/sentiment_weights.json``, read on first use; scoring is a sum in pure Python (no numpy).
  It decides only *dissatisfied or not*; whether the rest is satisfied or neutral comes from the
  ``SATISFIED`` phrases.
- ``learned_or_rules``: dissatisfied when either of the two says so.

Measured on the test split of ``data/follow_ups.jsonl`` (162 follow-ups, 82 of them complaints,
written apart from the train split; see ``data/README.md``), "dissatisfied" as the positive class:

    rules              precision 0.50  recall 0.05  F1 0.09
    learned            precision 0.77  recall 0.84  F1 0.80   <- SHIPPED
    learned_or_rules   precision 0.76  recall 0.84  F1 0.80   (0.798: the rules add false alarms)

Reproduce with ``nice .venv/bin/python benchmarks/sentiment.py``; after changing the data or the
features, retrain with ``nice .venv/bin/python scripts/train_sentiment.py``. These figures are for
that set, written for this project rather than sampled from real users; they say how the
classifiers rank, not how they will do on a given product's traffic. The rules score higher on the
train split (F1 0.35), which holds more of their phrases; the learned classifier's
5-fold cross-validated F1 there is 0.85. Its misses are listed by ``benchmarks/sentiment.py
--errors``: terse reports with no complaint word ("2 failed, 48 passed", "this is a regression")
and praise or requests it has not seen ("approving the PR", "sort imports").

The store classifies a follow-up once, when it is recorded (``Event.sentiment``), so scoring a
session never re-reads its texts: its cost does not grow with what users type. A changed
classifier applies to follow-ups recorded after the change.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA_DIR = Path(__file__).with_name("data")
FOLLOW_UPS = DATA_DIR / "follow_ups.jsonl"
"""The labelled follow-ups: one JSON object a line, ``text``, ``label``, ``split``."""
WEIGHTS = DATA_DIR / "sentiment_weights.json"
"""The learned classifier's weights, written by ``scripts/train_sentiment.py``."""
LABELS = ("dissatisfied", "satisfied", "neutral")

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
_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+|[^\w\s]")
CHAR_NGRAMS = (3, 4, 5)
"""Lengths of the character pieces in ``features`` (the training script checks the weights file
was built with the same)."""


def _normalize(text: str) -> str:
    return " ".join(text.lower().replace("\u2019", "'").split())


def _last_match(patterns: list[re.Pattern[str]], text: str) -> int:
    return max((m.start() for p in patterns for m in p.finditer(text)), default=-1)


def rule_sentiment(text: str) -> str:
    """The rule set alone: ``dissatisfied`` | ``satisfied`` | ``neutral``.

    >>> rule_sentiment("thanks but it still fails")
    'dissatisfied'
    >>> rule_sentiment("hmm, the tests are red again")  # no listed phrase: the rules miss it
    'neutral'
    """
    t = _normalize(text)
    bad, good = _last_match(_DISSATISFIED, t), _last_match(_SATISFIED, t)
    if bad < 0 and good < 0:
        return "neutral"
    return "dissatisfied" if bad > good else "satisfied"


def features(text: str) -> set[str]:
    """The learned classifier's inputs: words (``w:``), adjacent word pairs (``b:``) and
    character pieces (``c:``) of the normalized text, each present or not.

    >>> sorted(f for f in features("No!") if not f.startswith("c:"))
    ['b:no !', 'w:!', 'w:no']
    """
    t = _normalize(text)
    words = _TOKEN.findall(t)
    out = {f"w:{w}" for w in words} | {f"b:{a} {b}" for a, b in zip(words, words[1:], strict=False)}
    padded = f" {t} "
    out.update(f"c:{padded[i:i + n]}" for n in CHAR_NGRAMS for i in range(len(padded) - n + 1))
    return out


@cache
def _weights() -> tuple[float, dict[str, float]]:
    try:
        blob = json.loads(WEIGHTS.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{WEIGHTS} is missing; build it with "
                                "`.venv/bin/python scripts/train_sentiment.py`") from None
    assert tuple(blob["char_ngrams"]) == CHAR_NGRAMS, (
        f"{WEIGHTS.name} was built for char n-grams {blob['char_ngrams']}, features() makes "
        f"{CHAR_NGRAMS}: rerun scripts/train_sentiment.py")
    return float(blob["bias"]), blob["weights"]


def dissatisfied_logit(text: str) -> float:
    """The learned classifier's log-odds that ``text`` is a complaint (> 0: dissatisfied).

    Features are scaled to unit length, as in training, so a long pasted traceback weighs no more
    than a short message.
    """
    bias, weights = _weights()
    known = [weights[f] for f in features(text) if f in weights]
    return bias + (math.fsum(known) / math.sqrt(len(known)) if known else 0.0)


def learned_sentiment(text: str) -> str:
    """The learned classifier decides *dissatisfied*; the ``SATISFIED`` phrases split the rest.

    >>> learned_sentiment("hmm, the tests are red again")
    'dissatisfied'
    """
    if dissatisfied_logit(text) > 0:
        return "dissatisfied"
    return "satisfied" if _last_match(_SATISFIED, _normalize(text)) >= 0 else "neutral"


def learned_or_rules_sentiment(text: str) -> str:
    """Dissatisfied when the rules or the learned classifier say so."""
    by_rules = rule_sentiment(text)
    return by_rules if by_rules == "dissatisfied" else learned_sentiment(text)


CLASSIFIERS: dict[str, Callable[[str], str]] = {
    "rules": rule_sentiment,
    "learned": learned_sentiment,
    "learned_or_rules": learned_or_rules_sentiment,
}
SHIPPED = "learned"
"""The classifier ``follow_up_sentiment`` uses: the best F1 on the test split
(``benchmarks/sentiment.py``; ``tests/feedback/test_sentiment.py`` checks it stays the best)."""


def follow_up_sentiment(text: str) -> str:
    """``dissatisfied`` | ``satisfied`` | ``neutral`` for one follow-up message.

    >>> follow_up_sentiment("That's wrong, the test is still failing")
    'dissatisfied'
    >>> follow_up_sentiment("thanks, works now")
    'satisfied'
    >>> follow_up_sentiment("now also add a docstring")
    'neutral'
    """
    return CLASSIFIERS[SHIPPED](text)


def is_dissatisfied(text: str) -> bool:
    """True when the follow-up message complains about the agent's last run."""
    return follow_up_sentiment(text) == "dissatisfied"


def load_follow_ups(split: str | None = None) -> list[dict[str, str]]:
    """The labelled follow-ups (``split``: "train", "test" or None for both)."""
    rows = [json.loads(line) for line in FOLLOW_UPS.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return [r for r in rows if split is None or r["split"] == split]


def fingerprint(rows: list[dict[str, str]]) -> str:
    """A digest of the texts and labels: the weights file records its train split's, so a test
    notices weights that were not rebuilt after the data changed."""
    return hashlib.sha256(json.dumps([[r["text"], r["label"]] for r in rows]).encode()).hexdigest()


@dataclass(frozen=True)
class Scores:
    """How well a classifier finds *dissatisfied* follow-ups in a labelled set."""

    precision: float
    recall: float
    f1: float
    n: int
    """Messages scored."""
    positives: int
    """Messages labelled dissatisfied."""


def score(classify: Callable[[str], str], rows: list[dict[str, str]]) -> Scores:
    """Precision, recall and F1 of ``classify(text) == "dissatisfied"`` against the labels.

    >>> score(rule_sentiment, [{"text": "that's wrong", "label": "dissatisfied"},
    ...                        {"text": "red again", "label": "dissatisfied"}]).recall
    0.5
    """
    said = [classify(r["text"]) == "dissatisfied" for r in rows]
    truth = [r["label"] == "dissatisfied" for r in rows]
    tp = sum(s and t for s, t in zip(said, truth, strict=True))
    p, r = tp / max(1, sum(said)), tp / max(1, sum(truth))
    return Scores(p, r, 2 * p * r / (p + r) if p + r else 0.0, len(rows), sum(truth))
