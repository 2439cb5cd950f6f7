"""The fault injector's books and the run's ledger: injections settle with their attempt or are
cut off with it, survive a killed trainer, and the ledger's rows count each class and its rate."""

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from looprl import faults
from looprl.config import FieldError
from looprl.errors import (
    InfraKind,
    PolicyError,
    RewardError,
    SandboxError,
    ToolError,
    WeightStoreError,
    infra_kind,
)
from looprl.faults import FaultInjector, FaultsConfig, InfraLedger
from looprl.types import Counters, StopReason, Trajectory


@pytest.fixture
def injector():
    """Installs the injector a test builds (``injector(cfg, **kw)``) and removes it after."""
    before = faults.active()
    made: list[FaultInjector] = []

    def make(cfg: FaultsConfig, **kw) -> FaultInjector:
        inj = FaultInjector(cfg, **kw)
        faults.install(inj)
        made.append(inj)
        return inj

    yield make
    faults.install(before)


def _traj(kind: str = "") -> Trajectory:
    stop = StopReason.INFRA_ERROR if kind else StopReason.FINISHED
    return Trajectory("t", "g", (), (), Counters(), stop, infra_kind=kind)


def test_config_names_its_classes_and_rates():
    assert FaultsConfig().active is False
    cfg = FaultsConfig.parse("all=0.05,node_lost=0,seed=4")
    assert cfg.rate(InfraKind.SANDBOX_CREATE) == 0.05 and cfg.rate(InfraKind.NODE_LOST) == 0
    assert cfg.seed == 4 and cfg.only([InfraKind.WEIGHT_READ]).rates == {"weight_read": 0.05}
    for bad in ("all=2", "sandbox_lost=0.1", "all=nan", "all"):
        with pytest.raises(FieldError, match="rates"):
            FaultsConfig.parse(bad)


def test_errors_take_the_class_of_what_failed_first():
    assert infra_kind(WeightStoreError("gone")) == InfraKind.WEIGHT_READ
    assert infra_kind(WeightStoreError("x", kind=InfraKind.WEIGHT_WRITE)) == InfraKind.WEIGHT_WRITE
    try:
        try:
            raise SandboxError("pytest killed")
        except SandboxError as e:
            raise RewardError("grading failed in the sandbox") from e
    except RewardError as outer:
        assert infra_kind(outer) == InfraKind.SANDBOX_LOST
    try:
        try:
            raise ToolError("the model's path")  # not infrastructure: the wrapper's class stands
        except ToolError as e:
            raise RewardError("grader could not read it") from e
    except RewardError as outer:
        assert infra_kind(outer) == InfraKind.GRADER_CRASH
    assert infra_kind(ValueError("a bug")) == InfraKind.INTERNAL


def test_injected_errors_are_the_boundarys_own_and_marked(injector):
    injector(FaultsConfig({"all": 1.0}))
    for kind, cls in ((InfraKind.ENGINE_ERROR, PolicyError), (InfraKind.GRADER_CRASH, RewardError),
                      (InfraKind.EXEC_TIMEOUT, SandboxError)):
        with pytest.raises(cls, match=r"\[injected fault\]") as e:
            faults.maybe_raise(kind, "here")
        assert infra_kind(e.value) == kind


def test_no_injector_never_fires():
    before = faults.install(None)
    try:
        assert not any(faults.fires(k) for k in faults.INJECTABLE for _ in range(100))
    finally:
        faults.install(before)


def test_an_attempt_that_comes_back_settles_its_injections_one_cut_off_does_not(injector):
    inj = injector(FaultsConfig({"engine_error": 1.0}))

    async def attempt(i: int) -> None:
        with faults.scope(f"a{i}"):
            assert faults.fires(InfraKind.ENGINE_ERROR)
            await asyncio.sleep(0 if i == 0 else 10)

    async def main() -> None:
        done, slow = asyncio.create_task(attempt(0)), asyncio.create_task(attempt(1))
        await done
        await asyncio.sleep(0.01)
        assert inj.books()["open"] == {"engine_error": 1}
        slow.cancel()  # the run ended with this attempt in flight: nothing will observe it
        await asyncio.gather(slow, return_exceptions=True)

    asyncio.run(main())
    b = inj.books()
    assert b["injected"] == {"engine_error": 2} and b["open"] == {}
    assert b["cut_off"] == {"engine_error": 1} and b["settled"] == {"engine_error": 1}


def test_threads_and_tagged_handlers_count_in_the_attempt(injector):
    inj = injector(FaultsConfig({"weight_read": 1.0, "exec_timeout": 1.0}))

    async def main() -> None:
        with faults.scope("a"):
            await asyncio.to_thread(faults.fires, InfraKind.WEIGHT_READ)
            await asyncio.sleep(0.01)
            assert inj.books()["open"] == {"weight_read": 1}

        def server_thread() -> None:  # an env server of this process serving attempt "b"
            with faults.tagged("b"):
                faults.fires(InfraKind.EXEC_TIMEOUT)

        with faults.scope("b"):
            await asyncio.to_thread(server_thread)
            assert inj.books()["open"] == {"exec_timeout": 1}

    asyncio.run(main())
    assert inj.books()["settled"] == {"exec_timeout": 1, "weight_read": 1}


