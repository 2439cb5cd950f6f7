"""Train the learned follow-up classifier and write its weights (package data).

    nice .venv/bin/python scripts/train_sentiment.py [--steps 400] [--lr 5.0]

Logistic regression, *dissatisfied* vs not, over ``sentiment.features`` (words, word pairs, 3-5
character pieces, each present or not, scaled to unit length), trained by plain full-batch
gradient descent in numpy on the **train** split of ``feedback/data/follow_ups.jsonl``. The L2
strength is picked by 5-fold cross-validation on the train split (F1 of "dissatisfied"); the test
split is never read here, so ``benchmarks/sentiment.py`` measures on data the model has not seen.
The vocabulary is every feature in at least ``--min-df`` training messages. Deterministic: the
same data gives the same file. Takes a few seconds.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np

from looprl.feedback.sentiment import CHAR_NGRAMS, WEIGHTS, features, fingerprint, load_follow_ups

L2_GRID = (1e-4, 1e-3, 1e-2)
FOLDS = 5


@dataclass(frozen=True)
class Rows:
    """Sparse rows, CSR-like: feature ``cols_N[i]`` of row ``row_N[i]`` has value ``vals_N[i]``."""

    row_N: np.ndarray
    cols_N: np.ndarray
    vals_N: np.ndarray
    n: int

    def dot(self, w_D: np.ndarray) -> np.ndarray:
        return np.bincount(self.row_N, weights=w_D[self.cols_N] * self.vals_N, minlength=self.n)

    def t_dot(self, g_B: np.ndarray, d: int) -> np.ndarray:
        return np.bincount(self.cols_N, weights=self.vals_N * g_B[self.row_N], minlength=d)


def vocabulary(feats: list[set[str]], min_df: int) -> dict[str, int]:
    df: dict[str, int] = {}
    for fs in feats:
        for f in fs:
            df[f] = df.get(f, 0) + 1
    return {f: i for i, f in enumerate(sorted(f for f, c in df.items() if c >= min_df))}


def rows(feats: list[set[str]], vocab: dict[str, int]) -> Rows:
    """Unit-length rows, as ``sentiment.dissatisfied_logit`` scales them."""
    r, c, v = [], [], []
    for i, fs in enumerate(feats):
        idx = sorted(vocab[f] for f in fs if f in vocab)
        if not idx:  # nothing known: the row scores the bias alone
            continue
        r += [i] * len(idx)
        c += idx
        v += [1 / np.sqrt(len(idx))] * len(idx)
    return Rows(np.asarray(r, np.int64), np.asarray(c, np.int64), np.asarray(v), len(feats))


def fit(x: Rows, y_B: np.ndarray, d: int, l2: float, steps: int, lr: float
        ) -> tuple[np.ndarray, float]:
    """Gradient descent on mean log-loss + l2/2 |w|^2 (the bias is not penalized)."""
    w_D, b = np.zeros(d), 0.0
    for _ in range(steps):
        p_B = 1 / (1 + np.exp(-(x.dot(w_D) + b)))
        g_B = (p_B - y_B) / len(y_B)
        w_D -= lr * (x.t_dot(g_B, d) + l2 * w_D)
        b -= lr * float(g_B.sum())
    return w_D, b


def f1(pred_B: np.ndarray, y_B: np.ndarray) -> float:
    tp = float((pred_B & y_B).sum())
    return 2 * tp / max(1.0, float(pred_B.sum() + y_B.sum()))


def cross_validate(feats: list[set[str]], y_B: np.ndarray, l2: float, args: argparse.Namespace
                   ) -> float:
    fold_B = np.random.default_rng(0).permutation(len(feats)) % FOLDS
    pred_B = np.zeros(len(feats), bool)
    for k in range(FOLDS):
        tr, va = np.flatnonzero(fold_B != k), np.flatnonzero(fold_B == k)
        vocab = vocabulary([feats[i] for i in tr], args.min_df)
        w_D, b = fit(rows([feats[i] for i in tr], vocab), y_B[tr], len(vocab), l2, args.steps,
                     args.lr)
        pred_B[va] = rows([feats[i] for i in va], vocab).dot(w_D) + b > 0
    return f1(pred_B, y_B.astype(bool))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=400, help="gradient-descent steps")
    ap.add_argument("--lr", type=float, default=5.0, help="step size (rows have unit length)")
    ap.add_argument("--min-df", type=int, default=2, help="keep features in >= this many messages")
    args = ap.parse_args()

    train = load_follow_ups("train")
    assert train, "no train rows in follow_ups.jsonl"
    feats = [features(r["text"]) for r in train]
    y_B = np.asarray([r["label"] == "dissatisfied" for r in train], float)
    cv = {l2: cross_validate(feats, y_B, l2, args) for l2 in L2_GRID}
    for l2, score in cv.items():
        print(f"l2={l2:g}  cross-validated F1={score:.3f}")
    l2 = max(cv, key=lambda k: cv[k])
    vocab = vocabulary(feats, args.min_df)
    w_D, b = fit(rows(feats, vocab), y_B, len(vocab), l2, args.steps, args.lr)
    blob = {"about": "logistic regression, dissatisfied vs not; see scripts/train_sentiment.py",
            "char_ngrams": list(CHAR_NGRAMS), "l2": l2, "steps": args.steps, "lr": args.lr,
            "min_df": args.min_df, "train_rows": len(train),
            "train_sha256": fingerprint(train), "cv_f1": round(cv[l2], 4),
            "bias": round(b, 4), "weights": {f: round(float(w_D[i]), 4) for f, i in vocab.items()}}
    WEIGHTS.write_text(json.dumps(blob, ensure_ascii=False, separators=(",", ":")) + "\n",
                       encoding="utf-8")
    print(f"picked l2={l2:g}; wrote {len(vocab)} weights to {WEIGHTS}")


if __name__ == "__main__":
    main()
