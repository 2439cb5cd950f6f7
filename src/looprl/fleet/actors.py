"""The two Ray actors a fleet node runs: an engine replica and an environment server.

    replica = ray.remote(EngineReplica).options(...).remote(model_dir, "torch", weights_url, 1)
    env = ray.remote(EnvServer).options(...).remote([replica], tokenizer, rollout, reward, 16)
    await replica.start.remote(version=3); await env.start.remote()
    outcome = await env.run.remote(task, group_id, traj_id, 0)     # AttemptOutcome

``EnvServer.run`` is one rollout attempt from start to score on its node: a sandbox from the node's
``SandboxPool``, the harness (``LocalExecutor``, the code the in-process runner uses), the engine
replica named by ``lane``, grading in the node's sandboxes. The sandbox never leaves the node and
only the finished ``Trajectory`` travels back to the driver. The driver (``ray_fleet.RayFleet``)
creates both actors pinned to their node; nothing here imports Ray at module level, so the classes
load in any worker that unpickles them.

Faults (``looprl.faults``): with a ``faults`` config each actor installs an injector for the
boundaries it owns (the environment server: sandboxes, exec, grading, its engine client, an HTTP
env server; a replica: weight loads), and what it injected into a call travels back with the
call's result (``AttemptOutcome.injected``, ``Pulled.injected``), for the trainer's books. A
replica's failed loads are retried (``weights.retry``) and reported (``Pulled.read_failures``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from looprl import faults
from looprl.chat import ChatFormat
from looprl.errors import InfraKind, PolicyError
from looprl.faults import FaultsConfig
from looprl.protocols import Engine
from looprl.rewards.composite import RewardConfig
from looprl.rollout.config import RolloutConfig
from looprl.rollout.runner import LocalExecutor
from looprl.types import Generation, SamplingParams, Task, Trajectory


@dataclass(frozen=True)
class AttemptOutcome:
    """What a node sends back for one attempt."""

    trajectory: Trajectory
    replica_lost: bool = False
    """The engine replica died during the attempt (its node's member must be replaced)."""
    injected: dict[str, int] = field(default_factory=dict)
    """Failures the node's fault injector injected into this attempt, by class."""


@dataclass(frozen=True)
class Pulled:
    """What a replica's ``start`` or ``pull`` did."""

    version: int
    """The version it serves now."""
    read_failures: int = 0
    """Loads from the store that failed and were retried."""
    injected: dict[str, int] = field(default_factory=dict)
    """Failures its fault injector injected into those loads, by class."""


ENV_FAULTS = (InfraKind.SANDBOX_CREATE, InfraKind.EXEC_TIMEOUT, InfraKind.GRADER_CRASH,
              InfraKind.ENGINE_ERROR, InfraKind.ENV_SERVER_5XX, InfraKind.CONNECTION_DROPPED)
"""The classes a node's environment server injects (the rest are the driver's or a replica's)."""
REPLICA_FAULTS = (InfraKind.WEIGHT_READ,)


def _install(cfg: FaultsConfig | None, kinds: tuple[InfraKind, ...], role: str) -> None:
    if cfg is not None and cfg.only(kinds).active:
        faults.install(faults.FaultInjector(cfg.only(kinds), role=role))


class EngineReplica:
    """One rollout engine (``make_engine``) on a node; pulls weight versions from the store."""

    def __init__(self, model_dir: str, engine: str, weights_url: str, threads: int,
                 cuda: bool = False, faults_cfg: FaultsConfig | None = None,
                 weights_options: dict[str, Any] | None = None,
                 engine_options: dict[str, Any] | None = None) -> None:
        torch.set_num_threads(threads)  # this process's decode; the trainer's process keeps its own
        _install(faults_cfg, REPLICA_FAULTS, "replica")
        self.model_dir, self.engine_name, self.cuda, self.threads = model_dir, engine, cuda, threads
        self.weights_url, self.weights_options = weights_url, weights_options or {}
        self.engine_options = engine_options or {}
        self.store: Any = None
        self.engine: Any = None
        self.in_flight = 0
        self.tokens_in_flight = 0
        self.generated_tokens = 0
        self.requests = 0

    async def start(self, version: int) -> Pulled:
        """Load the starting checkpoint, then ``version`` from the store when it is past the
        start (a node joining a running fleet, a resumed run)."""
        if self.engine_name == "torch":
            from looprl.inference import TorchEngine
            from looprl.models.loading import load_model

            lm = load_model(self.model_dir)
            model = cast(Any, lm.model).to("cuda") if self.cuda else lm.model  # (HF types .to oddly)
            self.engine = TorchEngine(model, lm.tokenizer)
        else:  # vLLM or a plugin loads the checkpoint itself, as ``looprl train`` builds it
            from looprl.inference import make_engine

            # vLLM's worker process (`make vllm`'s venv) runs ``threads`` OpenMP threads; its
            # start-up takes minutes on a small CPU node: off the actor's loop, so the driver's
            # load samples are answered meanwhile
            kwargs = {"threads": self.threads} if self.engine_name == "vllm" else {}
            self.engine = await asyncio.to_thread(make_engine, self.engine_name,
                                                  model_path=self.model_dir,
                                                  **{**kwargs, **self.engine_options})
        return await self.pull(version) if version > 0 else Pulled(0)

    async def pull(self, version: int) -> Pulled:
        """Apply ``version`` from the weight store between decode steps; running rollouts go on
        with it. Serves an older full snapshot when ``version`` is damaged (``WeightStore.load``
        falls back and says so in the log); a load that fails is retried."""
        from looprl.weights.retry import RetryingStore
        from looprl.weights.store import FsspecWeightStore

        if self.store is None:  # one reader: it keeps the last version's bits for the next delta
            self.store = RetryingStore(FsspecWeightStore(self.weights_url,
                                                         storage_options=self.weights_options))
        before = self.store.failures[InfraKind.WEIGHT_READ.value]
        with faults.scope(f"pull:{id(self)}:{version}:{time.monotonic_ns()}") as injected:
            loaded = await asyncio.to_thread(self.store.load, version)
        await self.engine.update_weights(loaded.state_dict, loaded.version)
        return Pulled(loaded.version, self.store.failures[InfraKind.WEIGHT_READ.value] - before,
                      dict(injected))

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       session_id: str | None, group_id: str | None) -> Generation:
        self.in_flight += 1
        self.requests += 1
        self.tokens_in_flight += len(prompt_ids)
        try:
            gen = await self.engine.generate(prompt_ids, params, session_id=session_id,
                                             group_id=group_id)
        finally:
            self.in_flight -= 1
            self.tokens_in_flight -= len(prompt_ids)
        self.generated_tokens += len(gen.token_ids)
        return gen

    async def release(self, session_id: str) -> None:
        await self.engine.release(session_id)

    def stats(self) -> dict[str, float]:
        """Load now (requests and prompt tokens in flight) and counters (the driver turns
        ``generated_tokens`` into tokens/s between samples)."""
        reuse = getattr(self.engine, "stats", None)  # TorchEngine counts its KV reuse
        return {"in_flight": self.in_flight, "tokens_in_flight": self.tokens_in_flight,
                "generated_tokens": self.generated_tokens, "requests": self.requests,
                "reused_group_tokens": getattr(reuse, "reused_group_tokens", 0),
                "policy_version": self.engine.policy_version if self.engine else -1,
                "time": time.time(), **self._engine_metrics()}

    def _engine_metrics(self) -> dict[str, float]:
        """The engine's own counters (``engine/...``: ``TorchEngine.metrics``,
        ``VLLMEngine.metrics``), for the driver's view."""
        metrics = getattr(self.engine, "metrics", None)
        return metrics() if callable(metrics) else {}


