"""A/B tests of two policies on live traffic: arm assignment, per-arm metrics, a decision.

    arm = assign_arm("user-42", "exp-v7", split_b=0.1)          # "A" (control) or "B" (candidate)
    rep = ab_report(store, signal="edit_outcome", min_sessions=200)
    rep.arms["B"].kept_rate, rep.diffs["reward"].lo, rep.decision.action   # promote|keep|rollback

Assignment hashes (experiment, user): deterministic, stateless, the same user always lands in the
same arm of one experiment, and arms of different experiments are independent. Infrastructure
failures are never counted. ``resolved`` and ``latency`` are over every session whose value is
known; the rest over *scored* sessions (``signals.py`` gives a reward, i.e. the user answered):

- ``resolved``: share of the edits users kept per request: a session whose agent changed nothing
  counts 0 whether or not the user said so, an edit counts its kept share once the user acted on
  it (or 0 after a complaint with no action), an edit nobody answered is left out. What users got,
  however often the policy edits, and the metric the decision uses: over scored sessions only, a
  policy that edits less would shed into silence the failures ``reward`` and ``kept`` never see;
- ``reward``: mean signal reward;  ``edited``: share of scored sessions with an edit event;
  ``kept``: mean share of edited files kept (over the sessions with an edit event, so a policy
  that edits less often, only where it is sure, raises it: read it beside ``edited`` and
  ``resolved``);
  ``reverted``: share of those whose final edit event reverted everything;
  ``dissatisfied``: share of scored sessions with a dissatisfied follow-up;  ``latency``: mean
  seconds the user waited for the session's answer.

Each difference B - A gets a 95% bootstrap interval, resampling each arm independently (the arms
hold different users, so unlike ``looprl.bench.gate``'s paired bootstrap nothing is paired).
``kept_within_requests`` compares kept within each request (repo + prompt) that both arms edited,
weighted by the request's edited sessions: a policy that edits only the requests it finds easy
raises ``kept`` but not this; production traffic that never repeats a request has none of it.
The decision weighs ``resolved`` (what users got) and ``reward`` (also what they said: where
neither arm edits, ``resolved`` is 0 on both and only the follow-ups tell them apart): ``keep``
until both arms have ``min_sessions`` scored sessions; ``rollback`` when either CI lies below 0 or
reverts rose by more than ``max_revert_rise`` at the CI's lower bound; ``promote`` when either
CI's lower bound is above ``min_gain``, neither point estimate is below 0 and reverts did not
rise; ``keep`` otherwise (not enough evidence either way).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from looprl.errors import ConfigError
from looprl.feedback.signals import edit_share, get_signal, in_order
from looprl.feedback.store import EDIT_KINDS, Event, FeedbackStore, SessionRecord

ARMS = ("A", "B")
METRICS = ("reward", "resolved", "edited", "kept", "reverted", "dissatisfied", "latency")
HIGHER_IS_BETTER = {"reward": True, "resolved": True, "edited": True, "kept": True,
                    "reverted": False, "dissatisfied": False, "latency": False}


def assign_arm(user: str, experiment: str, split_b: float = 0.5) -> str:
    """"B" for a ``split_b`` share of users (by a hash of experiment and user), else "A".

    >>> assign_arm("u1", "exp", 0.0), assign_arm("u1", "exp", 1.0)
    ('A', 'B')
    """
    if not 0.0 <= split_b <= 1.0:
        raise ConfigError(f"split_b must be in [0, 1] (the share of users on arm B), got {split_b}")
    h = hashlib.sha256(f"{experiment}\x00{user}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2.0**64
    return "B" if u < split_b else "A"


def session_values(session: SessionRecord, events: Sequence[Event],
                   signal: str = "edit_outcome") -> dict[str, float]:
    """One served session's value of each metric (a metric it says nothing about is absent)."""
    out = {"latency": session.latency_s}
    if not session.files:
        out["resolved"] = 0.0  # nothing to keep: known without the user's answer
    rb = get_signal(signal)(session, events)
    if rb is None:
        return out
    edits = [e for e in in_order(events) if e.kind in EDIT_KINDS]
    out |= {"reward": rb.total, "resolved": 0.0, "edited": float(bool(edits)),
            "dissatisfied": float(any(e.sentiment == "dissatisfied" for e in events))}
    if edits:
        share = edit_share(edits[-1], session.files)
        out["resolved"] = out["kept"] = share
        out["reverted"] = float(share == 0.0)
    return out


