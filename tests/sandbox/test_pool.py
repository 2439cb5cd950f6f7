"""SandboxPool: bounded leases with a queue, lease expiry, reuse after reset, warm sandboxes
created ahead, metrics."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from looprl.errors import SandboxError
from looprl.protocols import Sandbox
from looprl.sandbox import SandboxPool
from looprl.sandbox.workspace import _remove_tree, mounts_under, sandbox_root

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
        async with pool.lease(base_repo, timeout_s=2.0) as sb:  # starting may take 1 s, loaded
            assert (await sb.exec("echo ok")).ok
            await asyncio.sleep(2.5)
            with pytest.raises(SandboxError, match="lease expired") as e:
                await sb.exec("echo late")
            assert e.value.is_infra
        m = pool.metrics()
        assert m.expired_total == 1 and m.idle == 0 and m.busy == 0
        async with pool.lease(base_repo) as sb:  # the slot was given back
            assert (await sb.exec("echo again")).ok
        await pool.close()
    run(go())


def test_lease_expiring_mid_command_kills_it(base_repo: Path) -> None:
    """The command does not outlive its lease (nor run under a uid the pool hands out again)."""
    async def go():
        pool = SandboxPool(max_running=1)
        t0 = time.perf_counter()
        async with pool.lease(base_repo, timeout_s=0.5) as sb:
            uid = sb.inner.workspace.uid
            with pytest.raises(SandboxError, match="lease expired") as e:
                await sb.exec("sleep 7.31; echo finished > late.txt", timeout_s=60)
            assert e.value.is_infra
        assert time.perf_counter() - t0 < 5
        assert not _pids_running("sleep 7.31")
        if uid is not None:  # nothing of that uid runs on the host (zombies run nothing)
            left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == uid
                    and _state(p) not in ("Z", None)]
            assert not left, [(p / "status").read_text()[:200] for p in left]
        await pool.close()
    run(go())


def _pids_running(needle: str) -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        try:
            cmdline = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if p.name.isdigit() and needle in cmdline:
                out.append(p.name)
        except OSError:
            pass
    return out


def _state(p: Path) -> str | None:
    try:
        return (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _owner(p: Path) -> int | None:
    try:
        return p.stat().st_uid
    except OSError:
        return None


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


# ---------------------------------------------------------------- warm sandboxes


def _own_dirs() -> set[str]:
    """Workspace and staging dirs of this process under the sandbox root."""
    root = sandbox_root()
    return {p.name for p in root.iterdir() if p.name.startswith(f"ws-{os.getpid()}-")}


def _own_mounts() -> set[Path]:
    return {m for m in mounts_under(sandbox_root()) if f"ws-{os.getpid()}-" in str(m)}


async def _settle(pool: SandboxPool, warm: int) -> None:
    for _ in range(500):
        if pool.metrics().warm == warm and all(t.done() for t in pool._fillers.values()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"pool never settled at {warm} warm: {pool.metrics()}")


def test_warm_lease_is_a_fresh_sandbox_and_is_refilled(base_repo: Path) -> None:
    async def go():
        pool = SandboxPool(max_running=2, warm=2, max_idle=0)  # returned ones are closed
        await pool.prewarm(base_repo)
        assert pool.metrics().warm == 2
        async with pool.lease(base_repo) as sb:
            assert pool.metrics().warm_hits_total == 1
            assert not any(sb.inner.workspace.upper.iterdir()), "a clean overlay upper"
            assert await sb.diff() == ""
            r = await sb.exec("echo dirty > left.txt; echo junk > /tmp/junk; cat /tmp/junk")
            assert r.ok and r.stdout == "junk\n"
            first = sb.inner
        await _settle(pool, 2)  # refilled in the background
        async with pool.lease(base_repo) as sb:
            assert sb.inner is not first and first.workspace.closed
            assert pool.metrics().warm_hits_total == 2
            r = await sb.exec("ls left.txt; ls /tmp/junk")
            assert r.exit_code != 0 and r.stderr.count("No such file") == 2, r
            assert not any(sb.inner.workspace.upper.iterdir())
        await pool.close()
    run(go())


def test_shutdown_leaves_no_mounts_dirs_or_launchers(base_repo: Path) -> None:
    async def go():
        before_dirs, before_mounts = _own_dirs(), _own_mounts()
        pool = SandboxPool(max_running=2, warm=3)
        await pool.prewarm(base_repo)
        launchers = [sb._ready for sb in pool._warm[(os.path.realpath(base_repo), None, None)]]
        assert len(launchers) == 3 and all(p is not None for p in launchers)
        async with pool.lease(base_repo) as sb:  # starts a refill that close() interrupts
            assert (await sb.exec("echo hi")).ok
            await sb.write("x.txt", b"x")
            await pool.close()
        assert pool.metrics().warm == 0 and pool.metrics().idle == 0
        assert _own_dirs() == before_dirs and _own_mounts() == before_mounts
        assert all(p.proc.returncode is not None for p in launchers)
        assert not any(d.exists() for p in launchers for d in p.cg.dirs)
        with pytest.raises(SandboxError, match="closed"):
            await pool.prewarm(base_repo)
    run(go())


def test_concurrency_bound_holds_with_warm_sandboxes(base_repo: Path) -> None:
    async def go():
        pool = SandboxPool(max_running=2, warm=2)
        await pool.prewarm(base_repo)
        running, peak = 0, 0

        async def job(i: int) -> str:
            nonlocal running, peak
            async with pool.lease(base_repo) as sb:
                running += 1
                peak = max(peak, running, pool.metrics().busy)
                r = await sb.exec(f"echo {i} > me.txt; sleep 0.1; cat me.txt")
                running -= 1
                return r.stdout.strip()

        outs = await asyncio.gather(*(job(i) for i in range(6)))
        assert outs == [str(i) for i in range(6)] and peak == 2
        m = pool.metrics()
        assert m.busy == 0 and m.warm_hits_total == 6 and m.leases_total == 6
        await pool.close()
    run(go())


def test_only_recent_bases_are_kept_warm(base_repo: Path, tmp_path: Path) -> None:
    async def go():
        other = tmp_path / "other"
        other.mkdir()
        (other / "f.txt").write_text("f")
        before = _own_dirs()
        pool = SandboxPool(max_running=2, warm=1, warm_keys=1)
        await pool.prewarm(base_repo)
        await pool.prewarm(other)  # pushes base_repo's warm sandbox out
        assert list(pool._warm) == [(os.path.realpath(other), None, None)]
        await pool.close()
        assert _own_dirs() == before
    run(go())


def test_idle_sandboxes_are_bounded_over_many_bases(base_repo: Path, tmp_path: Path) -> None:
    """RL leases each task's base once: the idle cache must not keep every base's sandboxes
    (each is mounts and a tmpfs; hundreds of them slowed every mount on the host)."""
    import shutil

    bases = []
    for i in range(6):
        b = tmp_path / f"base{i}"
        shutil.copytree(base_repo, b)
        bases.append(b)

    async def go():
        dirs_before = _own_dirs()
        pool = SandboxPool(max_running=4, warm=0, blank=0, max_idle=3)
        for b in bases:  # two leases at once per base, as a group's rollouts are
            async with pool.lease(b) as x, pool.lease(b) as y:
                assert (await x.exec("true")).ok and (await y.exec("true")).ok
        await asyncio.gather(*pool._closing)
        m = pool.metrics()
        assert m.idle == 3, m
        assert len(_own_dirs() - dirs_before) == 3, "evicted sandboxes leave no workspace"
        hits = m.warm_hits_total
        async with pool.lease(bases[-1]) as sb:  # the latest base is still idle: a hit
            assert pool.metrics().warm_hits_total == hits + 1
            assert await sb.diff() == ""
        async with pool.lease(bases[0]) as sb:  # the oldest was evicted: a new sandbox
            assert pool.metrics().warm_hits_total == hits + 1
        await pool.close()
        assert _own_dirs() == dirs_before

    run(go())
