"""An in-process environment server: a bounded pool of sandboxes with leases, a queue and metrics.

At most ``max_running`` sandboxes are leased at once; further ``lease`` calls wait in a queue.
Each lease has a timeout after which its sandbox is closed and further use raises
``SandboxError`` (infrastructure: never the model's fault).

A lease is served, fastest first, by: an ``idle`` sandbox (returned by an earlier lease and reset:
a fresh overlay upper, no files, processes or /tmp carried over; at most ``max_idle`` are kept in
all, over every base, the least recently used base's closed first), a ``warm`` one (created ahead,
never leased, its first command's launcher already prepared), a ``blank`` one (``bwrap.Blank``:
uid, root, the workspace's upper layer, the venv of the pool's latest lease and the first
command's bwrap, started ahead for no base in particular; the lease mounts the workspace over its
base and attaches it), or a new one (cold). A lease that outlives its timeout has its running
command killed before its sandbox is closed. The pool keeps ``blank``
blanks ready (as root with the C launcher; refilled after a lease's first command). Once a
(base, venv) pair has been leased (or ``prewarm``ed), a background task keeps ``warm`` sandboxes
ready for it, one creation at a time, started after a lease's first command or its return (so it
never competes with the latency-critical first command); only the ``warm_keys`` most recently used pairs are kept
warm, so memory stays bounded (each warm sandbox is a small tmpfs, an overlay mount and one
blocked ~1 MB launcher process). Warm and idle sandboxes run nothing and do not count against
``max_running``. ``close()`` cancels the refill and destroys every sandbox.

    pool = SandboxPool(max_running=16, lease_timeout_s=900, warm=2)
    await pool.prewarm("/data/repos/attrs", venv="/data/venvs/attrs")   # optional
    async with pool.lease("/data/repos/attrs", venv="/data/venvs/attrs") as sb:
        r = await sb.exec("python -m pytest -q")
    print(pool.metrics())   # busy, idle, warm, queued, exec latency p50/p95, ...

A lease with an ``image`` (a task's ``Task.image``) gets a container of it (``create_sandbox``
decides): warm and idle ones are kept per (base, venv, image) alike; blanks are bwrap's only.

``server.py`` serves the same pool over HTTP; ``RemoteSandbox`` is its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from looprl import faults
from looprl.errors import InfraKind, SandboxError
from looprl.sandbox import create_sandbox
from looprl.sandbox.bwrap import Blank, BwrapSandbox, can_root, make_blank
from looprl.sandbox.command import SandboxLimits, check_bwrap
from looprl.sandbox.container import ContainerSandbox
from looprl.sandbox.workspace import Snapshot, realpath
from looprl.types import ExecResult, FileEntry, Image

Key = tuple[str, str | None, Image | None]
"""(base, venv, image): what a sandbox was made over; equal keys' sandboxes are alike."""
Inner = BwrapSandbox | ContainerSandbox


