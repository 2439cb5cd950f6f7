"""RayFleet: rollouts and sandboxes on every node of a Ray cluster, the trainer as the driver.

    fleet = await RayFleet.start(FleetConfig(backend="ray", address="10.0.0.1:6379"), spec,
                                 snapshot=RunDir(run_dir).fleet)
    runner = RolloutRunner.over(fleet, rollout_cfg)   # the runner's admission, slots and retries
    loop = GRPOLoop(step, fleet, runner, ...)          # fleet.update_weights: replicas pull
    await loop.run()
    await fleet.close()

Members: every node that has the resources (``FleetConfig.experimental``: CPUs/GPUs per engine, an
optional custom resource) gets one *member*: ``engines_per_node`` engine replicas and one environment
server (``actors.py``), pinned to the node. A node that joins the cluster is found within
``poll_s`` and gets a member, which loads the starting checkpoint and pulls the current weight
version from the store before it takes work.

Routing: the runner opens a group, the fleet routes it to the *lane* (one replica of one member)
with the fewest open trajectories (those of its groups not yet finished), then the fewest prompt
tokens in flight. Every attempt of the group runs on that lane's node, so the replica computes the
group's prompt KV once, and the sandbox of each attempt lives and dies on that node. Load is
balanced across groups by the runner's one pool of slots: a lane whose rollouts finish early gets
the next group admitted, so slow rollouts elsewhere never leave it idle.

Failures: an attempt whose environment server, replica or node dies (any Ray error but one raised
by our own code) comes back as an ``INFRA_ERROR`` trajectory, which the runner retries in a fresh
sandbox — on another lane, since the dead member is dropped at once and its groups are re-routed.
It is never scored, and neither is an attempt whose result arrives from a member lost while it
was in flight (its node may be gone half way: every attempt in flight on a lost member is lost,
``_Member.cut``). The lost member's actors are killed; if its node is still alive a new member
is started there after a back-off. Groups are assembled in the driver, so no group is lost with a
node and none is handed out twice. A node that dies mid-call is noticed when Ray marks it dead
(its health checks: seconds); until then its calls wait.

Weights: ``update_weights(state_dict, version)`` (the trainer's call after it published
``version`` to the store) makes every live replica pull ``version`` from the store, between
decode steps, while its rollouts go on; the state dict itself is not sent.

Faults (``looprl.faults``): ``MemberSpec.faults`` makes every member's actors inject the failures
of their boundaries (``actors.py``), and the driver a node loss (``node_lost``, per attempt: the
member's actors are killed, every attempt in flight on it is lost, each counted); what the
actors injected comes back with the results and joins the driver's books. Loads a replica
retried count as ``weight_read`` failures in the run's ledger.

Fleet view: every ``poll_s`` the driver samples each actor (sandboxes busy/idle/queued, rollouts
in flight, requests and tokens in flight, tokens/s) and writes ``snapshot`` (``snapshot.py``),
which the dashboard shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprl import faults
from looprl.errors import ConfigError, InfraKind, LooprlError
from looprl.faults import FaultsConfig, InfraLedger
from looprl.fleet.actors import EngineReplica, EnvServer, Pulled
from looprl.fleet.config import FleetConfig
from looprl.fleet.snapshot import EngineView, FleetSnapshot, NodeView, write_snapshot
from looprl.rewards.composite import RewardConfig
from looprl.rollout.config import RolloutConfig
from looprl.rollout.runner import infra_trajectory
from looprl.types import Task, Trajectory

log = logging.getLogger(__name__)


class FleetError(LooprlError):
    """The fleet cannot run rollouts (no node came up, Ray unreachable)."""


@dataclass(frozen=True)
class MemberSpec:
    """What every node's engine replicas and environment server are built from."""

    model_dir: str
    """The starting checkpoint; readable at this path on every node."""
    tokenizer: Any
    weights_url: str
    """The weight store the trainer publishes to and the replicas pull from."""
    rollout: RolloutConfig
    reward: RewardConfig
    engine: str = "torch"
    """``looprl.inference`` engine name: torch, vllm (its worker from `make vllm`'s venv on each
    node, vLLM's CPU build on CPU nodes) or a plugin."""
    engine_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of a non-torch engine (``model.engine_options``), e.g. vLLM's
    ``gpu_memory_utilization`` or ``kv_cache_gib``."""
    weights_options: dict[str, Any] = field(default_factory=dict)
    """fsspec storage options of ``weights_url`` (``fleet.experimental.weights_options``)."""
    faults: FaultsConfig | None = None
    """Failures the members' actors inject (drills; ``looprl.faults``)."""
    http_roots: tuple[str, ...] | None = None
    """With ``fleet.experimental.sandboxes = "http"``: what each node's HTTP env server allows (the tasks'
    repositories and venvs, ``remote_pool.task_roots``)."""


