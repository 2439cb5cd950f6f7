"""The Ray fleet on a real three-node cluster on this machine: a head (the trainer, no CPUs for
rollouts) and two worker raylets started as Ray starts them (``ray.cluster_utils.Cluster``, on
loopback), not ``local_mode``. The training loop runs on the fleet; a worker node is killed
mid-run and another joins: no group is lost or trained twice, no rollout cut off by the kill is
scored, and the joining node gets groups. The dashboard's fleet view shows what happened."""

import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest
import ray
import torch
from ray.cluster_utils import Cluster
from starlette.testclient import TestClient
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.dashboard.app import DashboardConfig, create_app
from looprl.fleet.config import FleetConfig, FleetExperimental
from looprl.fleet.ray_fleet import MemberSpec, RayFleet, _Member
from looprl.harness.agent import AgentConfig
from looprl.models.loading import save_model
from looprl.models.tokenizer import build_tokenizer
from looprl.rewards.composite import RewardConfig, reward_metrics
from looprl.rewards.tests import pytest_command
from looprl.rollout.config import RolloutConfig
from looprl.rollout.runner import RolloutRunner
from looprl.trainer.batch import Credit
from looprl.trainer.config import GRPOConfig, GRPOExperimental, LoopConfig, LoopExperimental
from looprl.trainer.grpo import GRPOLoop
from looprl.trainer.losses import LossParams
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOStep
from looprl.types import Grader, Task, Trajectory
from looprl.weights.store import LocalWeightStore

pytestmark = [pytest.mark.needs_bwrap, pytest.mark.slow]
VENV = str(Path(sys.executable).parent.parent)
IP = "127.0.0.2"  # loopback; Ray rewrites 127.0.0.1 to the machine's routable address
ROLLOUT = RolloutConfig(group_size=2, max_in_flight=4,
                        agent=AgentConfig(max_turns=2, max_new_tokens=16, context_window=16384))


def _tasks(root: Path, n: int, prefix: str = "calc", test_s: float = 0.0) -> list[Task]:
    """``n`` tasks on one repository; its test takes ``test_s`` seconds (so a rollout is still in
    flight when a node is killed a moment after it was seen busy)."""
    repo = root / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text(
        f"import time\nfrom calc import add\n\ndef test_add():\n    time.sleep({test_s})\n"
        "    assert add(2, 3) == 5\n")
    grader = Grader(pytest_command(), ("test_calc.py::test_add",), (), ("test_calc.py",), timeout_s=60)
    return [Task(f"{prefix}-{i}", str(repo), "add(2, 3) should be 5", grader, VENV)
            for i in range(n)]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": IP, "include_dashboard": False,
        # a killed node is declared dead after ~2 s instead of Ray's default ~15 s
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4,
                           "health_check_initial_delay_ms": 0}})
    try:
        for _ in range(2):
            c.add_node(num_cpus=1, node_ip_address=IP)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _trained(run_dir: Path) -> list[Trajectory]:
    lines = (run_dir / "trajectories" / "train.jsonl").read_text().splitlines()
    return [Trajectory.from_json(line) for line in lines]


