"""How well does each follow-up classifier find complaints? Precision, recall and F1 of
"dissatisfied" on the test split of ``looprl/feedback/data/follow_ups.jsonl``.

    nice .venv/bin/python benchmarks/sentiment.py [--errors]

The baseline is the rule set (``rules``); the shipped classifier is ``sentiment.SHIPPED``. The
test split was written apart from the train split the learned classifier was fitted on (see the
data's README). The train split's figures are printed too, to show the gap between seen and unseen
messages. ``--errors`` lists the shipped classifier's mistakes on the test split. The last line is
machine-readable: ``precision_rules=... recall_rules=... f1_rules=... precision=... recall=...
f1=... ratio_f1=...`` (unsuffixed: the shipped classifier; ratio_f1 = f1 / f1_rules).
"""

from __future__ import annotations

import argparse
import statistics
import time

from looprl.feedback.sentiment import CLASSIFIERS, SHIPPED, load_follow_ups, score


def _ms_per_call(classify, text: str, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        classify(text)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--errors", action="store_true", help="list the shipped classifier's mistakes")
    args = ap.parse_args()
    test, train = load_follow_ups("test"), load_follow_ups("train")
    print(f"test split: {len(test)} follow-ups, {sum(r['label'] == 'dissatisfied' for r in test)} "
          f"dissatisfied; train split: {len(train)}")
    print(f"{'classifier':<18}{'precision':>10}{'recall':>8}{'F1':>7}{'train F1':>10}"
          f"{'ms (20k chars)':>16}")
    long_text = ("Traceback (most recent call last):\n  File 'x.py', line 1\n" * 400)[:20_000]
    scores = {}
    for name, classify in CLASSIFIERS.items():
        s = scores[name] = score(classify, test)
        ms = _ms_per_call(classify, long_text)
        mark = "  <- shipped" if name == SHIPPED else ""
        print(f"{name:<18}{s.precision:>10.3f}{s.recall:>8.3f}{s.f1:>7.3f}"
              f"{score(classify, train).f1:>10.3f}{ms:>16.1f}{mark}")
    if args.errors:
        for r in test:
            said = CLASSIFIERS[SHIPPED](r["text"])
            if (said == "dissatisfied") != (r["label"] == "dissatisfied"):
                print(f"  said {said:<12} labelled {r['label']:<12} {r['text']!r}")
    base, best = scores["rules"], scores[SHIPPED]
    print(f"precision_rules={base.precision:.3f} recall_rules={base.recall:.3f} "
          f"f1_rules={base.f1:.3f} precision={best.precision:.3f} recall={best.recall:.3f} "
          f"f1={best.f1:.3f} ratio_f1={best.f1 / max(base.f1, 1e-9):.2f}")


if __name__ == "__main__":
    main()