def test_a_killed_trainers_books_and_ledger_continue_and_count_the_kill(tmp_path):
    """A child process counts, writes a row, and SIGKILLs itself at the row (process_killed at
    rate 1) with an attempt open; the next life continues both books and counts the kill once."""
    script = textwrap.dedent(f"""
        import asyncio
        from pathlib import Path
        from looprl import faults
        from looprl.faults import FaultInjector, FaultsConfig, InfraLedger
        from looprl.types import Counters, StopReason, Trajectory
        run = Path({str(tmp_path)!r})
        faults.install(FaultInjector(FaultsConfig({{"sandbox_create": 1.0, "process_killed": 1.0}}),
                                     books=run / "faults.jsonl"))
        ledger = InfraLedger(run / "infra.json")
        async def main():
            with faults.scope("done"):
                faults.fires(faults.InfraKind.SANDBOX_CREATE)
                ledger.attempt(Trajectory("t", "g", (), (), Counters(), StopReason.INFRA_ERROR,
                                          infra_kind="sandbox_create"))
            async def hung():
                with faults.scope("hung"):
                    faults.fires(faults.InfraKind.SANDBOX_CREATE)
                    await asyncio.sleep(60)
            t = asyncio.create_task(hung())
            await asyncio.sleep(0.05)
            ledger.step_row(1)   # the kill strikes here
        asyncio.run(main())
    """)
    p = subprocess.run([sys.executable, "-c", script], env={**os.environ}, timeout=120)
    assert p.returncode == -signal.SIGKILL
    line = json.loads((tmp_path / "faults.jsonl").read_text().splitlines()[-1])
    assert line["injected"] == {"process_killed": 1, "sandbox_create": 2}
    assert line["open"] == {"sandbox_create": 1}

    inj = FaultInjector(FaultsConfig({"sandbox_create": 0.0}), books=tmp_path / "faults.jsonl")
    ledger = InfraLedger(tmp_path / "infra.json", resumed=True)
    assert inj.life == 1 and inj.books()["cut_off"] == {"sandbox_create": 1}
    assert inj.books()["settled"] == {"process_killed": 1, "sandbox_create": 1}
    assert ledger.counts()["process_killed"] == 1 and ledger.counts()["sandbox_create"] == 1
    ledger.close()
    assert InfraLedger(tmp_path / "infra.json", resumed=True).counts()["process_killed"] == 1


def test_ledger_rows_give_each_class_its_count_and_rate_per_attempt():
    ledger = InfraLedger()
    for kind in ("", "", "engine_error", "exec_timeout"):
        ledger.attempt(_traj(kind))
    ledger.failure(InfraKind.WEIGHT_WRITE)
    row = ledger.step_row(1)
    assert row["infra/attempts"] == 4 and row["infra/engine_error"] == 1
    assert row["infra_rate/engine_error"] == 0.25 and row["infra_rate/weight_write"] == 0.25
    assert row["infra_rate/all"] == 0.75
    assert {f"infra/{k.value}" for k in InfraKind} <= set(row)
    ledger.attempt(_traj())
    ledger.attempt(_traj("engine_error"))
    row = ledger.step_row(2)  # the rate is the step's; the count, the run's
    assert row["infra/engine_error"] == 2 and row["infra_rate/engine_error"] == 0.5
    assert row["infra_rate/weight_write"] == 0.0


def test_only_a_resumed_run_continues_the_ledger(tmp_path):
    ledger = InfraLedger(tmp_path / "infra.json")
    ledger.failure(InfraKind.WEIGHT_READ, 3)
    ledger.step_row(1)
    assert InfraLedger(tmp_path / "infra.json").counts()["weight_read"] == 0


def test_a_restarted_fleet_node_draws_its_own_faults():
    """Each member the fleet spawns (a node restarted after a loss included) gets the run's rates
    on a stream of its own: with one seed for all, every restart repeated the same first draws,
    and a class that did not fire in them never fired on short-lived nodes."""
    from looprl.fleet.config import FleetConfig
    from looprl.fleet.ray_fleet import MemberSpec, RayFleet
    from looprl.rewards.composite import RewardConfig
    from looprl.rollout.config import RolloutConfig

    spec = MemberSpec("model", None, "weights", RolloutConfig(), RewardConfig(), "torch",
                      faults=FaultsConfig({"grader_crash": 0.05}, seed=1))
    fleet = RayFleet(FleetConfig(), spec)
    first, second = fleet._member_faults(), fleet._member_faults()
    assert first.rates == second.rates == {"grader_crash": 0.05}

    def draws(cfg: FaultsConfig) -> list[bool]:
        inj = FaultInjector(cfg, role="env")
        return [inj.fires(InfraKind.GRADER_CRASH) for _ in range(200)]

    assert draws(first) != draws(second)
    assert RayFleet(FleetConfig(), dataclasses.replace(spec, faults=None))._member_faults() is None
