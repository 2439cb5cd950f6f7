"""A bounded load test of the feedback API on loopback: 20 concurrent clients, each with its own
connection, send 2,000 distinct events over 40 sessions with 500 replays mixed in (a replay is
the same body, same ``event_id``, sent again later, as a client retrying after a lost reply does).
Every request must succeed, the store must hold exactly sent - replays events, and each session's
reward must follow its latest edit by ``at``, whatever order the events arrived in.

    nice -n 15 .venv/bin/python -m pytest -q -s tests/serve/test_feedback_load.py
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import httpx
import pytest

from looprl.feedback.store import FeedbackStore
from looprl.harness.scripted import ScriptedPolicy
from looprl.models.tokenizer import build_tokenizer
from looprl.serve.api import ServeConfig, make_app

from .conftest import running, stored_session

TOKEN = "load"
CLIENTS, EVENTS_PER_CLIENT, REPLAYS_PER_CLIENT, SESSIONS = 20, 100, 25, 40
KINDS = [("kept", {}), ("reverted", {}), ("partially_kept", {"files": ["pkg/a.py"]}),
         ("follow_up", {"text": "that didn't work, still failing"}),
         ("follow_up", {"text": "thanks, works now"})]
EDIT_VALUE = {"kept": 1.0, "reverted": -1.0, "partially_kept": 0.0}


def plan(sessions: list[str], t0: float, client: int) -> list[dict]:
    """One client's requests: its distinct events, with replays of earlier ones mixed in."""
    rng = random.Random(client)
    events = []
    for i in range(EVENTS_PER_CLIENT):
        kind, payload = rng.choice(KINDS)
        events.append({"sid": rng.choice(sessions), "body": {
            "event_id": f"c{client}-e{i}", "kind": kind, **payload,
            "at": t0 + rng.uniform(0, 250)}})  # users' clocks: arrival order is scrambled
    sends = list(events)
    for _ in range(REPLAYS_PER_CLIENT):  # each replay lands after its original
        k = rng.randrange(len(events))
        sends.insert(rng.randrange(sends.index(events[k]) + 1, len(sends) + 1), events[k])
    return sends


@pytest.mark.slow
def test_feedback_api_under_concurrent_load_with_replays(tmp_path):
    tok = build_tokenizer(None)
    store = FeedbackStore(tmp_path / "fb.db")
    t0 = time.time()
    sessions = [stored_session(store, user=f"u{i}", created_at=t0) for i in range(SESSIONS)]
    app = make_app({"A": ScriptedPolicy(tok, [])}, tok, store, ServeConfig(token=TOKEN))
    plans = [plan(sessions, t0, c) for c in range(CLIENTS)]
    sent = sum(len(p) for p in plans)
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def client(url: str, requests: list[dict]) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60,
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            for req in requests:
                t = time.perf_counter()
                r = await c.post(f"/v1/sessions/{req['sid']}/feedback", json=req["body"])
                latencies.append(time.perf_counter() - t)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

    with running(app) as srv:
        start = time.perf_counter()

        async def all_clients() -> None:
            await asyncio.gather(*(client(srv.url, p) for p in plans))

        asyncio.run(all_clients())
        wall = time.perf_counter() - start
        stats = httpx.get(srv.url + "/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        rewards = {sid: httpx.get(f"{srv.url}/v1/sessions/{sid}", timeout=30,
                                  headers={"Authorization": f"Bearer {TOKEN}"}).json()["reward"]
                   for sid in sessions}

    replays = CLIENTS * REPLAYS_PER_CLIENT
    lat = sorted(latencies)
    print(f"\nfeedback load: {CLIENTS} clients, {sent} requests ({sent - replays} events + "
          f"{replays} replays) in {wall:.2f} s = {sent / wall:.0f} req/s; latency p50 "
          f"{1000 * statistics.median(lat):.1f} ms, p95 {1000 * lat[int(0.95 * len(lat))]:.1f} ms; "
          f"statuses {statuses}; stored {stats['events']}, replays ignored {stats['replays_ignored']}")
    assert statuses == {200: sent}
    assert stats["events"] == sent - replays == CLIENTS * EVENTS_PER_CLIENT
    assert stats["replays_ignored"] == replays
    # each session's reward: its latest edit by `at` (never by arrival), -0.5 if any complaint
    # unless that edit was reverted (the revert already said it failed)
    unique = {e["body"]["event_id"]: e for p in plans for e in p}.values()
    for sid in sessions:
        mine = sorted((e["body"] for e in unique if e["sid"] == sid), key=lambda b: b["at"])
        edits = [b for b in mine if b["kind"] in EDIT_VALUE]
        edit = EDIT_VALUE[edits[-1]["kind"]] if edits else 0.0
        complained = any("didn't" in b.get("text", "") for b in mine)
        want = edit - (0.5 if complained and edit > -1.0 else 0.0)
        assert rewards[sid]["total"] == pytest.approx(want), sid
    store.close()
