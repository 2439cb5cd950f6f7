"""An A/B's kept rate compared within requests: does the candidate fix the same requests better,
or does it only edit on different (easier) ones? Post-stratified by request (repo + prompt).

    .venv/bin/python scripts/ab_by_request.py runs/rt33/feedback.db rt33-final

``feedback.ab`` compares each arm's kept rate over the sessions in which it edited, so a policy
that edits less often, where it is sure, raises it without fixing anything better. Here each
request seen with an edit on both arms gives kept(B) - kept(A), weighted by its edited sessions;
the 95% interval resamples the sessions within each (request, arm) cell. Prints the requests
used and the per-arm share of sessions with an edit beside it.
"""

from __future__ import annotations

import argparse

import numpy as np

from looprl.feedback.ab import session_values
from looprl.feedback.store import FeedbackStore


def weighted_diff(cells: list[dict[str, list[float]]]) -> float:
    w = np.array([len(c["A"]) + len(c["B"]) for c in cells], dtype=float)
    d = np.array([np.mean(c["B"]) - np.mean(c["A"]) for c in cells])
    return float((w * d).sum() / w.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", help="the feedback store (a loop run's feedback.db)")
    ap.add_argument("experiment", help="the A/B's experiment (e.g. NAME-final, NAME-c3)")
    ap.add_argument("--signal", default="edit_outcome")
    a = ap.parse_args()
    store = FeedbackStore(a.store)
    events = store.events_by_session()
    cells: dict[str, dict[str, list[float]]] = {}
    scored = {"A": 0, "B": 0}
    for s in store.sessions(experiment=a.experiment):
        v = None if s.is_infra_error else session_values(s, events.get(s.id, []), a.signal)
        if v is None or s.arm not in scored:
            continue
        scored[s.arm] += 1
        if "kept" in v:
            cells.setdefault(f"{s.repo}\0{s.prompt}", {"A": [], "B": []})[s.arm].append(v["kept"])
    both = [c for c in cells.values() if c["A"] and c["B"]]
    if not both:
        raise SystemExit(f"no request has an edited session on both arms of {a.experiment!r}")
    rng = np.random.default_rng(0)
    boot = [weighted_diff([{arm: list(rng.choice(c[arm], len(c[arm]))) for arm in "AB"}
                           for c in both]) for _ in range(2000)]
    lo, hi = np.quantile(boot, [0.025, 0.975])
    edited = {arm: sum(len(c[arm]) for c in cells.values()) for arm in "AB"}
    print(f"requests with an edit: {len(cells)}, on both arms: {len(both)}; sessions with an edit "
          f"A {edited['A']}/{scored['A']}, B {edited['B']}/{scored['B']}")
    print(f"kept_delta_by_request={weighted_diff(both):+.4f} ci_low={lo:+.4f} ci_high={hi:+.4f}")


if __name__ == "__main__":
    main()