@dataclass(frozen=True)
class ArmMetrics:
    arm: str
    sessions: int
    """Sessions served on this arm (infrastructure failures excluded)."""
    scored: int
    """Sessions with a signal (feedback arrived)."""
    reward: float | None
    resolved: float | None
    """Share of edits kept per session whose outcome is known (no edit: 0, answered or not)."""
    edited: float | None
    """Share of scored sessions with an edit event (``kept`` and ``reverted`` are over these)."""
    kept: float | None
    reverted: float | None
    dissatisfied: float | None
    latency: float | None
    """Mean seconds from request to answer (the user's wait)."""


@dataclass(frozen=True)
class Diff:
    metric: str
    diff: float | None
    """mean(B) - mean(A); None when an arm has no value."""
    lo: float | None
    hi: float | None
    strata: int | None = None
    """``kept_within_requests`` only: the requests both arms edited."""

    def ci(self) -> str:
        """The difference and its interval in words (for a Diff that has them)."""
        return f"{self.metric} B - A {self.diff:+.3f}, 95% CI [{self.lo:+.3f}, {self.hi:+.3f}]"


@dataclass(frozen=True)
class Decision:
    action: str
    """promote (B replaces A) | keep (keep collecting) | rollback (stop B)."""
    reason: str


@dataclass(frozen=True)
class ABReport:
    arms: dict[str, ArmMetrics]
    diffs: dict[str, Diff]
    decision: Decision

    def to_dict(self) -> dict[str, Any]:
        return {"arms": {a: asdict(m) for a, m in self.arms.items()},
                "diffs": {k: asdict(d) for k, d in self.diffs.items()},
                "decision": asdict(self.decision)}


