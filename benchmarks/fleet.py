"""Rollouts on a Ray fleet vs in-process, and a worker node killed mid-run.

    nice -n 15 .venv/bin/python benchmarks/fleet.py                  # ~10 min on 2 cores
    .venv/bin/python benchmarks/fleet.py --groups 8 --group-size 4 --kill-after 3

Every mode rolls out the same ``--groups`` groups (real tasks of ``--package``, cached under
LOOPRL_HOME; copies get distinct ids) with the same model (the default model of ``--size``) and
group size, through ``RolloutRunner`` — what ``GRPOLoop`` consumes — and ``make_scorer``
(hidden tests in sandboxes + the shaped reward):

- ``inprocess``: ``TorchEngine`` + ``SandboxPool`` in this process (``fleet.backend =
  "inprocess"``), torch on ``--threads`` threads as ``looprl train`` sets ``model.experimental.rl_threads``.
- ``ray_1node``: ``RayFleet`` on a one-node Ray this process starts (``ray.init``, as ``looprl
  train -o fleet.backend=ray`` does without an address): one engine replica (``--threads``
  threads) and one environment server in their own processes, this process the driver.
- ``ray_2nodes``: ``RayFleet`` on a cluster of a head with no CPUs (this driver) and two worker
  raylets of 1 CPU each (``ray.cluster_utils.Cluster`` on loopback): a replica and an environment
  server on each worker. On this one machine both workers share its cores.
- ``node_kill``: the same two workers; once ``--kill-after`` groups are out and a worker has
  rollouts in flight, it is SIGKILLed (raylet and all its processes).

Figures: ``groups_per_min`` counts groups out over the seconds from the first admission to the
last group (the fleet's start-up, ``startup_s``, is excluded: it is paid once per run).
``overhead_ratio`` = ray_1node / inprocess. ``node_kill_lost_groups``: tasks whose group never
came out complete. ``node_kill_scored_infra``: trajectories of the groups that came out that are
infrastructure failures or attempts cut off by the kill (``RayFleet.stats.lost_attempts``) —
the runner must have retried those elsewhere, never scored them. ``recovery_s``: from the kill
until the last group that had a rollout on the killed node came out complete (Ray's node-death
detection is set to ~2 s here, as in the tests; Ray's default is ~15 s). The last line is
``groups_per_min_inprocess=… … recovery_s=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sandbox import cpu_model  # benchmarks/sandbox.py: the host CPU named in the summary

from looprl.chat import ChatFormat
from looprl.fleet.config import FleetConfig, FleetExperimental
from looprl.fleet.ray_fleet import MemberSpec, RayFleet
from looprl.harness.agent import AgentConfig
from looprl.inference import TorchEngine
from looprl.models.loading import load_model
from looprl.models.tiny import default_model_dir
from looprl.rewards.composite import RewardConfig
from looprl.rollout.config import RolloutConfig
from looprl.rollout.runner import RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.sandbox import SandboxPool
from looprl.types import GroupResult, Task

IP = "127.0.0.2"  # loopback; Ray rewrites 127.0.0.1 to the machine's routable address
FAST_DEATH = {"health_check_period_ms": 500, "health_check_failure_threshold": 4,
              "health_check_initial_delay_ms": 0}


def real_tasks(spec: str, n: int) -> list[Task]:
    """``n`` tasks cycling over the real tasks of ``spec`` (distinct ids), built with the config
    ``benchmarks/async.py`` uses, so both read one cached task set."""
    from looprl.tasks.build import BuildConfig, build_package_tasks
    from looprl.tasks.sources import fetch_package

    base = build_package_tasks(fetch_package(spec), BuildConfig(max_tasks=20))
    return [dataclasses.replace(base[i % len(base)], id=f"{base[i % len(base)].id}~{i}")
            for i in range(n)]


@dataclass(frozen=True)
class Mode:
    name: str
    groups_out: int
    wall_s: float
    startup_s: float = 0.0

    @property
    def groups_per_min(self) -> float:
        return 60.0 * self.groups_out / max(self.wall_s, 1e-9)


async def rollout(runner: RolloutRunner, tasks: list[Task], on_result: Any = None
                  ) -> tuple[list[tuple[float, GroupResult]], float]:
    """Every group, with the time it came out; wall seconds from the first admission."""
    t0 = time.monotonic()
    out = []
    async for r in runner.run(tasks):
        out.append((time.monotonic(), r))
        if on_result is not None:
            on_result(len(out))
    return out, time.monotonic() - t0


def rollout_cfg(args: argparse.Namespace) -> RolloutConfig:
    return RolloutConfig(group_size=args.group_size, max_in_flight=args.max_in_flight,
                         agent=AgentConfig(max_turns=args.max_turns,
                                           max_new_tokens=args.max_new_tokens,
                                           max_total_new_tokens=args.max_new_tokens * args.max_turns))


async def run_inprocess(args: argparse.Namespace, model_dir: Path, tasks: list[Task]) -> Mode:
    torch.set_num_threads(args.threads)
    lm = load_model(model_dir)
    engine = TorchEngine(copy.deepcopy(lm.model), lm.tokenizer)
    pool = SandboxPool(max_running=args.max_in_flight)
    try:
        runner = RolloutRunner(engine, ChatFormat(lm.tokenizer), pool, make_scorer(RewardConfig()),
                               rollout_cfg(args))
        out, wall = await rollout(runner, tasks)
    finally:
        await pool.close()
        engine.close()
    return Mode("inprocess", sum(r.group is not None for _, r in out), wall)


def fleet_cfg(args: argparse.Namespace, address: str, nodes: int) -> FleetConfig:
    return FleetConfig(backend="ray", address=address, experimental=FleetExperimental(
        node_ip=IP, min_nodes=nodes, engine_threads=args.threads,
        sandboxes_per_node=args.max_in_flight, poll_s=1.0))


async def run_fleet(args: argparse.Namespace, name: str, cfg: FleetConfig, spec: MemberSpec,
                    tasks: list[Task]) -> Mode:
    t0 = time.monotonic()
    fleet = await RayFleet.start(cfg, spec)
    startup = time.monotonic() - t0
    try:
        out, wall = await rollout(RolloutRunner.over(fleet, spec.rollout), tasks)
    finally:
        await fleet.close()
    return Mode(name, sum(r.group is not None for _, r in out), wall, startup)


@dataclass(frozen=True)
class KillResult:
    lost_groups: int
    scored_infra: int
    recovery_s: float
    lost_attempts: int
    groups_out: int


async def run_kill(args: argparse.Namespace, cluster: Any, cfg: FleetConfig, spec: MemberSpec,
                   tasks: list[Task]) -> KillResult:
    fleet = await RayFleet.start(cfg, spec)
    workers = {n.node_id: n for n in cluster.worker_nodes}
    done = {"n": 0}
    killed: dict[str, float] = {}

    async def killer(run: asyncio.Task) -> None:
        while not run.done():
            busy = [m for m in fleet._live() if m.in_flight and m.node_id in workers]
            if done["n"] >= args.kill_after and busy:
                victim = max(busy, key=lambda m: len(m.in_flight))
                print(f"  killing node {victim.node_id[:8]} with {len(victim.in_flight)} "
                      "rollouts in flight", flush=True)
                t = time.monotonic()
                await asyncio.to_thread(cluster.remove_node, workers[victim.node_id], False)
                killed["t"] = t
                return
            await asyncio.sleep(0.02)

    try:
        run = asyncio.create_task(rollout(RolloutRunner.over(fleet, spec.rollout), tasks,
                                          lambda n: done.__setitem__("n", n)))
        await killer(run)
        out, _ = await run
        lost = set(fleet.stats.lost_attempts)
    finally:
        await fleet.close()
    assert "t" in killed, "the run ended before a node could be killed; raise --groups"
    complete = {r.task.id for _, r in out if r.group is not None}
    trajs = [t for _, r in out if r.group is not None for t in r.group.trajectories]
    scored_infra = sum(t.is_infra_error or t.id in lost for t in trajs)
    hit_groups = {a.rsplit("/", 1)[0] for a in lost}
    hit_done = [t for t, r in out if r.group is not None and r.group.group_id in hit_groups]
    recovery = max(hit_done) - killed["t"] if hit_done else float("nan")
    return KillResult(len(tasks) - len(complete), scored_infra, recovery, len(lost), len(out))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-in-flight", type=int, default=8)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1, help="torch threads of each engine")
    p.add_argument("--size", default="tiny", help="default model size (looprl.models.tiny.SIZES)")
    p.add_argument("--package", default="inflection==0.5.1")
    p.add_argument("--kill-after", type=int, default=3, help="groups out before the kill")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import ray
    from ray.cluster_utils import Cluster

    model_dir = default_model_dir(args.size)
    tasks = real_tasks(args.package, args.groups)
    # nothing is published here (no training): every replica serves the starting weights
    weights = tempfile.TemporaryDirectory(prefix="fleet-bench-weights-")
    spec = MemberSpec(str(model_dir), load_model(model_dir).tokenizer, weights.name,
                      rollout_cfg(args), RewardConfig())
    print(f"{len(tasks)} groups of {args.group_size}, {args.max_in_flight} rollouts in flight, "
          f"model {args.size}, {args.threads} torch thread(s) per engine; {cpu_model()}", flush=True)

    inproc = asyncio.run(run_inprocess(args, model_dir, tasks))
    print(f"  inprocess: {inproc.groups_out} groups in {inproc.wall_s:.1f} s", flush=True)
    one = asyncio.run(run_fleet(args, "ray_1node", fleet_cfg(args, "", 1), spec, tasks))
    print(f"  ray_1node: {one.groups_out} groups in {one.wall_s:.1f} s "
          f"(start-up {one.startup_s:.1f} s)", flush=True)

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": IP, "include_dashboard": False,
        "_system_config": FAST_DEATH})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, node_ip_address=IP)
        two = asyncio.run(run_fleet(args, "ray_2nodes", fleet_cfg(args, cluster.address, 2),
                                    spec, tasks))
        print(f"  ray_2nodes: {two.groups_out} groups in {two.wall_s:.1f} s "
              f"(start-up {two.startup_s:.1f} s)", flush=True)
        kill = asyncio.run(run_kill(args, cluster, fleet_cfg(args, cluster.address, 2), spec,
                                    tasks))
        print(f"  node_kill: {kill.groups_out} groups out, {kill.lost_attempts} rollouts cut "
              "off and retried", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        weights.cleanup()
    ratio = one.groups_per_min / max(inproc.groups_per_min, 1e-9)
    print(f"groups_per_min_inprocess={inproc.groups_per_min:.2f} "
          f"groups_per_min_ray_1node={one.groups_per_min:.2f} "
          f"groups_per_min_ray_2nodes={two.groups_per_min:.2f} overhead_ratio={ratio:.2f} "
          f"node_kill_lost_groups={kill.lost_groups} node_kill_scored_infra={kill.scored_infra} "
          f"recovery_s={kill.recovery_s:.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
