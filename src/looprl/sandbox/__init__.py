"""Sandboxes: isolated copy-on-write workspaces (``workspace.py``), commands under bubblewrap
(``bwrap.py``; one command's argv, limits and run in ``command.py``, its mounts in ``mounts.py``,
its root filesystem in ``root.py``, the one-exec launcher prepared ahead in ``launch.py``), commands in a container for image-based tasks
(``container.py``: Docker or Podman; ``create_sandbox`` picks it for a task with an image), a bounded pool with blank and warm sandboxes and
metrics (``pool.py``) and the same API over HTTP (``server.py``).

Contract used by the rest of looprl:

    sandbox = await create_sandbox(base_dir, venv=None)   # -> looprl.protocols.Sandbox
    sandbox = await create_sandbox(task.repo, task.venv, image=task.image)  # any task's backend
    r = await sandbox.exec("python -m pytest -q", timeout_s=60)
    kids = await sandbox.fork(8)                           # G rollouts from one state
    snap = await sandbox.snapshot(); other = await sandbox_from(snap, venv=venv)
    await sandbox.close()

    pool = SandboxPool(max_running=16, warm=2, blank=2)  # 2 per base + 2 for any base ahead
    async with pool.lease(base_dir, venv=venv, image=None) as sandbox: ...
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from looprl.lazy import lazy_exports

if TYPE_CHECKING:
    from looprl.sandbox.bwrap import Blank, BwrapSandbox
    from looprl.sandbox.command import SandboxLimits
    from looprl.sandbox.container import ContainerSandbox
    from looprl.sandbox.mounts import Mount
    from looprl.sandbox.workspace import Snapshot
    from looprl.types import Image

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, _exports = lazy_exports(__name__, {
    "bwrap": ["BwrapSandbox", "sandbox_from"],
    "command": ["SandboxLimits", "check_bwrap"],
    "container": ["ContainerSandbox", "ContainerSnapshot", "check_engine"],
    "mounts": ["Mount"],
    "pool": ["PoolMetrics", "SandboxPool"],
    "server": ["RemoteSandbox"],
    "workspace": ["Snapshot", "Workspace", "create_workspace", "fork", "janitor"],
})


async def create_sandbox(base_dir: str | os.PathLike[str], venv: str | None = None, *,
                         limits: SandboxLimits | None = None,
                         snapshot: Snapshot | None = None, workdir: str | None = None,
                         mounts: tuple[Mount, ...] = (), image: Image | None = None,
                         blank: Blank | None = None, resolved: bool = False
                         ) -> BwrapSandbox | ContainerSandbox:
    """A fresh sandbox over ``base_dir`` (or over ``snapshot``), commands under bubblewrap;
    ``workdir``: where its commands see the workspace (default: ``base_dir``'s own path, or the
    image's workdir); ``mounts``: extra host directories they see (``Mount(source, target,
    readonly)``); ``blank``, ``resolved``: a bubblewrap sandbox's pre-started blank and an
    already resolved ``base_dir`` (``bwrap.new_sandbox``; the pool's). ``image`` (a task's ``Task.image``): commands in a container of it instead
    (``container.py``), with no venv: the one place a task's backend is chosen, so its agent
    and its grader run in the same environment.

    Raises ``SandboxUnavailableError`` (with the fix) when bubblewrap cannot run here, or for an
    image, when no engine can run it (none installed, the image not in its local store).
    """
    from looprl.sandbox.container import ContainerSandbox, ContainerSnapshot

    if image is None and isinstance(snapshot, ContainerSnapshot):
        raise ValueError(f"snapshot {snapshot.id} is a container's: fork it with its task's image")
    if image is not None:
        from looprl.sandbox.command import SandboxLimits

        if venv is not None:
            raise ValueError(f"a task in image {image.name} has no venv (got {venv}): its "
                             "Python is the image's")
        lim = limits or SandboxLimits()
        return await ContainerSandbox.create(base_dir, image=image.name,
                                             workdir=workdir or image.workdir, mounts=mounts,
                                             memory_mb=lim.memory_mb,
                                             output_bytes=lim.output_bytes, snapshot=snapshot)
    from looprl.sandbox.bwrap import new_sandbox

    return await new_sandbox(base_dir, venv, limits=limits, snapshot=snapshot, workdir=workdir,
                             mounts=mounts, blank=blank, resolved=resolved)


__all__ = sorted([*_exports, "create_sandbox"])