def bootstrap_diff(a: Sequence[float], b: Sequence[float], *, n_boot: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """95% interval of mean(b) - mean(a), each arm resampled independently with replacement."""
    assert a and b, "bootstrap needs values in both arms"
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ma = xa[rng.integers(0, len(xa), (n_boot, len(xa)))].mean(axis=1)
    mb = xb[rng.integers(0, len(xb), (n_boot, len(xb)))].mean(axis=1)
    lo, hi = np.quantile(mb - ma, [0.025, 0.975])
    return float(lo), float(hi)


def _mean(xs: list[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def arm_metrics(arm: str, served: int, values: list[dict[str, float]]) -> ArmMetrics:
    col = {m: [v[m] for v in values if m in v] for m in METRICS}
    return ArmMetrics(arm, served, len(col["reward"]), *(_mean(col[m]) for m in METRICS))


def decide(arms: dict[str, ArmMetrics], diffs: dict[str, Diff], *, min_sessions: int = 100,
           min_gain: float = 0.0, max_revert_rise: float = 0.02) -> Decision:
    """promote / keep / rollback from the per-arm metrics and the B - A intervals."""
    a, b = arms.get("A"), arms.get("B")
    if a is None or b is None:
        return Decision("keep", "one arm has no sessions yet: serve both arms (--model-b)")
    if min(a.scored, b.scored) < min_sessions:
        return Decision("keep", f"need >= {min_sessions} scored sessions per arm "
                                f"(A has {a.scored}, B has {b.scored})")
    rev = diffs["reverted"]
    if rev.lo is not None and rev.lo > max_revert_rise:
        return Decision("rollback", f"reverts rose: B - A {rev.diff:+.3f}, 95% CI lower bound "
                                    f"{rev.lo:+.3f} > {max_revert_rise}")
    checks = ((diffs["resolved"], "fewer requests resolved"), (diffs["reward"], "reward dropped"))
    for d, why in checks:
        assert d.lo is not None and d.hi is not None and d.diff is not None
        if d.hi < 0:
            return Decision("rollback", f"{why}: {d.ci()}")
    gains = [d.ci() for d, _ in checks if d.lo is not None and d.lo > min_gain]
    not_lower = all(d.diff is not None and d.diff >= 0 for d, _ in checks)
    if gains and not_lower and (rev.hi is None or rev.hi <= max_revert_rise):
        return Decision("promote", f"gain: {'; '.join(gains)} > {min_gain}")
    return Decision("keep", f"no clear difference yet: {'; '.join(d.ci() for d, _ in checks)}")


def kept_within_requests(kept_by_request: dict[str, dict[str, list[float]]], *, n_boot: int = 2000,
                         seed: int = 0) -> Diff:
    """kept(B) - kept(A) within each request that both arms edited, weighted by the request's
    edited sessions (post-stratified by request); the 95% interval resamples the sessions within
    each (request, arm) cell. ``kept_by_request``: request -> arm -> kept of each edited session.

    >>> kept_within_requests({"r1": {"A": [0.0, 1.0], "B": [1.0, 1.0]}, "r2": {"A": [1.0]}}).diff
    0.5
    """
    cells = [c for c in kept_by_request.values() if c.get("A") and c.get("B")]
    if not cells:
        return Diff("kept_within_requests", None, None, None, 0)
    rng = np.random.default_rng(seed)
    w = np.array([len(c["A"]) + len(c["B"]) for c in cells], dtype=float)
    w /= w.sum()
    point = sum(wi * (np.mean(c["B"]) - np.mean(c["A"])) for wi, c in zip(w, cells, strict=True))
    boot = np.zeros(n_boot)
    for wi, c in zip(w, cells, strict=True):
        for arm, sign in (("B", 1.0), ("A", -1.0)):
            x = np.asarray(c[arm], dtype=float)
            boot += sign * wi * x[rng.integers(0, len(x), (n_boot, len(x)))].mean(axis=1)
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return Diff("kept_within_requests", float(point), float(lo), float(hi), len(cells))


def compare_arms(values_by_arm: dict[str, list[dict[str, float]]], served: dict[str, int], *,
                 n_boot: int = 2000, seed: int = 0, min_sessions: int = 100,
                 min_gain: float = 0.0, max_revert_rise: float = 0.02,
                 kept_by_request: dict[str, dict[str, list[float]]] | None = None) -> ABReport:
    """The report from per-session metric values of each arm (and, given each request's kept
    values per arm, ``kept_within_requests``; it informs, the decision does not use it)."""
    arms = {a: arm_metrics(a, served.get(a, 0), values_by_arm.get(a, []))
            for a in ARMS if served.get(a, 0) or values_by_arm.get(a)}
    diffs = {}
    for m in METRICS:
        xa = [v[m] for v in values_by_arm.get("A", []) if m in v]
        xb = [v[m] for v in values_by_arm.get("B", []) if m in v]
        if xa and xb:
            lo, hi = bootstrap_diff(xa, xb, n_boot=n_boot, seed=seed)
            diffs[m] = Diff(m, math.fsum(xb) / len(xb) - math.fsum(xa) / len(xa), lo, hi)
        else:
            diffs[m] = Diff(m, None, None, None)
    if kept_by_request is not None:
        diffs["kept_within_requests"] = kept_within_requests(kept_by_request, n_boot=n_boot,
                                                             seed=seed)
    return ABReport(arms, diffs, decide(arms, diffs, min_sessions=min_sessions, min_gain=min_gain,
                                        max_revert_rise=max_revert_rise))


def ab_report(store: FeedbackStore, *, signal: str = "edit_outcome",
              experiment: str | None = None, policy_versions: dict[str, int] | None = None,
              since: float | None = None,
              n_boot: int = 2000, seed: int = 0, min_sessions: int = 100, min_gain: float = 0.0,
              max_revert_rise: float = 0.02) -> ABReport:
    """Per-arm metrics and the decision over the store's sessions.

    ``experiment`` keeps only that experiment's sessions, ``policy_versions`` (arm -> version) only
    sessions served by those versions, and ``since`` (unix time) only recent ones.
    """
    values, served, by_request = arm_values(store, signal=signal, experiment=experiment,
                                            policy_versions=policy_versions, since=since)
    return compare_arms(values, served, n_boot=n_boot, seed=seed, min_sessions=min_sessions,
                        min_gain=min_gain, max_revert_rise=max_revert_rise,
                        kept_by_request=by_request)


def arm_values(store: FeedbackStore, *, signal: str = "edit_outcome",
               experiment: str | None = None, policy_versions: dict[str, int] | None = None,
               since: float | None = None
               ) -> tuple[dict[str, list[dict[str, float]]], dict[str, int],
                          dict[str, dict[str, list[float]]]]:
    """Per arm, each served session's ``session_values``; the sessions served per arm
    (infrastructure failures left out); and request -> arm -> kept of each edited session. The
    filters are ``ab_report``'s."""
    events = store.events_by_session()
    values: dict[str, list[dict[str, float]]] = {}
    served: dict[str, int] = {}
    by_request: dict[str, dict[str, list[float]]] = {}
    for s in store.sessions(experiment=experiment):
        if s.is_infra_error or (since is not None and s.created_at < since):
            continue
        if policy_versions is not None and policy_versions.get(s.arm) != s.policy_version:
            continue
        served[s.arm] = served.get(s.arm, 0) + 1
        v = session_values(s, events.get(s.id, []), signal)
        values.setdefault(s.arm, []).append(v)
        if "kept" in v:
            by_request.setdefault(s.request, {}).setdefault(s.arm, []).append(v["kept"])
    return values, served, by_request


def mean_interval(xs: Sequence[float], *, n_boot: int = 2000, seed: int = 0
                  ) -> tuple[float, float, float]:
    """(mean, 95% bootstrap low, high) of one arm's values."""
    assert xs, "an interval needs values"
    x = np.asarray(xs, dtype=float)
    boot = x[np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))].mean(axis=1)
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return float(x.mean()), float(lo), float(hi)
