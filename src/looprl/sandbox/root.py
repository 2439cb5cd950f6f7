"""The root filesystem a sandbox's commands see, built on the host: ``SandboxRoot``.

Each sandbox owns a small tmpfs (``root-<pid>-<id>`` under the sandbox dir) that bwrap binds as
``/``. On the host it holds: the mount points of the read-only system (bwrap binds /usr, /etc,
/proc and /dev over them per command), the /bin and /lib* symlinks, a size-capped /tmp of its
own, a copy of the launcher (``/.looprl/launch``, see ``launch.py``), the harness's programs
(``mounts.TOOLS_DIR``, read-only binds of the host's), and — attached by the host
at the paths they have on the host — the workspace (read-write) and the task's venv and
interpreter prefix (read-only). Files of the root itself are host root's: the sandbox's uid
can write only the workspace and /tmp.

The root is a *shared* mount: a bwrap started over it receives, by mount propagation, whatever the
host attaches to the root later. That is what lets a command be prepared before its workspace
exists: a pool starts a *blank* sandbox (uid, root, one command's bwrap waiting inside, see
``bwrap.Blank``) ahead of any lease, and a lease for any base only has to create the workspace
and attach it (a few mount syscalls) before the command runs.

    root = SandboxRoot(tmp_mb=256)
    root.attach(workspace.path, "/data/repos/attrs", readonly=False)
    root.attach("/data/venvs/attrs", "/data/venvs/attrs", readonly=True)
    argv = [bwrap, ..., *root.bwrap_args(), "--", "/.looprl/launch", "-x", "-w", "3"]
    root.detach_all(); root.close()

A path under a directory bwrap mounts over (/usr, /etc, /proc, /dev, /bin, /lib*) cannot be
attached (``rootable`` is False): such sandboxes use bwrap's own mounts instead (``bwrap.py``).
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import uuid
from pathlib import Path

from looprl.errors import SandboxError
from looprl.sandbox.idmap import bind_clone
from looprl.sandbox.launch import launcher_path
from looprl.sandbox.mounts import TOOLS_DIR, harness_tools, system_binds, system_layout
from looprl.sandbox.workspace import _mount, _remove_tree, _umount, sandbox_root

LAUNCH = "/.looprl/launch"
"""Where a root holds its copy of the launcher (the program every prepared bwrap runs)."""
_MS_NOSUID, _MS_NODEV, _MS_SHARED = 2, 4, 1 << 20
_MOUNTED_OVER = ("/usr", "/etc", "/proc", "/dev", "/.looprl")


def rootable(paths: list[str]) -> bool:
    """Whether every path can be attached to a root: absolute, normal, not /, and not under a
    directory bwrap mounts over or a system symlink."""
    return all(_rootable(p) for p in paths)


@functools.lru_cache(maxsize=4096)
def _rootable(p: str) -> bool:
    if not p.startswith("/") or p == "/" or os.path.normpath(p) != p:
        return False
    dirs, links = system_layout()
    return not any(p == o or p.startswith(o + "/")
                   for o in (*_MOUNTED_OVER, *dirs, *(link for _, link in links)))


class SandboxRoot:
    """A sandbox's ``/`` on the host (a shared tmpfs); see the module docstring."""

    def __init__(self, tmp_mb: int):
        launcher = launcher_path()
        if launcher is None:
            raise SandboxError("a sandbox root needs the compiled launcher (no C compiler here)")
        self.tmp_mb = tmp_mb
        self.dir = sandbox_root() / f"root-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.closed = False
        self.dir.mkdir()
        try:
            _mount("tmpfs", self.dir, "tmpfs", "mode=0755,size=8m,nr_inodes=8k",
                   _MS_NOSUID | _MS_NODEV)
            _mount("none", self.dir, "", "", _MS_SHARED)  # later attachments reach every bwrap
            dirs, links = system_layout()
            for d in (*dirs, *_MOUNTED_OVER, "/tmp"):
                (self.dir / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
            for target, link in links:
                os.symlink(target, self.dir / link.lstrip("/"))
            shutil.copy(launcher, self.dir / LAUNCH.lstrip("/"))
            self._mount_tools()
            self._mount_tmp()
        except BaseException:
            self.close()
            raise
        self.attached: list[Path] = []

    def _mount_tools(self) -> None:
        """``harness_tools`` at ``TOOLS_DIR``: each a read-only bind of the host's file."""
        tools = self.dir / TOOLS_DIR.lstrip("/")
        tools.mkdir(mode=0o755)
        for name, host in harness_tools():
            (tools / name).touch(mode=0o755)
            bind_clone(host, tools / name, readonly=True)

    def _mount_tmp(self) -> None:
        _mount("tmpfs", self.dir / "tmp", "tmpfs",
               f"mode=1777,size={self.tmp_mb}m,nr_inodes=200k", _MS_NOSUID | _MS_NODEV)

    def bwrap_args(self) -> list[str]:
        """bwrap arguments that make this root ``/``, with the system, /proc and /dev over it."""
        return ["--bind", str(self.dir), "/", *system_binds(links=False), "--proc", "/proc",
                "--dev", "/dev"]

    def attach(self, source: str | os.PathLike[str], target: str, *, readonly: bool) -> None:
        """Bind ``source`` (with its submounts) at ``target`` as commands see it."""
        if self.closed:
            raise SandboxError("sandbox root is closed")
        if not rootable([target]):
            raise SandboxError(f"{target} cannot be attached to a sandbox root (under a system "
                               "directory or not absolute)")
        dst = str(self.dir)  # (plain strings: this runs in every lease)
        for part in target.split("/")[1:]:  # (normal, absolute: ``rootable``)
            dst += "/" + part
            try:
                os.mkdir(dst, 0o755)  # made now: root's, and no one else can replace it
            except FileExistsError:  # never through a symlink out of the root
                if not stat.S_ISDIR(os.lstat(dst).st_mode):
                    raise SandboxError(f"mount point {target} in the sandbox root runs through a "
                                       f"symlink or file ({os.path.relpath(dst, self.dir)})") \
                        from None
        try:
            bind_clone(source, dst, readonly=readonly)
        except OSError as e:
            raise SandboxError(f"cannot attach {source} at {target} in the sandbox root: {e}") \
                from e
        self.attached.append(Path(dst))

    def detach_all(self) -> None:
        """Remove every attachment (innermost first); bwraps over the root lose them too."""
        for dst in sorted(self.attached, key=lambda p: len(p.parts), reverse=True):
            _umount(dst)
        self.attached.clear()

    def reset_tmp(self) -> None:
        """A fresh, empty /tmp (attachments under /tmp must be detached first)."""
        _umount(self.dir / "tmp")
        self._mount_tmp()

    def close(self) -> None:
        """Unmount everything under the root and delete it; idempotent."""
        if self.closed:
            return
        self.closed = True
        self.attached = []
        _remove_tree(self.dir)