@dataclass(eq=False)
class _Lane:
    """One engine replica of one member: what a group is routed to."""

    member: _Member
    index: int
    replica: Any
    open: int = 0
    """Trajectories of the groups routed here that have not finished."""
    stats: dict[str, float] = field(default_factory=dict)
    tokens_per_s: float = 0.0


@dataclass(eq=False)
class _Member:
    """A node's actors: its environment server and its engine replicas."""

    node_id: str
    address: str
    env: Any
    lanes: list[_Lane] = field(default_factory=list)
    state: str = "starting"
    since: float = field(default_factory=time.monotonic)
    version: int = 0
    in_flight: set[str] = field(default_factory=set)
    cut: set[str] = field(default_factory=set)
    """The attempts in flight when it was lost: lost with it, whatever comes back."""
    env_stats: dict[str, float] = field(default_factory=dict)
    sampling: asyncio.Task[None] | None = None

    @property
    def handles(self) -> list[Any]:
        return [self.env, *(lane.replica for lane in self.lanes)]


@dataclass
class _Route:
    lane: _Lane | None
    remaining: int


@dataclass
class FleetStats:
    """What happened to the fleet during a run."""

    members_started: int = 0
    members_lost: int = 0
    lost_attempts: list[str] = field(default_factory=list)
    """Ids of attempts cut off by a lost actor or node (the runner retried each; none scored)."""
    events: deque[str] = field(default_factory=lambda: deque(maxlen=50))


def _init_ray(ray: Any, kwargs: dict[str, Any], address: str | None) -> None:
    """Join Ray, or start a head of our own when no address is given. A head Ray starts here
    waits a fixed 30 s for its raylet and then raises a bare Exception; on an overloaded machine
    that is a slow start, not a broken setup, so a head of our own is started up to three
    times before the fleet gives up."""
    attempts = 1 if address else 3
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**kwargs)
            return
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise FleetError(f"cannot join Ray at fleet.address={address!r}: {e}; start the "
                             "head with `ray start --head` and pass its HOST:PORT") from None
        except Exception as e:  # Ray's own startup timeout is a bare Exception
            if "timed out during startup" not in str(e):
                raise
            ray.shutdown()
            if attempt == attempts:
                raise FleetError(f"Ray did not start ({attempts} tries, 30 s each): {e} Free "
                                 "some CPU, or start Ray yourself with `ray start --head` and "
                                 "pass fleet.address") from None
            log.warning("Ray's head timed out starting (try %d of %d); starting it again",
                           attempt, attempts)