def test_training_on_the_fleet_survives_a_node_kill_and_takes_a_joining_node(cluster, tmp_path):
    tok = build_tokenizer(None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384))
    save_model(model, tok, tmp_path / "model")
    run_dir, weights = tmp_path / "run", tmp_path / "weights"
    # a rollout's grading lasts 3 s: the node seen with one in flight is killed inside it (with
    # a fast test a rollout seen in flight could finish before the kill landed: nothing was cut)
    tasks = _tasks(tmp_path, 10, test_s=3.0)
    workers = {n.node_id: n for n in cluster.worker_nodes}
    cfg = FleetConfig(backend="ray", address=cluster.address, experimental=FleetExperimental(
        node_ip=IP, min_nodes=2, poll_s=0.5))
    spec = MemberSpec(str(tmp_path / "model"), tok, str(weights), ROLLOUT, RewardConfig())
    kill: dict[str, object] = {}

    async def kill_then_join(fleet: RayFleet, loop: GRPOLoop, run: asyncio.Task) -> None:
        """After the first step, kill a worker that has rollouts in flight; a new one joins."""
        while not run.done():
            busy = [m for m in fleet.members.values() if m.in_flight and m.state == "live"]
            if loop.stats.steps >= 1 and busy:
                break
            await asyncio.sleep(0.02)
        else:
            return  # the run ended first: nothing was killed (asserted below)
        victim = workers[busy[0].node_id]
        kill["node"] = victim.node_id
        await asyncio.to_thread(cluster.remove_node, victim, False)  # SIGKILL, no goodbye
        kill["t"] = time.monotonic()
        # Ray starts a node from the main thread only (signal handlers): the loop waits meanwhile
        kill["joined"] = cluster.add_node(num_cpus=1, node_ip_address=IP).node_id

    async def main():
        fleet = await RayFleet.start(cfg, spec, snapshot=run_dir / "fleet.json")
        try:
            assert len(fleet.members) == 2, "each worker hosts a member; the 0-CPU head none"
            step = GRPOStep(model, GRPOConfig(lr=1e-3, experimental=GRPOExperimental(
                objective=LossParams(norm_tokens=32), credit=Credit(skip_zero_variance=False))),
                            pad_id=tok.pad_token_id)
            loop = GRPOLoop(step, fleet, RolloutRunner.over(fleet, ROLLOUT), TaskSampler(tasks),
                            LoopConfig(groups_per_step=2, experimental=LoopExperimental(
                                max_staleness=100, queue_size=2)),
                            store=LocalWeightStore(str(weights)), run_dir=run_dir,
                            batch_metrics=reward_metrics)
            run = asyncio.create_task(loop.run())
            await kill_then_join(fleet, loop, run)
            stats = await run
            # the node that joined mid-run comes up and takes new groups
            deadline = time.monotonic() + cfg.experimental.start_timeout_s
            while "joined" in kill and kill["joined"] not in {m.node_id for m in fleet._live()}:
                assert time.monotonic() < deadline, list(fleet.stats.events)
                await asyncio.sleep(0.2)
            extra = [r async for r in RolloutRunner.over(fleet, ROLLOUT).run(
                _tasks(tmp_path, 4, prefix="more"))]
            await asyncio.sleep(2 * cfg.experimental.poll_s)  # one more snapshot of the fleet as it is now
            return stats, loop.version, fleet.view(), list(fleet.stats.lost_attempts), extra
        finally:
            await fleet.close()

    stats, version, view, lost, extra = asyncio.run(main())

    # every task trained exactly once, none lost with the node
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained_tasks = [t for r in rows for t in r["tasks"]]
    assert sorted(trained_tasks) == sorted(t.id for t in tasks)
    assert stats.groups_trained == 10 and stats.groups_dropped == 0
    assert "node" in kill, "the run ended before a node could be killed mid-run"
    # the kill cut rollouts off; they were retried elsewhere, never scored
    assert lost
    trajs = _trained(run_dir)
    assert not {t.id for t in trajs} & set(lost)
    assert all(not t.is_infra_error and t.reward is not None for t in trajs)
    # a group's rollouts ran on one node (one replica: its prompt KV computed once); a group the
    # kill cut into kept what had finished on the victim and ran its retries on one other node
    by_group: dict[str, set[str]] = {}
    for t in trajs:
        by_group.setdefault(t.group_id, set()).add(t.metadata["node"])
    cut = {x.rsplit("/", 1)[0] for x in lost}  # attempt ids are "<group>/<index>.<retry>"
    assert cut <= set(by_group), (cut, set(by_group))
    assert all(len(nodes - {kill["node"]} if g in cut else nodes) == 1
               for g, nodes in by_group.items()), (by_group, cut, kill["node"])
    assert len(set().union(*by_group.values())) >= 2, "groups were spread over both workers"
    # the joining node got work; every live replica serves the last published version
    assert kill["joined"] in {t.metadata["node"] for r in extra for t in r.group.trajectories}
    live = [n for n in view.nodes if n.state == "live"]
    assert {n.node_id for n in live} == set(workers) - {kill["node"]} | {kill["joined"]}
    assert all(e.policy_version == version == stats.steps for n in live for e in n.engines)
    assert any(e.reused_group_tokens > 0 for n in live for e in n.engines)
    assert view.members_lost == 1 and view.attempts_lost == len(lost)

    # the dashboard's fleet view shows the dead node, the live ones and what happened
    page = TestClient(create_app(DashboardConfig(runs=(run_dir,), refresh_s=0))).get("/fleet")
    assert page.status_code == 200
    html = page.text
    assert f"{kill['node'][:8]}</span></td><td>{IP}</td><td>down" in html
    assert f"{kill['joined'][:8]}</span></td><td>{IP}</td><td>live" in html
    assert f"node {kill['node'][:8]} ({IP}) lost" in html