@dataclass(frozen=True)
class PoolMetrics:
    """A point-in-time view of a pool."""

    busy: int
    """Sandboxes currently leased."""
    idle: int
    """Returned sandboxes, reset, kept for the next lease over the same base."""
    queued: int
    """Lease requests waiting for a free slot."""
    max_running: int
    leases_total: int
    expired_total: int
    """Leases closed because they outlived ``lease_timeout_s``."""
    errors_total: int
    """Sandbox (infrastructure) failures seen by leased sandboxes."""
    execs_total: int
    exec_p50_ms: float
    exec_p95_ms: float
    warm: int = 0
    """Sandboxes created ahead (never leased), ready for the next lease over their base."""
    warm_hits_total: int = 0
    """Leases served by a warm or idle sandbox."""
    blank: int = 0
    """Blank sandboxes ready (any base: namespaces started, no workspace yet)."""
    blank_hits_total: int = 0
    """Leases whose sandbox was created from a blank (the rest of the new ones were cold)."""

    def to_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class PooledSandbox:
    """A leased sandbox: the ``Sandbox`` protocol plus lease bookkeeping and latency metrics."""

    def __init__(self, pool: SandboxPool, inner: Inner, key: Key,
                 timeout_s: float):
        self.pool = pool
        self.inner = inner
        self.key = key
        self.id = os.urandom(8).hex()
        self.expired = False
        self.broken = False
        self.released = False
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, timeout_s)

    @property
    def tools_dir(self) -> str:
        return self.inner.tools_dir

    def _expire(self, timeout_s: float) -> None:
        self.expired = True
        self.pool._expired += 1
        asyncio.ensure_future(self.inner.close())
        self._expiry_msg = (f"sandbox lease expired after {timeout_s:g} s and the sandbox was "
                            "closed; raise the pool's lease_timeout_s for longer episodes")

    def _check(self) -> None:
        if self.released:
            raise SandboxError("sandbox lease was already returned to the pool")
        if self.expired:
            raise SandboxError(self._expiry_msg)

    async def _call(self, coro_fn, *args, **kwargs):
        self._check()
        try:
            return await coro_fn(*args, **kwargs)
        except SandboxError:
            self.broken = True
            self.pool._errors += 1
            if self.expired:
                raise SandboxError(self._expiry_msg) from None
            raise

    async def exec(self, cmd: str, *, timeout_s: float = 60.0,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        t0 = time.perf_counter()
        try:
            r = await self._call(self.inner.exec, cmd, timeout_s=timeout_s, env=env)
        finally:  # refill after the first command, so creating does not compete with it
            self.pool._refill(self.key)
        self.pool._record_exec(time.perf_counter() - t0)
        return r

    async def read(self, path: str) -> bytes:
        return await self._call(self.inner.read, path)

    async def write(self, path: str, data: bytes) -> None:
        await self._call(self.inner.write, path, data)

    async def walk(self, under: str = ".", *, max_entries: int = 100_000) -> list[FileEntry]:
        return await self._call(self.inner.walk, under, max_entries=max_entries)

    async def diff(self) -> str:
        return await self._call(self.inner.diff)

    async def snapshot(self) -> Snapshot:
        return await self._call(self.inner.snapshot)

    async def close(self) -> None:
        """Return the lease (same as leaving ``pool.lease``)."""
        await self.pool.release(self)


class SandboxPool:
    """A bounded pool of sandboxes; ``lease`` waits in a queue when ``max_running`` are out."""

    def __init__(self, max_running: int = 16, *, limits: SandboxLimits | None = None,
                 lease_timeout_s: float = 3600.0, max_idle: int = 16, warm: int = 2,
                 warm_keys: int = 4, blank: int = 2):
        if max_running < 1 or max_idle < 0 or warm < 0 or warm_keys < 1 or blank < 0:
            raise ValueError("SandboxPool needs max_running >= 1, max_idle >= 0, warm >= 0, "
                             "warm_keys >= 1 and blank >= 0")
        self.max_running = max_running
        self.limits = limits or SandboxLimits()
        self.lease_timeout_s = lease_timeout_s
        self.max_idle = max_idle
        self.warm = warm
        self.warm_keys = warm_keys
        self.blank = blank
        self._blanks: list[Blank] = []
        self._blank_filler: asyncio.Task[None] | None = None
        self._blank_hits = 0
        self._blank_venv: str | None = None
        """The venv of the latest lease: new blanks have it attached already."""
        self._warm: dict[Key, list[Inner]] = {}
        """Per (base, venv, image), most recently used last: sandboxes created ahead."""
        self._fillers: dict[Key, asyncio.Task[None]] = {}
        self._warm_hits = 0
        self._closing: set[asyncio.Future[None]] = set()
        self._slots: asyncio.Semaphore | None = None
        self._busy: dict[str, PooledSandbox] = {}
        self._idle: dict[Key, list[Inner]] = {}
        """Per (base, venv, image), most recently returned last: reset sandboxes, ``max_idle`` in all
        (each holds mounts and a tmpfs: an unbounded cache over one-off bases, as RL's single
        epoch leases them, grew the host's mount table until every mount got slow)."""
        self._queued = 0
        self._leases = self._expired = self._errors = self._execs = 0
        self._latency_s: deque[float] = deque(maxlen=2048)
        self._closed = False

    def _sem(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_running)
        return self._slots

    def _record_exec(self, wall_s: float) -> None:
        self._execs += 1
        self._latency_s.append(wall_s)

    async def acquire(self, base_dir: str | os.PathLike[str], venv: str | None = None, *,
                      snapshot: Snapshot | None = None, timeout_s: float | None = None,
                      image: Image | None = None) -> PooledSandbox:
        """Lease a sandbox (waits while ``max_running`` are out). Pair with ``release``."""
        if self._closed:
            raise SandboxError("sandbox pool is closed", kind=InfraKind.SANDBOX_CREATE)
        if image is None:
            check_bwrap()
        self._queued += 1
        try:
            await self._sem().acquire()
        finally:
            self._queued -= 1
        making = asyncio.ensure_future(self._make(base_dir, venv, snapshot, image))
        try:
            inner, key = await asyncio.shield(making)
        except asyncio.CancelledError:
            # e.g. the env server's client left: creation runs partly in a thread, so let it
            # finish and close what it made (cancelling it would leak a mounted workspace)
            try:
                with contextlib.suppress(Exception):
                    await (await making)[0].close()
            finally:
                self._sem().release()
            raise
        except BaseException:
            self._sem().release()
            raise
        leased = PooledSandbox(self, inner, key, timeout_s or self.lease_timeout_s)
        self._busy[leased.id] = leased
        self._leases += 1
        return leased

    async def _make(self, base_dir: str | os.PathLike[str], venv: str | None,
                    snapshot: Snapshot | None, image: Image | None) -> tuple[Inner, Key]:
        faults.maybe_raise(InfraKind.SANDBOX_CREATE, "SandboxPool.acquire")
        key = (realpath(base_dir), venv, image)
        if snapshot is not None:
            return (await self._new((snapshot.base, venv, image), snapshot,
                                    self._take_blank(image)), ("", None, None))
        self._touch(key)
        idle, warm = self._idle.get(key), self._warm.get(key)
        ready = idle.pop() if idle else warm.pop(0) if warm else None
        if ready is not None:
            self._warm_hits += 1
            return ready, key
        return await self._new(key, None, self._take_blank(image)), key

    async def _new(self, key: Key, snapshot: Snapshot | None = None,
                   blank: Blank | None = None) -> Inner:
        try:
            if key[2] is None:
                self._blank_venv = key[1]
            return await create_sandbox(key[0], key[1], limits=self.limits, snapshot=snapshot,
                                        image=key[2], blank=blank, resolved=True)
        except OSError as e:
            raise SandboxError(f"could not create a workspace over {key[0]}: {e}",
                               kind=InfraKind.SANDBOX_CREATE) from e

    # ------------------------------------------------------------ blank sandboxes

    def _take_blank(self, image: Image | None) -> Blank | None:
        """A blank for a bwrap sandbox (None for a container: its engine starts it)."""
        while self._blanks and image is None:
            b = self._blanks.pop(0)
            if b.usable():
                self._blank_hits += 1
                return b
            b.close()
        return None

    async def prewarm_blank(self) -> None:
        """Start the ``blank`` blank sandboxes now and wait until they are started."""
        if self._closed:
            raise SandboxError("sandbox pool is closed", kind=InfraKind.SANDBOX_CREATE)
        check_bwrap()
        self._refill_blanks()
        if self._blank_filler is not None:
            await asyncio.shield(self._blank_filler)

    def _refill_blanks(self) -> None:
        task = self._blank_filler
        if (self.blank and not self._closed and len(self._blanks) < self.blank
                and (task is None or task.done()) and can_root([])):
            self._blank_filler = asyncio.ensure_future(self._fill_blanks())

    async def _fill_blanks(self) -> None:
        while not self._closed and len(self._blanks) < self.blank:
            try:
                b = await make_blank(self.limits, self._blank_venv)
            except (SandboxError, OSError):
                return  # leases create their sandboxes cold and report the failure
            if self._closed:
                b.close()
                return
            self._blanks.append(b)

    # ------------------------------------------------------------ warm sandboxes

    async def prewarm(self, base_dir: str | os.PathLike[str], venv: str | None = None, *,
                      image: Image | None = None) -> None:
        """Create the ``warm`` sandboxes of (base, venv, image) now and wait until they are
        ready."""
        if self._closed:
            raise SandboxError("sandbox pool is closed", kind=InfraKind.SANDBOX_CREATE)
        if image is None:
            check_bwrap()
        key = (realpath(base_dir), venv, image)
        self._touch(key)
        self._refill(key)
        task = self._fillers.get(key)
        if task is not None:
            await asyncio.shield(task)

    def _touch(self, key: Key) -> None:
        """Mark ``key`` most recently used; drain the warm sandboxes of keys beyond
        ``warm_keys``."""
        self._warm[key] = self._warm.pop(key, [])
        while len(self._warm) > self.warm_keys:
            old = next(iter(self._warm))
            task = self._fillers.pop(old, None)
            if task is not None:
                task.cancel()
            for sb in self._warm.pop(old):
                self._close_later(sb)

    def _refill(self, key: Key) -> None:
        self._refill_blanks()
        task = self._fillers.get(key)
        if key not in self._warm:  # a snapshot lease, or a base no longer kept warm
            return
        if self.warm and not self._closed and (task is None or task.done()):
            self._fillers[key] = asyncio.ensure_future(self._fill(key))

    async def _fill(self, key: Key) -> None:
        """Create sandboxes for ``key``, one at a time, until idle + warm reach ``warm``."""
        while not self._closed and key in self._warm:
            have = len(self._warm[key]) + len(self._idle.get(key, []))
            if have >= self.warm:
                return
            creating = asyncio.ensure_future(self._new(key))
            try:
                sb = await asyncio.shield(creating)
            except Exception:  # noqa: BLE001
                return  # the next lease creates its own sandbox and reports the failure
            except asyncio.CancelledError:  # the creation runs in a thread: finish, then undo
                with contextlib.suppress(Exception):
                    sb = await creating
                    await sb.close()
                raise
            if self._closed or key not in self._warm:
                await sb.close()
                return
            self._warm[key].append(sb)

    async def release(self, leased: PooledSandbox) -> None:
        """Return a lease; its sandbox is reset and kept idle, or closed."""
        if leased.released:
            return
        leased.released = True
        leased._timer.cancel()
        self._busy.pop(leased.id, None)
        try:
            reusable = not (leased.expired or leased.broken or self._closed or not leased.key[0])
            if reusable and self.max_idle:
                try:
                    await leased.inner.reset()
                except (SandboxError, OSError):
                    pass
                else:
                    if not self._closed:  # close() may have run during the reset
                        self._idle[leased.key] = self._idle.pop(leased.key, []) + [leased.inner]
                        self._evict_idle()
                        return
            await leased.inner.close()
        finally:
            self._sem().release()
            self._refill(leased.key)

    def _evict_idle(self) -> None:
        """Close idle sandboxes beyond ``max_idle`` in all, least recently returned base first."""
        extra = sum(len(v) for v in self._idle.values()) - self.max_idle
        for key in list(self._idle):
            group = self._idle[key]
            while group and extra > 0:
                self._close_later(group.pop(0))
                extra -= 1
            if not group:
                del self._idle[key]
            if extra <= 0:
                return

    def _close_later(self, sb: Inner) -> None:
        closing = asyncio.ensure_future(sb.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    @contextlib.asynccontextmanager
    async def lease(self, base_dir: str | os.PathLike[str], venv: str | None = None, *,
                    snapshot: Snapshot | None = None, timeout_s: float | None = None,
                    image: Image | None = None) -> AsyncIterator[PooledSandbox]:
        """``async with pool.lease(base) as sb:`` — the sandbox goes back on exit."""
        leased = await self.acquire(base_dir, venv, snapshot=snapshot, timeout_s=timeout_s,
                                    image=image)
        try:
            yield leased
        finally:
            await self.release(leased)

    def get(self, lease_id: str) -> PooledSandbox:
        """The live lease with this id (``SandboxError`` when unknown, returned or expired)."""
        leased = self._busy.get(lease_id)
        if leased is None:
            raise SandboxError(f"no live sandbox lease {lease_id!r} (returned, expired or the "
                               "server restarted)")
        return leased

    def metrics(self) -> PoolMetrics:
        lat = list(self._latency_s)
        return PoolMetrics(
            busy=len(self._busy), idle=sum(len(v) for v in self._idle.values()),
            queued=self._queued, max_running=self.max_running, leases_total=self._leases,
            expired_total=self._expired, errors_total=self._errors, execs_total=self._execs,
            exec_p50_ms=1000 * _percentile(lat, 0.5), exec_p95_ms=1000 * _percentile(lat, 0.95),
            warm=sum(len(v) for v in self._warm.values()), warm_hits_total=self._warm_hits,
            blank=len(self._blanks), blank_hits_total=self._blank_hits)

    def health(self) -> dict[str, object]:
        """ok + why not: bubblewrap usable and the pool open."""
        try:
            check_bwrap()
            ok, detail = not self._closed, "closed" if self._closed else "ok"
        except SandboxError as e:
            ok, detail = False, str(e)
        return {"ok": ok, "detail": detail, **self.metrics().to_dict()}

    async def close(self) -> None:
        """Stop the refills; close every blank, warm, idle and leased sandbox."""
        self._closed = True
        fillers = list(self._fillers.values())
        for task in fillers:
            task.cancel()
        if self._blank_filler is not None:
            self._blank_filler.cancel()
            fillers.append(self._blank_filler)
        await asyncio.gather(*fillers, return_exceptions=True)
        self._fillers.clear()
        for b in self._blanks:
            b.close()
        self._blanks.clear()
        for leased in list(self._busy.values()):
            await self.release(leased)
        for group in (*self._idle.values(), *self._warm.values()):
            for sb in group:
                await sb.close()
        self._idle.clear()
        self._warm.clear()
        await asyncio.gather(*self._closing, return_exceptions=True)
        self._closing.clear()
