"""Sandboxes leased over HTTP from an environment server, behind the pool interface the rollout
runner uses (``lease``), as in a deployment where environment servers are their own service.

    with serving(tasks, max_running=16) as pool:       # an env server in a thread of this process
        async with pool.lease(task.repo, task.venv) as sb:   # a RemoteSandbox
            await sb.exec("python -m pytest -q")
    pool = RemotePool("http://envs:8377", token)        # or one started by `looprl sandbox serve`

Every lease is a ``RemoteSandbox``: the harness cannot tell it from a local one, and what fails
on the way (a 5xx, a dropped connection, a server that does not answer) is a ``SandboxError`` of
its class (``looprl.errors.InfraKind``), never the model's. ``serving`` allows exactly the
tasks' repositories and venvs (``EnvServerConfig.allowed_roots``), nothing else of the host.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Iterator

from looprl.errors import SandboxUnavailableError
from looprl.protocols import Sandbox
from looprl.sandbox.pool import PoolMetrics, SandboxPool
from looprl.sandbox.server import EnvServer, EnvServerConfig, RemoteSandbox, default_token
from looprl.types import Image, Task


class RemotePool:
    """``lease`` over HTTP from the environment server at ``url``; ``served``: that server's own
    pool when it runs in this process (``serving``), whose ``metrics`` this pool reports."""

    def __init__(self, url: str, token: str, served: SandboxPool | None = None) -> None:
        self.url, self.token, self.served = url, token, served

    def metrics(self) -> PoolMetrics | None:
        """The served pool's view (the fleet's node stats read it); None for a server elsewhere
        (its own ``/health`` says)."""
        return self.served.metrics() if self.served is not None else None

    @contextlib.asynccontextmanager
    async def lease(self, base_dir: str | os.PathLike[str], venv: str | None = None, *,
                    image: Image | None = None) -> AsyncIterator[Sandbox]:
        if image is not None:  # (the server's pool is bwrap's: no image crosses HTTP)
            raise SandboxUnavailableError(f"a task in image {image.name} runs on the local pool: "
                                          "environment servers serve bubblewrap sandboxes only")
        sb = await RemoteSandbox.create(self.url, self.token, str(base_dir), venv)
        try:
            yield sb
        finally:
            await sb.close()

    async def close(self) -> None:
        """Leases close themselves; the server is its owner's to stop."""


def task_roots(tasks: Iterable[Task]) -> tuple[str, ...]:
    """The directories ``tasks`` need served: their repositories and venvs.
    ``SandboxUnavailableError`` for a task in an image (served sandboxes are bubblewrap's)."""
    tasks = list(tasks)
    for t in tasks:
        if t.image is not None:
            raise SandboxUnavailableError(f"task {t.id} runs in image {t.image.name}: environment "
                                          "servers serve bubblewrap sandboxes only; lease its "
                                          "sandboxes in process (fleet.experimental.sandboxes)")
    return tuple(sorted({t.repo for t in tasks} | {t.venv for t in tasks if t.venv}))


def serving(tasks: Iterable[Task], *, max_running: int = 16
            ) -> contextlib.AbstractContextManager[RemotePool]:
    """An environment server in a thread of this process, allowed the tasks' repositories and
    venvs alone, and a pool of leases from it; the server drains and stops on leaving."""
    return serving_roots(task_roots(tasks), max_running)


@contextlib.contextmanager
def serving_roots(roots: tuple[str, ...], max_running: int = 16) -> Iterator[RemotePool]:
    """``serving`` for the directories ``roots`` (``task_roots``)."""
    token = default_token()
    with EnvServer(token, max_running=max_running,
                   cfg=EnvServerConfig(allowed_roots=roots, drain_s=2.0)) as srv:
        yield RemotePool(srv.url, token, srv.pool)