def test_injected_faults_on_the_fleet_land_in_their_classes(cluster, tmp_path):
    """Node losses (the driver kills a member's actors), failed weight loads on the replicas and
    sandbox, engine and grader failures on the nodes' environment servers, all injected: every
    task is trained once, no injected failure is scored, and the trainer's ledger holds exactly
    what the injectors' books (the nodes' reported back with their results) say settled."""
    from looprl import faults
    from looprl.faults import FaultInjector, FaultsConfig, InfraLedger
    from looprl.weights.retry import RetryingStore

    tok = build_tokenizer(None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384))
    save_model(model, tok, tmp_path / "model")
    run_dir, weights = tmp_path / "run", tmp_path / "weights"
    tasks = _tasks(tmp_path, 6)
    # seed 33: the driver's node-loss draws hit the 3rd attempt and then not before the 55th,
    # so one node is lost (each loss costs a model load on a fresh actor). Which member the loss
    # hits is a matter of timing, so the rates are such that either survivor's draws fire: the
    # first pull of each of the first three members fails once or twice at 0.6 (a pull is retried
    # up to 5 times; none of them fails 5 in a row within its first 7 pulls), and each of the
    # first two members' environment servers fails within its first 4 draws at 0.2
    rates = FaultsConfig({"node_lost": 0.08, "weight_read": 0.6, "sandbox_create": 0.2,
                          "engine_error": 0.2, "grader_crash": 0.2}, seed=33)
    cfg = FleetConfig(backend="ray", address=cluster.address, experimental=FleetExperimental(
        node_ip=IP, min_nodes=2, poll_s=0.5))
    spec = MemberSpec(str(tmp_path / "model"), tok, str(weights), ROLLOUT, RewardConfig(),
                      faults=rates)
    rollout = dataclasses.replace(ROLLOUT, experimental=dataclasses.replace(
        ROLLOUT.experimental, max_infra_retries=6))
    inj = FaultInjector(rates)
    ledger = InfraLedger()

    async def main():
        fleet = await RayFleet.start(cfg, spec, ledger=ledger)
        try:
            step = GRPOStep(model, GRPOConfig(lr=1e-3, experimental=GRPOExperimental(
                objective=LossParams(norm_tokens=32), credit=Credit(skip_zero_variance=False))),
                            pad_id=tok.pad_token_id)
            loop = GRPOLoop(step, fleet, RolloutRunner.over(fleet, rollout, ledger=ledger),
                            TaskSampler(tasks),
                            LoopConfig(groups_per_step=2, experimental=LoopExperimental(
                                max_staleness=100, queue_size=2)),
                            store=RetryingStore(LocalWeightStore(str(weights)), ledger=ledger),
                            run_dir=run_dir, batch_metrics=reward_metrics, infra=ledger)
            return await loop.run(), fleet.stats.members_lost
        finally:
            await fleet.close()

    before = faults.install(inj)
    try:
        stats, members_lost = asyncio.run(main())
    finally:
        faults.install(before)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(t for r in rows for t in r["tasks"]) == sorted(t.id for t in tasks)
    books = inj.books()
    failed = {k: n for k, n in ledger.counts().items() if n}
    assert failed == books["settled"], (failed, books)
    assert failed.get("node_lost", 0) >= members_lost >= 1, (failed, members_lost)
    assert failed.get("weight_read", 0) >= 1 and len(failed) >= 3, failed
    text = (run_dir / "trajectories" / "train.jsonl").read_text()
    assert faults.MARK not in text and all(not t.is_infra_error for t in _trained(run_dir))