class ReplicaClient:
    """The generating side of the ``Engine`` protocol (generate, release) over a replica's actor
    handle, for the harness on the replica's node; weights reach a replica from the store, never
    through here. A replica that dies fails the call as ``PolicyError`` (infrastructure: the
    trajectory is retried elsewhere, never scored) and marks the replica ``lost``."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.lost = False

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation:
        from ray.exceptions import RayActorError

        faults.maybe_raise(InfraKind.ENGINE_ERROR, "ReplicaClient.generate")
        try:
            return await self.handle.generate.remote(prompt_ids, params, session_id, group_id)
        except RayActorError as e:
            self.lost = True
            raise PolicyError(f"engine replica died: {type(e).__name__}") from e

    async def release(self, session_id: str) -> None:
        from ray.exceptions import RayActorError

        try:
            await self.handle.release.remote(session_id)
        except RayActorError:
            self.lost = True


class EnvServer:
    """A node's environment server: its sandbox pool and the harness of every attempt placed on
    the node; attempts reach the node's replicas through ``ReplicaClient``."""

    def __init__(self, replicas: list[Any], tokenizer: Any, rollout: RolloutConfig,
                 reward: RewardConfig, sandboxes: int, *, faults_cfg: FaultsConfig | None = None,
                 http_roots: tuple[str, ...] | None = None) -> None:
        self.clients = [ReplicaClient(h) for h in replicas]
        self.tokenizer, self.rollout, self.reward, self.sandboxes = (tokenizer, rollout, reward,
                                                                     sandboxes)
        self.http_roots = http_roots
        """With ``fleet.experimental.sandboxes = "http"``: the roots its HTTP env server allows."""
        _install(faults_cfg, ENV_FAULTS, "env")
        self._served = contextlib.ExitStack()
        self.pool: Any = None
        self.executors: list[LocalExecutor] = []
        self.node_id = ""
        self.in_flight = 0
        self.finished = 0

    async def start(self) -> None:
        """The pool and the scorer live on this actor's event loop, so they are made here."""
        import ray

        from looprl.rollout.score import make_scorer
        from looprl.sandbox import SandboxPool

        self.node_id = ray.get_runtime_context().get_node_id()
        if self.http_roots is not None:
            from looprl.sandbox.remote_pool import serving_roots

            self.pool = self._served.enter_context(serving_roots(self.http_roots, self.sandboxes))
        else:
            self.pool = SandboxPool(max_running=self.sandboxes)
        fmt, score = ChatFormat(self.tokenizer), make_scorer(self.reward)
        # a replica's weights arrive on its node: the harness only generates and releases here
        self.executors = [LocalExecutor(cast(Engine, c), fmt, self.pool, score, self.rollout)
                          for c in self.clients]

    async def run(self, task: Task, group_id: str, traj_id: str, lane: int) -> AttemptOutcome:
        self.in_flight += 1
        try:
            with faults.scope(traj_id) as injected:
                traj = await self.executors[lane].attempt(task, group_id, traj_id)
        finally:
            self.in_flight -= 1
        self.finished += 1
        # where it ran, for the trajectory viewer and for checking the routing
        traj = dataclasses.replace(traj, metadata={**traj.metadata, "node": self.node_id,
                                                   "replica": lane})
        return AttemptOutcome(traj, replica_lost=self.clients[lane].lost, injected=dict(injected))

    def stats(self) -> dict[str, float]:
        """The pool's sandboxes (busy, idle, queued, warm, ...) and rollouts on this node."""
        seen = self.pool.metrics() if self.pool is not None else None
        pool = seen.to_dict() if seen is not None else {}
        return {**pool, "rollouts_in_flight": self.in_flight, "rollouts_finished": self.finished}

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        await asyncio.to_thread(self._served.close)
