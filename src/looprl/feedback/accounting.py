"""Where every session of a real-time loop run went: the accounting of ``RUN/report.md``.

    acc = account(store, sent=json.load(open("RUN/users.json")), rolled_back={2}, current=1,
                  signal="edit_outcome")
    acc["lost"], acc["trained_twice"]   # both 0 in a sound run

Sent by users = stored = trained + waiting (scored sessions of the policy served now, for the
next window) + superseded (scored after their policy's window was taken, by a policy since
replaced) + A/B-only (served by a candidate that was rolled back) + unscored (no feedback) +
infrastructure failures. ``lost``: sessions the users sent that the store lacks; ``unknown``:
stored sessions they never reported sending.
"""

from __future__ import annotations

from typing import Any

from looprl.feedback.signals import get_signal
from looprl.feedback.store import FeedbackStore


def account(store: FeedbackStore, sent: dict[str, Any] | None, rolled_back: set[int], current: int,
            signal: str) -> dict[str, int]:
    """Where every session went (module docstring): sent = stored = the categories' sum;
    ``sent`` is the simulated users' summary (None: real users, who report nothing)."""
    fn, events = get_signal(signal), store.events_by_session()
    trained: dict[str, int] = {}
    for c in store.cycles():
        for sid in c.session_ids:
            trained[sid] = trained.get(sid, 0) + 1
    acc = dict.fromkeys(("stored", "trained", "waiting", "superseded", "ab_only", "unscored",
                         "infra"), 0)
    ids = set()
    for s in store.sessions():
        ids.add(s.id)
        acc["stored"] += 1
        if s.id in trained:
            acc["trained"] += 1
        elif s.is_infra_error:
            acc["infra"] += 1
        elif s.policy_version in rolled_back:
            acc["ab_only"] += 1
        elif fn(s, events.get(s.id, [])) is None:
            acc["unscored"] += 1
        elif s.policy_version == current:
            acc["waiting"] += 1
        else:  # scored after its policy's window was taken; a newer policy is served now
            acc["superseded"] += 1
    acc["trained_twice"] = sum(n > 1 for n in trained.values())
    if sent is not None:
        got = {o["session_id"] for o in sent["sessions"] if o.get("session_id")}
        acc["sent"] = len(got)
        acc["lost"] = len(got - ids)
        acc["unknown"] = len(ids - got)
    else:
        acc["sent"], acc["lost"], acc["unknown"] = acc["stored"], 0, 0
    return acc