def test_a_fleet_without_an_address_starts_a_ray_of_its_own(cluster, tmp_path, monkeypatch):
    """fleet.address="" is a one-node Ray of the run's own, even while another cluster runs on
    the machine (left to itself ``ray.init()`` joins the one started last, here the module's
    cluster, and the run would die with it)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fleet = RayFleet(FleetConfig(backend="ray", experimental=FleetExperimental(node_ip=IP)),
                     MemberSpec(str(tmp_path), None, str(tmp_path), ROLLOUT, RewardConfig()))
    fleet._connect()
    try:
        ours = {n["NodeID"] for n in ray.nodes()}
        assert len(ours) == 1 and not ours & {n.node_id for n in cluster.list_all_nodes()}
    finally:
        ray.shutdown()


def test_a_load_report_our_code_fails_on_keeps_the_node(tmp_path):
    """A member whose load report raises in looprl's own code (a bug on a live node) stays in
    the fleet, logged as an error: it is not a node loss, which would count the bug as
    infrastructure and cut its rollouts off."""
    from ray.exceptions import RayTaskError

    class Broken:
        def remote(self):
            async def fail():
                raise RayTaskError("stats", "Traceback: KeyError: 'time'", KeyError("time"))
            return fail()

    fleet = RayFleet(FleetConfig(backend="ray"), MemberSpec(str(tmp_path), None, str(tmp_path),
                                                             ROLLOUT, RewardConfig()))
    env = type("Env", (), {"stats": Broken()})()
    member = fleet.members["n1"] = _Member("n1", "127.0.0.2", env, state="live")
    asyncio.run(fleet._sample_member(member))
    assert fleet.members["n1"] is member and member.state == "live"
    assert fleet.stats.members_lost == 0 and not fleet.stats.events


def test_a_config_error_on_a_node_stops_the_start_at_once(tmp_path, monkeypatch):
    """A member that cannot start for a config error (a model path its node cannot read) fails
    the same way on every try: the fleet's start stops with it instead of retrying it until
    ``start_timeout_s``."""
    from ray.exceptions import RayTaskError

    from looprl.errors import ConfigError

    missing = ConfigError("no HF model at runs/r/model_start (config.json missing)")

    class Failing:
        def remote(self, version):
            async def fail():
                raise RayTaskError("start", "Traceback: ConfigError", missing)
            return fail()

    fleet = RayFleet(FleetConfig(backend="ray"), MemberSpec(str(tmp_path), None, str(tmp_path),
                                                             ROLLOUT, RewardConfig()))
    lane = type("Lane", (), {"replica": type("Replica", (), {"start": Failing()})()})()
    member = fleet.members["n1"] = _Member("n1", "127.0.0.2", None, lanes=[lane])
    monkeypatch.setattr(RayFleet, "_kill", staticmethod(lambda m: None))  # no actors to kill
    asyncio.run(fleet._bring_up(member))
    assert "n1" not in fleet.members and "no HF model at runs/r/model_start" in fleet._fatal
    monkeypatch.setattr(RayFleet, "_connect", lambda self: None)
    monkeypatch.setattr(RayFleet, "_watch", lambda self: self._bring_up(
        self.members.setdefault("n1", _Member("n1", "127.0.0.2", None, lanes=[lane]))))
    monkeypatch.setattr(RayFleet, "close", lambda self: asyncio.sleep(0))
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="could not start its member: no HF model.*not retried"):
        asyncio.run(RayFleet.start(FleetConfig(backend="ray", experimental=FleetExperimental(
            start_timeout_s=30)), fleet.spec))
    assert time.monotonic() - t0 < 10  # not after fleet.experimental.start_timeout_s

