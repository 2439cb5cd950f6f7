"""The follow-up classifier, measured: the shipped one beats the rule set on held-out messages, gets
hard cases right, and its data file and weights are well-formed and current."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from looprl.feedback import sentiment
from looprl.feedback.sentiment import (
    CLASSIFIERS,
    LABELS,
    SHIPPED,
    WEIGHTS,
    follow_up_sentiment,
    is_dissatisfied,
    load_follow_ups,
    rule_sentiment,
    score,
)

F1_FLOOR = 0.77
"""The shipped classifier's test-split F1 was 0.802 (rules: 0.089) when it was built; a drop of
more than 0.03 is a regression."""


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


# ----------------------------------------------------------------------------- measured

def test_shipped_classifier_beats_the_rules_on_the_test_split():
    test = load_follow_ups("test")
    rules, shipped = score(rule_sentiment, test), score(follow_up_sentiment, test)
    assert shipped.f1 >= rules.f1, (shipped, rules)
    assert shipped.f1 >= F1_FLOOR, (
        f"{SHIPPED}: F1 {shipped.f1:.3f} (P {shipped.precision:.3f}, R {shipped.recall:.3f}) "
        f"on the test split, under the floor {F1_FLOOR}; measured when shipped: F1 0.802, "
        "P 0.767, R 0.841 (rules: F1 0.089, P 0.500, R 0.049)")


def test_shipped_is_the_best_classifier_on_the_test_split():
    test = load_follow_ups("test")
    f1 = {name: score(fn, test).f1 for name, fn in CLASSIFIERS.items()}
    assert f1[SHIPPED] == max(f1.values()), f"SHIPPED={SHIPPED!r} but test-split F1s are {f1}"


HARD_DISSATISFIED = [
    "hmm, the tests are failing again",                  # no complaint word at all
    "can you put back the old version",                  # undo, without saying "undo"
    "this isn't what I wanted",
    "thanks, but the empty-list case still crashes",     # thanks first, complaint after
    "stil doesnt work",                                  # typos
    "nope.",
    "same error as before",
    "it crashes when the list is empty",
    'Traceback (most recent call last):\n  File "main.py", line 3, in <module>\n'
    "ZeroDivisionError: division by zero",               # a pasted traceback, nothing else
]
HARD_OTHER = [
    ("add an undo command to the editor", "neutral"),    # complaint words in a new request
    ("write a test for the revert endpoint", "neutral"),
    ("also handle the case where `x` is None", "neutral"),
    ("now add a docstring to `parse`", "neutral"),
    ("perfect, that fixed the crash", "satisfied"),
    ("great, the tests pass", "satisfied"),
]


@pytest.mark.parametrize("text", HARD_DISSATISFIED)
def test_hard_complaints_are_dissatisfied(text):
    assert is_dissatisfied(text)


@pytest.mark.parametrize(("text", "label"), HARD_OTHER)
def test_hard_non_complaints(text, label):
    assert follow_up_sentiment(text) == label


KNOWN_MISSES = [
    "looks good, but the edge case with zero items raises ZeroDivisionError",
    "this is a regression",
    "2 failed, 48 passed",
]


@pytest.mark.xfail(strict=True, reason="known misses of the shipped classifier (test split); "
                                       "update this list when a better one fixes them")
@pytest.mark.parametrize("text", KNOWN_MISSES)
def test_known_misses(text):
    assert is_dissatisfied(text)


def test_long_messages_are_scored_by_content_not_length():
    """Features are scaled to unit length: a traceback pasted many times is still a complaint and
    a long list of requests is still not."""
    assert is_dissatisfied("Traceback (most recent call last):\n  File 'x.py', line 1\n" * 300)
    assert not is_dissatisfied("add a docstring to every function in utils.py. " * 200)


# ----------------------------------------------------------------------------- data and weights

def test_data_file_is_well_formed():
    rows = load_follow_ups()
    for r in rows:
        assert set(r) == {"text", "label", "split"}, r
        assert r["label"] in LABELS and r["split"] in ("train", "test"), r
        assert isinstance(r["text"], str) and r["text"].strip(), r
    train = {_norm(r["text"]) for r in rows if r["split"] == "train"}
    test = {_norm(r["text"]) for r in rows if r["split"] == "test"}
    assert not train & test, f"in both splits: {sorted(train & test)}"
    assert len(train) + len(test) == len(rows), "a text appears twice"
    assert len(rows) >= 400 and len(test) >= 120, (len(rows), len(test))
    for split in ("train", "test"):
        labels = [r["label"] for r in rows if r["split"] == split]
        share = labels.count("dissatisfied") / len(labels)
        assert 0.4 <= share <= 0.6, f"{split}: {share:.2f} dissatisfied"
        assert {"satisfied", "neutral"} <= set(labels), split


def test_weights_were_built_from_the_current_train_split():
    blob = json.loads(WEIGHTS.read_text(encoding="utf-8"))
    assert blob["train_sha256"] == sentiment.fingerprint(load_follow_ups("train")), (
        "follow_ups.jsonl changed since the weights were built: run scripts/train_sentiment.py")
    assert blob["train_rows"] == len(load_follow_ups("train"))


def test_importing_the_classifier_loads_neither_numpy_nor_its_weights():
    code = ("import sys\nimport looprl.feedback.sentiment as s\n"
            "print('numpy' in sys.modules, s._weights.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "0"]