class RayFleet:
    """See the module docstring. Implements the runner's ``Executor`` (``open_group``,
    ``close_group``, ``attempt``) and the trainer's weight hand-off (``update_weights``)."""

    def __init__(self, cfg: FleetConfig, spec: MemberSpec, snapshot: Path | None = None,
                 ledger: InfraLedger | None = None) -> None:
        self.cfg, self.spec, self.snapshot, self.ledger = cfg, spec, snapshot, ledger
        self.version = 0
        self.members: dict[str, _Member] = {}
        """node id -> its starting or live member (a lost one is removed)."""
        self.stats = FleetStats()
        self._routes: dict[str, _Route] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._fatal: str | None = None
        """A member that could not start for a config error (the same on every try and every
        node): ``start`` stops at once with it instead of retrying until its timeout."""
        self._spawned = 0
        """Members spawned so far: each draws its own fault stream (``_member_faults``)."""
        self._background: set[asyncio.Task[None]] = set()
        """Members coming up and load samples in flight (cancelled by ``close``)."""
        self._watcher: asyncio.Task[None] | None = None
        self._owns_ray = False
        self._tokenizer_ref: Any = None

    # -- lifecycle --------------------------------------------------------------------------------
    @classmethod
    async def start(cls, cfg: FleetConfig, spec: MemberSpec, snapshot: Path | None = None,
                    ledger: InfraLedger | None = None) -> RayFleet:
        """Join (or start) Ray, start a member on every node that qualifies, and return once
        ``min_nodes`` are live; ``FleetError`` after ``start_timeout_s`` without them.
        ``ledger`` counts the loads the replicas retried."""
        x = cfg.experimental
        fleet = cls(cfg, spec, snapshot, ledger)
        fleet._connect()
        fleet._watcher = asyncio.create_task(fleet._watch())
        deadline = time.monotonic() + x.start_timeout_s
        while len(fleet._live()) < x.min_nodes:
            if fleet._fatal is not None:
                await fleet.close()
                raise ConfigError(f"{fleet._fatal} (a config error: not retried)")
            if time.monotonic() > deadline:
                await fleet.close()
                raise FleetError(
                    f"{len(fleet._live())} of fleet.experimental.min_nodes={x.min_nodes} nodes "
                    f"came up within {x.start_timeout_s:.0f} s; last events: "
                    f"{list(fleet.stats.events)[-3:] or ['none: no node qualifies']}. Start "
                    "nodes with `ray start --address=HOST:PORT`, or lower "
                    "fleet.experimental.min_nodes")
            await asyncio.sleep(0.05)
        return fleet

    def _connect(self) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("fleet.backend=ray needs Ray: pip install -e '.[ray]' (or set "
                              "fleet.backend=inprocess)") from None
        if not ray.is_initialized():
            # "" is a Ray of this run's own: left to itself, ray.init() joins whichever cluster
            # was started last on this machine (another run's, a test's) and dies with it
            own = None if os.environ.get("RAY_ADDRESS") else "local"
            kwargs: dict[str, Any] = {"address": self.cfg.address or own,
                                      "logging_level": logging.WARNING}
            if self.cfg.experimental.node_ip:
                kwargs["_node_ip_address"] = self.cfg.experimental.node_ip
            _init_ray(ray, kwargs, self.cfg.address)
            self._owns_ray = True
        self._tokenizer_ref = ray.put(self.spec.tokenizer)

    async def close(self) -> None:
        """Stop watching, close every node's sandboxes, kill the actors (and leave Ray if this
        fleet joined it)."""
        import ray

        tasks = [t for t in (self._watcher, *self._background) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        members = list(self.members.values())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*(m.env.close.remote() for m in members),
                                                  return_exceptions=True), timeout=30)
        for m in members:
            self._kill(m)
        self.members.clear()
        if self._owns_ray:
            ray.shutdown()

    # -- the runner's Executor ----------------------------------------------------------------------
    def open_group(self, group_id: str, size: int) -> None:
        lane = self._least_loaded()
        if lane is not None:
            lane.open += size
        self._routes[group_id] = _Route(lane, size)

    def close_group(self, group_id: str) -> None:
        route = self._routes.pop(group_id)
        if route.lane is not None:
            route.lane.open -= route.remaining

    async def attempt(self, task: Task, group_id: str, traj_id: str) -> Trajectory:
        from ray.exceptions import RayError, RayTaskError

        route = self._routes[group_id]
        lane = await self._lane_of(route)
        if lane is None:
            return infra_trajectory(task, group_id, traj_id, FleetError(
                f"no fleet node was live for {self.cfg.experimental.wait_for_nodes_s:.0f} s "
                "(fleet.experimental.wait_for_nodes_s); start one with "
                "`ray start --address=HOST:PORT`", kind=InfraKind.NODE_LOST))
        member = lane.member
        member.in_flight.add(traj_id)
        out = None
        try:
            if faults.fires(InfraKind.NODE_LOST):  # the drill: this node dies now
                self._lose(member, f"{faults.MARK} node_lost")
                faults.active().count_in(InfraKind.NODE_LOST,  # type: ignore[union-attr]
                                         member.cut - {traj_id})
            else:
                out = await member.env.run.remote(task, group_id, traj_id, lane.index)
        except RayTaskError as e:  # our code raised on the node: a bad config, not weather
            raise e.as_instanceof_cause() from None
        except RayError as e:
            self._lose(member, f"{type(e).__name__} during a rollout")
        finally:
            member.in_flight.discard(traj_id)
        if out is None or traj_id in member.cut:
            self.stats.lost_attempts.append(traj_id)
            return infra_trajectory(task, group_id, traj_id, FleetError(
                f"fleet node {member.node_id[:8]} lost with this rollout in flight",
                kind=InfraKind.NODE_LOST))
        faults.absorb(out.injected)
        if out.replica_lost:  # the trajectory is kept when only its final release failed
            if out.trajectory.is_infra_error:
                self.stats.lost_attempts.append(traj_id)
            self._lose(member, "an engine replica died")
        if not out.trajectory.is_infra_error and route.lane is lane:
            route.remaining -= 1
            lane.open -= 1
        return out.trajectory

    async def _lane_of(self, route: _Route) -> _Lane | None:
        """The group's lane, re-routed to the least-loaded live one if its member was lost;
        None when no member is live for ``wait_for_nodes_s``."""
        deadline = time.monotonic() + self.cfg.experimental.wait_for_nodes_s
        while route.lane is None or route.lane.member.state != "live":
            lane = self._least_loaded()
            if lane is not None:
                if route.lane is not None:
                    route.lane.open -= route.remaining
                route.lane = lane
                lane.open += route.remaining
                break
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.05)
        return route.lane

    def _live(self) -> list[_Member]:
        return [m for m in self.members.values() if m.state == "live"]

    def _least_loaded(self) -> _Lane | None:
        lanes = [lane for m in self._live() for lane in m.lanes]
        return min(lanes, key=lambda lane: (lane.open, lane.stats.get("tokens_in_flight", 0.0)),
                   default=None)

    # -- weights --------------------------------------------------------------------------------------
    async def update_weights(self, state_dict: Any, version: int) -> None:
        """``version`` was published to the store: every live replica pulls it (``state_dict``
        is the trainer's copy and is not sent). A member starting now pulls it when it is up."""
        self.version = version
        await asyncio.gather(*(self._pull(m) for m in self._live()))

    async def _pull(self, m: _Member) -> None:
        from ray.exceptions import RayError, RayTaskError

        try:
            got = await asyncio.gather(*(lane.replica.pull.remote(self.version) for lane in m.lanes))
        except RayTaskError as e:  # the store itself is unreadable: the trainer must hear it
            raise e.as_instanceof_cause() from None
        except RayError as e:
            self._lose(m, f"{type(e).__name__} while pulling weights")
            return
        m.version = self._pulled(got)

    def _pulled(self, got: list[Pulled]) -> int:
        """The version a member's replicas serve; their retried loads go in the books."""
        for p in got:
            if self.ledger is not None:
                self.ledger.failure(InfraKind.WEIGHT_READ, p.read_failures)
            faults.absorb(p.injected)
        return min(p.version for p in got)

    # -- membership -----------------------------------------------------------------------------------
    async def _watch(self) -> None:
        while True:
            try:
                await self._reconcile()
                self._sample()
                if self.snapshot is not None:
                    write_snapshot(self.snapshot, self.view())
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 — the watch must outlive a bad poll
                log.exception("fleet watch: poll failed")
            await asyncio.sleep(self.cfg.experimental.poll_s)

    async def _reconcile(self) -> None:
        import ray

        nodes = await asyncio.to_thread(ray.nodes)
        self._nodes = {n["NodeID"]: n for n in nodes}
        for m in list(self.members.values()):
            if not self._nodes.get(m.node_id, {}).get("Alive", False):
                self._lose(m, "its node left the cluster")
        now = time.monotonic()
        for node_id, n in self._nodes.items():
            if (n["Alive"] and node_id not in self.members and self._qualifies(n)
                    and now >= self._retry_at.get(node_id, 0.0)):
                self._spawn(node_id, n)

    def _spawn_task(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _qualifies(self, node: dict[str, Any]) -> bool:
        res, c = node.get("Resources", {}), self.cfg.experimental
        return (res.get("CPU", 0.0) >= c.cpus_per_engine * c.engines_per_node
                and res.get("GPU", 0.0) >= c.gpus_per_engine * c.engines_per_node
                and (not c.node_resource or res.get(c.node_resource, 0.0) > 0))

    def _spawn(self, node_id: str, node: dict[str, Any]) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        c, s = self.cfg.experimental, self.spec
        fc = self._member_faults()
        on_node = NodeAffinitySchedulingStrategy(node_id, soft=False)
        replica = ray.remote(EngineReplica).options(
            num_cpus=c.cpus_per_engine, num_gpus=c.gpus_per_engine, scheduling_strategy=on_node)
        replicas = [replica.remote(s.model_dir, s.engine, s.weights_url, c.engine_threads,
                                   c.gpus_per_engine > 0, fc, s.weights_options, s.engine_options)
                    for _ in range(c.engines_per_node)]
        env = ray.remote(EnvServer).options(num_cpus=0, scheduling_strategy=on_node).remote(
            replicas, self._tokenizer_ref, s.rollout, s.reward, c.sandboxes_per_node,
            faults_cfg=fc, http_roots=s.http_roots)
        m = _Member(node_id, str(node.get("NodeManagerAddress", "")), env)
        m.lanes = [_Lane(m, i, r) for i, r in enumerate(replicas)]
        self.members[node_id] = m
        self._spawn_task(self._bring_up(m))

    def _member_faults(self) -> FaultsConfig | None:
        """The next member's injected failures: the spec's rates, seeded by the spawn. Each
        incarnation draws its own streams; with the spec's seed every node started after a loss
        repeated its predecessor's first draws, so a class whose first draws did not fire never
        fired on members that lived only a few attempts (seen: no grader crash in 131 attempts
        of a drill at 5%)."""
        self._spawned += 1
        f, inj = self.spec.faults, faults.active()
        life = inj.life if inj is not None else 0  # a resumed trainer's fleet spawns from 1 again
        return None if f is None else FaultsConfig(
            f.rates, seed=(f.seed * 1_000_003 + life) * 1_000_003 + self._spawned)

    async def _bring_up(self, m: _Member) -> None:
        """Load the models, pull the current version (again while the trainer moved on), start
        the sandbox pool; then the member takes groups."""
        from ray.exceptions import RayError

        async def up() -> int:
            version = self._pulled(await asyncio.gather(*(lane.replica.start.remote(self.version)
                                                          for lane in m.lanes)))
            await m.env.start.remote()
            while version < self.version:
                version = self._pulled(await asyncio.gather(
                    *(lane.replica.pull.remote(self.version) for lane in m.lanes)))
            return version

        try:
            got = await asyncio.wait_for(up(), timeout=self.cfg.experimental.start_timeout_s)
        except (RayError, asyncio.TimeoutError) as e:
            why = "timed out" if isinstance(e, asyncio.TimeoutError) else \
                f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
            cause = getattr(e, "cause", None)
            if isinstance(cause, ConfigError):  # e.g. a model path the node cannot read
                self._fatal = f"node {m.address} could not start its member: {cause}"
            self._lose(m, f"could not start ({why})")
            return
        m.state, m.version, m.since = "live", got, time.monotonic()
        self._failures.pop(m.node_id, None)
        self.stats.members_started += 1
        self._event(f"node {m.node_id[:8]} ({m.address}) joined: {len(m.lanes)} engine(s) at "
                    f"v{m.version}")

    def _lose(self, m: _Member, why: str) -> None:
        """Drop ``m`` (its groups re-route on their next attempt), kill its actors, and let the
        next poll start a new member on its node after a back-off if the node lives on."""
        if self.members.get(m.node_id) is not m:
            return  # already lost
        del self.members[m.node_id]
        was = m.state
        m.state = "lost"
        m.cut = set(m.in_flight)
        self.stats.members_lost += was == "live"
        n = self._failures[m.node_id] = self._failures.get(m.node_id, 0) + 1
        self._retry_at[m.node_id] = time.monotonic() + min(60.0, 2.0 ** n)
        self._kill(m)
        self._event(f"node {m.node_id[:8]} ({m.address}) {'lost' if was == 'live' else 'failed'}"
                    f": {why}; {len(m.in_flight)} rollout(s) in flight retried elsewhere")

    @staticmethod
    def _kill(m: _Member) -> None:
        import ray

        for h in m.handles:
            with contextlib.suppress(Exception):  # dead already, or its node is gone
                ray.kill(h, no_restart=True)

    def _event(self, text: str) -> None:
        log.warning("fleet: %s", text)
        self.stats.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    # -- fleet view -----------------------------------------------------------------------------------
    def _sample(self) -> None:
        """Ask every live member for its load; one that has not answered the last ask (busy, or
        its node going) is not asked again, and the view keeps its last sample."""
        for m in self._live():
            if m.sampling is None or m.sampling.done():
                m.sampling = self._spawn_task(self._sample_member(m))

    async def _sample_member(self, m: _Member) -> None:
        from ray.exceptions import RayError, RayTaskError

        try:
            env, *engines = await asyncio.gather(
                m.env.stats.remote(), *(lane.replica.stats.remote() for lane in m.lanes))
        except RayTaskError as e:  # our code raised on a live node: a bug, not a lost node
            log.error("fleet: node %s could not report its load: %s", m.node_id[:8],
                      e.as_instanceof_cause())
            return
        except RayError as e:
            self._lose(m, f"{type(e).__name__} while sampling its load")
            return
        m.env_stats = env
        for lane, st in zip(m.lanes, engines, strict=True):
            before = lane.stats
            if before:
                dt = st["time"] - before["time"]
                lane.tokens_per_s = (st["generated_tokens"] - before["generated_tokens"]) / dt \
                    if dt > 0 else lane.tokens_per_s
            lane.stats = st

    def view(self) -> FleetSnapshot:
        """The fleet now, as the dashboard shows it."""
        nodes = []
        for node_id, n in sorted(self._nodes.items()):
            m = self.members.get(node_id)
            state = m.state if m else ("idle" if n["Alive"] else "down")
            engines = tuple(EngineView(
                lane.index, int(lane.stats.get("in_flight", 0)),
                int(lane.stats.get("tokens_in_flight", 0)), round(lane.tokens_per_s, 1),
                int(lane.stats.get("generated_tokens", 0)),
                int(lane.stats.get("policy_version", -1)), lane.open,
                int(lane.stats.get("reused_group_tokens", 0))) for lane in m.lanes) \
                if m else ()
            nodes.append(NodeView(
                node_id, str(n.get("NodeManagerAddress", "")), state,
                {k: float(v) for k, v in n.get("Resources", {}).items()
                 if not k.startswith("node:") and k not in ("memory", "object_store_memory")},
                dict(m.env_stats) if m else {}, len(m.in_flight) if m else 0, engines,
                round(time.monotonic() - m.since, 1) if m and m.state == "live" else 0.0))
        return FleetSnapshot(time.time(), self.cfg.address or "(this machine)", self.version,
                             tuple(nodes), self.stats.members_started, self.stats.members_lost,
                             len(self.stats.lost_attempts), tuple(self.stats.events))
