"""SandboxPool: bounded leases with a queue, lease expiry, reuse after reset, metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from looprl.errors import SandboxError
from looprl.protocols import Sandbox
from looprl.sandbox import SandboxPool
from looprl.sandbox.workspace import _remove_tree

from .conftest import needs_bwrap, run

pytestmark = needs_bwrap


def test_bound_queue_and_metrics(base_repo: Path) -> None:
    async def go():
        pool = SandboxPool(max_running=2)
        running, peak = 0, 0

        async def job(i: int) -> str:
            nonlocal running, peak
            async with pool.lease(base_repo) as sb:
                assert isinstance(sb, Sandbox)
                running += 1
                peak = max(peak, running)
                r = await sb.exec(f"echo job{i} > mine.txt; sleep 0.2; cat mine.txt")
                running -= 1
                return r.stdout.strip()

        tasks = [asyncio.create_task(job(i)) for i in range(5)]
        await asyncio.sleep(0.1)
        m = pool.metrics()
        assert m.busy == 2 and m.queued == 3, m
        outs = await asyncio.gather(*tasks)
        assert outs == [f"job{i}" for i in range(5)]  # no cross-talk between leases
        assert peak == 2
        m = pool.metrics()
        assert (m.busy, m.queued, m.leases_total, m.execs_total) == (0, 0, 5, 5)
        assert m.idle == 2 and 150 < m.exec_p50_ms <= m.exec_p95_ms
        assert pool.health()["ok"] is True
        await pool.close()
        assert pool.metrics().idle == 0
    run(go())


def test_reused_sandbox_starts_clean(base_repo: Path) -> None:
    async def go():
        pool = SandboxPool(max_running=1)
        async with pool.lease(base_repo) as sb:
            await sb.write("leftover.txt", b"from lease 1")
            first = sb.inner
        async with pool.lease(base_repo) as sb:
            assert sb.inner is first, "an idle sandbox is reused"
            assert await sb.diff() == ""
            r = await sb.exec("ls leftover.txt")
            assert r.exit_code != 0
        await pool.close()
    run(go())


def test_expired_lease_is_an_infra_error(base_repo: Path) -> None:
    async def go():
        pool = SandboxPool(max_running=1)
        async with pool.lease(base_repo, timeout_s=0.3) as sb:
            assert (await sb.exec("echo ok")).ok
            await asyncio.sleep(0.5)
            with pytest.raises(SandboxError, match="lease expired") as e:
                await sb.exec("echo late")
            assert e.value.is_infra
        m = pool.metrics()
        assert m.expired_total == 1 and m.idle == 0 and m.busy == 0
        async with pool.lease(base_repo) as sb:  # the slot was given back
            assert (await sb.exec("echo again")).ok
        await pool.close()
    run(go())


def test_crashed_sandbox_is_infra_and_not_reused(base_repo: Path) -> None:
    async def go():
        pool = SandboxPool(max_running=1)
        async with pool.lease(base_repo) as sb:
            _remove_tree(sb.inner.workspace.dir)  # the workspace vanishes under the sandbox
            with pytest.raises(SandboxError):
                await sb.exec("true")
        m = pool.metrics()
        assert m.errors_total == 1 and m.idle == 0
        await pool.close()
    run(go())


def test_snapshot_leases(base_repo: Path) -> None:
    async def go():
        pool = SandboxPool(max_running=4)
        async with pool.lease(base_repo) as parent:
            await parent.exec("echo shared > start.txt")
            snap = await parent.snapshot()
        outs = []
        for _ in range(2):
            async with pool.lease(base_repo, snapshot=snap) as kid:
                outs.append((await kid.exec("cat start.txt")).stdout)
        snap.release()
        assert outs == ["shared\n", "shared\n"]
        await pool.close()
    run(go())
