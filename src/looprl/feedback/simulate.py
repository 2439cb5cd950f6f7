"""Simulated users: a population that drives ``looprl serve`` over its real HTTP API and acts on
the agent's edits the way the hidden tests say a careful user would.

    tasks = load_tasks("heldout.jsonl")
    summary = asyncio.run(simulate_users("http://127.0.0.1:8400", "s3cret", tasks,
                                         SimConfig(sessions=50, rate_per_min=6, keep_wrong=0.1)))
    looprl feedback simulate --url http://127.0.0.1:8400 --tasks heldout.jsonl --sessions 50

Each session: a user of the population (``sim-user-K``) arrives (Poisson arrivals,
``rate_per_min``), sends a task's terse prompt with the task's repo (``POST /v1/sessions``), waits
for the agent's diff, grades that diff itself with the task's hidden tests
(``looprl.rewards.tests.grade``, as ``rollout.score.make_tests_scorer`` does: an attack on the
grader fails), then KEEPS the edit when the tests pass and REVERTS it when they fail, up to the
configured noise; it may follow up: a complaint after a revert (or after no edit on a task still
failing), thanks or silence after a keep. Every event carries a client ``event_id`` (resent
unchanged on a retry, so a replay is never stored twice) and ``at``, when the user acted.

Stopping: ``simulate_users(..., stop=event)`` (the CLI sets it on SIGTERM/SIGINT): once set, users
who have not arrived yet never send (``not_sent`` in the summary's counts), while sessions already
sent finish, feedback included, so a parent process can stop the users and still get a summary
whose every sent session is stored.

Every random draw of a session (user, task, arrival, noise, wording) is made up front from
``seed``, so a run is reproducible whatever the server's timing; only what the agent does (and
so the grades) may differ between runs. The summary (``SimSummary.to_dict``) lists every session
id and event id sent: a loop checks "sent = stored" against the feedback store.

What this is NOT: real users. The follow-up wording comes from the templates below (written for
this module, kept apart from the classifier's labelled set ``data/follow_ups.jsonl``), and the
users are only as noisy as configured. The server sees HTTP only; the simulator needs the tasks'
repos on its own filesystem (to grade) at the same paths the server reads (the ``repo`` it sends),
so it runs beside the server or on a shared filesystem. Users see the hidden tests only through
the grade.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import httpx

from looprl.config import Length, Range, Seed, Share, check_ranges
from looprl.errors import ConfigError, RewardError
from looprl.types import Task

COMPLAINT_OPENERS = ("", "hmm, ", "ugh. ", "ok so ")
COMPLAINTS = (
    "the suite is still red after your change",
    "that edit fixed nothing, same failure as before",
    "this made things worse, rolling your patch back",
    "my failing test keeps failing with this patch",
    "it throws the exact same error as before",
    "your patch breaks the build for me",
    "the bug is still there after this",
    "I threw that change away, the fix is wrong",
    "this is not the fix, have another go",
    "same traceback as before, nothing changed",
    "wrong spot, the problem is somewhere else",
    "tests went from failing to failing differently",
)
"""Bodies of dissatisfied follow-ups (an opener is put in front of each)."""
THANKS_OPENERS = ("", "ah ", "oh nice, ")
THANKS = (
    "thanks, that did the trick",
    "all green on my side, thank you",
    "great, merged it",
    "perfect, exactly what I needed",
    "thx, works for me",
    "cheers, the suite passes",
    "nice one, thanks",
)
"""Bodies of thanks follow-ups (an opener is put in front of each)."""
FOLLOW_UP_KINDS = ("dissatisfied", "thanks")


def follow_up_texts(kind: str) -> list[str]:
    """Every text the simulator can send as a follow-up of ``kind`` ("dissatisfied" | "thanks").

    >>> len(follow_up_texts("dissatisfied")), follow_up_texts("thanks")[0]
    (48, 'thanks, that did the trick')
    """
    openers, bodies = {"dissatisfied": (COMPLAINT_OPENERS, COMPLAINTS),
                       "thanks": (THANKS_OPENERS, THANKS)}[kind]
    return [o + b for o in openers for b in bodies]


@dataclass(frozen=True)
class SimConfig:
    """A simulated population and how its users behave."""

    sessions: Annotated[int, Range(0, 10**9)] = 20
    """Sessions planned in all (a run stopped early sends fewer: the rest are ``not_sent``)."""
    rate_per_min: Annotated[float, Range(0.0, 1e6, lo_open=True)] = 6.0
    """Mean arrivals per minute (Poisson: exponential gaps)."""
    population: Annotated[int, Range(1, 10**7)] = 10
    """Distinct users (``sim-user-0`` ...); each session is by one drawn at random."""
    seed: Seed = 0
    """Seeds every draw: the same seed sends the same users, prompts, noise and wording."""
    keep_wrong: Share = 0.0
    """P(a user keeps an edit whose hidden tests fail)."""
    revert_right: Share = 0.0
    """P(a user reverts an edit whose hidden tests pass)."""
    silent: Share = 0.0
    """P(a user never answers: no edit event, no follow-up)."""
    complain: Share = 0.8
    """P(a dissatisfied follow-up after a revert, or after no edit on a failing task)."""
    thank: Share = 0.3
    """P(a thanks follow-up after a keep, or after no edit on a passing task); else silence."""
    user_prefix: Annotated[str, Length(1, 100)] = "sim-user"
    """Users are ``{user_prefix}-{k}``: a prefix per run keeps populations apart in one store."""
    request_timeout_s: Annotated[float, Range(0.0, 1e7, lo_open=True)] = 900.0
    """How long a user waits for a session (it may queue behind the server's slots)."""
    grade_concurrency: Annotated[int, Range(1, 4096)] = 2
    """Gradings at once (each runs the hidden tests in a sandbox)."""

    def __post_init__(self) -> None:
        check_ranges(self)  # the CLI builds it from its flags, not through from_dict

    def cli_args(self) -> list[str]:
        """The ``looprl feedback simulate`` flags that rebuild this config (how a process that
        starts the users, like ``feedback.loop``, passes it on)."""
        flag = {"rate_per_min": "--rate", "request_timeout_s": "--request-timeout"}
        return [a for f in dataclasses.fields(SimConfig)
                for a in (flag.get(f.name, "--" + f.name.replace("_", "-")),
                          str(getattr(self, f.name)))]


@dataclass(frozen=True)
class Plan:
    """One session's draws, made before anything is sent."""

    index: int
    user: str
    task: Task
    arrival_s: float
    """Seconds after the run starts."""
    noise_u: float
    silent_u: float
    follow_u: float
    wording_u: float


@dataclass
class SessionOutcome:
    """What happened in one simulated session."""

    index: int
    user: str
    task_id: str
    status: str = "pending"
    """served | infra_error (503) | error (any other answer, or no answer) | not_sent (the run
    was stopped before this user arrived)."""
    session_id: str | None = None
    passed: bool | None = None
    """The hidden tests' verdict on the session's diff (None: not graded)."""
    action: str | None = None
    """kept | reverted | None (silent, no edit, or not served)."""
    follow_up: str | None = None
    """dissatisfied | thanks | None."""
    follow_up_text: str | None = None
    event_ids: list[str] = field(default_factory=list)
    latency_s: float = 0.0
    """Client-side: request sent -> diff received."""
    server_latency_s: float | None = None
    files: int = 0
    error: str | None = None


@dataclass(frozen=True)
class SimSummary:
    """The run: counts, per-session outcomes, and every id sent (for "sent = stored")."""

    config: SimConfig
    outcomes: list[SessionOutcome]
    wall_s: float

    def counts(self) -> dict[str, Any]:
        o = self.outcomes
        served = [s for s in o if s.status == "served"]
        not_sent = sum(s.status == "not_sent" for s in o)
        return {
            "planned": len(o),
            "sent": len(o) - not_sent,
            "not_sent": not_sent,
            "stored": sum(s.session_id is not None for s in o),
            "served": len(served),
            "infra_error": sum(s.status == "infra_error" for s in o),
            "error": sum(s.status == "error" for s in o),
            "graded": sum(s.passed is not None for s in served),
            "passed": sum(s.passed is True for s in served),
            "answered": sum(bool(s.event_ids) for s in served),
            "silent": sum(s.status == "served" and not s.event_ids for s in o),
            "no_edit": sum(s.files == 0 for s in served),
            "kept": sum(s.action == "kept" for s in o),
            "reverted": sum(s.action == "reverted" for s in o),
            "kept_wrong": sum(s.action == "kept" and s.passed is False for s in o),
            "reverted_right": sum(s.action == "reverted" and s.passed is True for s in o),
            "follow_ups": {k: sum(s.follow_up == k for s in o) for k in FOLLOW_UP_KINDS},
            "events": sum(len(s.event_ids) for s in o),
        }

    def to_dict(self) -> dict[str, Any]:
        lat = sorted(s.latency_s for s in self.outcomes if s.status == "served")
        return {
            **self.counts(), "wall_s": round(self.wall_s, 3), "config": asdict(self.config),
            "latency_s": {"p50": round(statistics.median(lat), 3) if lat else None,
                          "max": round(lat[-1], 3) if lat else None},
            "session_ids": [s.session_id for s in self.outcomes if s.session_id],
            "event_ids": [{"session_id": s.session_id, "event_id": e}
                          for s in self.outcomes for e in s.event_ids],
            # the sessions sent (a run stopped early planned many more: they are only counted)
            "sessions": [asdict(s) for s in self.outcomes if s.status != "not_sent"],
        }


def plan_sessions(tasks: list[Task], cfg: SimConfig) -> list[Plan]:
    """Every session's draws from ``cfg.seed``.

    >>> from looprl.types import Grader
    >>> ts = [Task(f"t{i}", "/r", f"fix f{i}", Grader("pytest")) for i in range(3)]
    >>> a = plan_sessions(ts, SimConfig(sessions=5, seed=7))
    >>> a == plan_sessions(ts, SimConfig(sessions=5, seed=7)), len(a), a[0].arrival_s > 0
    (True, 5, True)
    """
    if not tasks and cfg.sessions:
        raise ConfigError("no tasks to draw prompts from: pass a task JSONL with at least one task")
    rng = random.Random(cfg.seed)
    t, out = 0.0, []
    for i in range(cfg.sessions):
        t += rng.expovariate(cfg.rate_per_min / 60.0)
        out.append(Plan(i, f"{cfg.user_prefix}-{rng.randrange(cfg.population)}", rng.choice(tasks),
                        t, rng.random(), rng.random(), rng.random(), rng.random()))
    return out


def decide(p: Plan, passed: bool, has_edit: bool, cfg: SimConfig) -> tuple[str | None, str | None]:
    """(edit action, follow-up kind) for a served session whose diff ``passed`` or not.

    >>> from looprl.types import Grader
    >>> p = Plan(0, "u", Task("t", "/r", "p", Grader("pytest")), 1.0, 0.5, 0.5, 0.5, 0.0)
    >>> decide(p, True, True, SimConfig()), decide(p, False, True, SimConfig())
    (('kept', None), ('reverted', 'dissatisfied'))
    >>> decide(p, False, True, SimConfig(keep_wrong=1.0)), decide(p, False, True, SimConfig(silent=1))
    (('kept', None), (None, None))
    """
    if p.silent_u < cfg.silent:
        return None, None
    if has_edit:
        flip = p.noise_u < (cfg.revert_right if passed else cfg.keep_wrong)
        action = "kept" if passed != flip else "reverted"
        happy = action == "kept"  # a user who kept a wrong edit believes it worked
    else:  # nothing to keep or revert: the user says so, or not
        action, happy = None, passed
    if happy:
        return action, "thanks" if p.follow_u < cfg.thank else None
    return action, "dissatisfied" if p.follow_u < cfg.complain else None


async def _post_event(client: httpx.AsyncClient, sid: str, body: dict[str, Any],
                      attempts: int = 3) -> None:
    """One feedback event, resent with the same ``event_id`` on a transport error (a replay is
    counted by the store, never stored twice)."""
    for k in range(attempts):
        try:
            r = await client.post(f"/v1/sessions/{sid}/feedback", json=body)
        except httpx.TransportError:
            if k == attempts - 1:
                raise
            await asyncio.sleep(0.5 * 2 ** k)
            continue
        r.raise_for_status()
        return


async def _grade(task: Task, diff: str) -> bool:
    from looprl.rewards.hacking import ATTACK_FLAGS
    from looprl.rewards.tests import grade

    g = await grade(task, diff)
    return g.passed and not set(g.flags) & ATTACK_FLAGS


async def _arrives(delay_s: float, stop: asyncio.Event | None) -> bool:
    """Wait ``delay_s`` seconds; False as soon as ``stop`` is set instead."""
    if stop is None:
        await asyncio.sleep(delay_s)
        return True
    if stop.is_set():
        return False
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([stopped], timeout=delay_s)
    finally:
        stopped.cancel()
    return not stop.is_set()


async def _one(client: httpx.AsyncClient, p: Plan, cfg: SimConfig,
               grading: asyncio.Semaphore) -> SessionOutcome:
    out = SessionOutcome(p.index, p.user, p.task.id)
    start = time.monotonic()
    try:
        r = await client.post("/v1/sessions", timeout=cfg.request_timeout_s,
                              json={"user": p.user, "prompt": p.task.prompt, "repo": p.task.repo,
                                    **({"venv": p.task.venv} if p.task.venv else {})})
    except httpx.HTTPError as e:
        out.status, out.error = "error", f"{type(e).__name__}: {e}"
        return out
    out.latency_s = time.monotonic() - start
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    out.session_id = body.get("session_id")
    if r.status_code != 200:
        out.status = "infra_error" if body.get("infrastructure") else "error"
        out.error = f"{r.status_code}: {body.get('message') or r.text[:300]}"
        return out
    out.status, out.server_latency_s, out.files = "served", body["latency_s"], len(body["files"])
    try:
        async with grading:
            out.passed = await _grade(p.task, body["diff"])
    except RewardError as e:  # the grader could not run: this user cannot judge, says nothing
        out.error = f"grading failed: {e}"
        return out
    out.action, out.follow_up = decide(p, out.passed, out.files > 0, cfg)
    if out.follow_up:
        texts = follow_up_texts(out.follow_up)
        out.follow_up_text = texts[int(p.wording_u * len(texts))]
    events = [(f"sim{cfg.seed}-{p.index}-edit", {"kind": out.action})] if out.action else []
    if out.follow_up_text:
        events.append((f"sim{cfg.seed}-{p.index}-follow",
                       {"kind": "follow_up", "text": out.follow_up_text}))
    assert out.session_id is not None
    for eid, ev in events:
        try:
            await _post_event(client, out.session_id, {"event_id": eid, **ev, "at": time.time()})
        except httpx.HTTPError as e:  # not confirmed stored: left out of event_ids, reported
            out.error = f"feedback {eid} failed: {type(e).__name__}: {e}"
            break
        out.event_ids.append(eid)
    return out


async def simulate_users(url: str, token: str, tasks: list[Task], cfg: SimConfig,
                         stop: asyncio.Event | None = None) -> SimSummary:
    """Run the population against the server at ``url`` (``looprl serve``); returns when every
    session has been answered (or not) by its user. Once ``stop`` is set, users who have not
    arrived yet never send (``not_sent``); sessions already sent finish, feedback included."""
    plans = plan_sessions(tasks, cfg)
    grading = asyncio.Semaphore(cfg.grade_concurrency)
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=60,
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        r = await client.get("/healthz")
        if r.status_code != 200:
            raise ConfigError(f"{url}/healthz answered {r.status_code}: is `looprl serve` there?")
        sent: list[asyncio.Task[SessionOutcome]] = []  # only arrived users hold a task
        for p in plans:
            if not await _arrives(max(0.0, t0 + p.arrival_s - time.monotonic()), stop):
                break
            sent.append(asyncio.ensure_future(_one(client, p, cfg, grading)))
        outcomes = list(await asyncio.gather(*sent))
    outcomes += [SessionOutcome(p.index, p.user, p.task.id, status="not_sent")
                 for p in plans[len(outcomes):]]
    return SimSummary(cfg, outcomes, time.monotonic() - t0)
