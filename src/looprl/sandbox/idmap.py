"""Unprivileged sandbox uids and idmapped mounts (Linux >= 5.12, as root).

Sandboxed commands must not run with host uid 0: the kernel treats host uid 0 as root for
sysctl permissions, device-node ownership and RLIMIT_NPROC even inside a user namespace. Each
sandbox therefore gets its own unprivileged host uid from ``UidPool``, and its workspace layers
are *idmapped* bind mounts that show files owned by host root (the repository, as the task
builder extracted it) as owned by that uid — so the agent can edit them while its processes
stay unprivileged. Files it creates are stored as root-owned on disk.

    uid = UID_POOL.take()                       # e.g. 200001
    idmapped_clone("/data/repos/attrs", "/tmp/.../lower0", uid)
    ...
    UID_POOL.give(uid)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from looprl.errors import SandboxError

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # x86_64 and aarch64 alike
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, 0o2000000
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_MOUNT_ATTR_IDMAP, _MOVE_MOUNT_F_EMPTY_PATH = 0x100000, 4
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _AT_RECURSIVE = 0x1, 0x2, 0x4, 0x8000
FIRST_UID = 200_000
"""Sandbox uids are FIRST_UID, FIRST_UID+1, ...: a range no login account uses."""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def uid_lock_dir() -> Path:
    """Where processes reserve sandbox uids (``LOOPRL_UID_LOCKS``, default a fixed directory
    under the system temp dir): one for the whole host, whatever each process's sandbox dir."""
    return Path(os.environ.get("LOOPRL_UID_LOCKS")
                or Path(tempfile.gettempdir()) / "looprl-uid-locks")


def open_lock_dir(path: Path) -> int:
    """An fd of the uid lock directory ``path``, created 0700 if missing. The default lives in
    the world-writable temp dir, so one that is a symlink, belongs to another user or is
    writable by others is refused (``SandboxError``): lock files are created in it as this
    user, through the fd, never by following a path someone else controls."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise SandboxError(f"uid lock directory {path} is a symlink or not a directory ({e}); "
                           f"remove it or set LOOPRL_UID_LOCKS to a directory of your own") from e
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise SandboxError(f"uid lock directory {path} belongs to uid {st.st_uid} with mode "
                           f"{st.st_mode & 0o777:o}; it must be yours and not writable by others: "
                           f"remove it or set LOOPRL_UID_LOCKS to a directory of your own")
    return fd


class UidPool:
    """Hands out unprivileged host uids (reused LIFO) and a user namespace mapping each to 0.

    Uids are unique across the processes of a host, not only within this one: a uid is first
    reserved with an ``flock`` on its file in ``uid_lock_dir()``, held until this process exits
    (the kernel drops it then, even on ``kill -9``); a uid another process holds is skipped.
    Two env servers on one host therefore never run sandboxes under the same uid (which would
    share RLIMIT_NPROC and let one see the other's processes as its own)."""

    def __init__(self, first: int = FIRST_UID, size: int = 60_000):
        self.first, self.size = first, size
        self._free: list[int] = []
        self._next = first
        self._userns_fd: dict[int, int] = {}
        self._reserved: dict[int, int] = {}
        """uid -> fd of its lock file (held while this process lives)."""
        self._lock = threading.Lock()
        self._dir: tuple[Path, int] | None = None
        """The lock directory and an fd of it (opened and checked once per path)."""

    def take(self) -> int:
        with self._lock:
            if self._free:
                return self._free.pop()
            while True:
                if self._next >= self.first + self.size:
                    raise RuntimeError(f"sandbox uid range exhausted ({self.size} uids from "
                                       f"{self.first}, some held by other processes)")
                uid = self._next
                self._next += 1
                if self._reserve(uid):
                    return uid

    def _reserve(self, uid: int) -> bool:
        d = uid_lock_dir()
        if self._dir is None or self._dir[0] != d:
            if self._dir is not None:
                os.close(self._dir[1])
            self._dir = (d, open_lock_dir(d))
        try:
            fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self._dir[1])
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symlink where the lock file goes: not ours to use
                return False
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._reserved[uid] = fd
        return True

    def give(self, uid: int) -> None:
        with self._lock:
            if uid not in self._free:
                self._free.append(uid)

    def userns_fd(self, uid: int) -> int:
        """An fd of a user namespace mapping ns id 0 to host ``uid`` (cached per uid)."""
        with self._lock:
            fd = self._userns_fd.get(uid)
        if fd is None:
            fd = _make_userns(uid)
            with self._lock:
                self._userns_fd[uid] = fd
        return fd


def _make_userns(uid: int) -> int:
    proc = subprocess.Popen(["unshare", "--user", "sleep", "60"], stdin=subprocess.DEVNULL)
    try:
        own = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/ns/user") == own:  # wait until it has unshared
            if time.monotonic() > deadline or proc.poll() is not None:
                raise OSError("could not create a user namespace with `unshare --user`")
            time.sleep(0.0005)
        Path(f"/proc/{proc.pid}/uid_map").write_text(f"0 {uid} 1\n")
        Path(f"/proc/{proc.pid}/gid_map").write_text(f"0 {uid} 1\n")
        return os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        proc.kill()
        proc.wait()


UID_POOL = UidPool()


def idmapped_clone(src: str | os.PathLike[str], dst: str | os.PathLike[str], uid: int, *,
                   made: bool = False) -> None:
    """Bind ``src`` at ``dst`` (created, unless ``made``: it exists) with host root's files
    shown as owned by ``uid``."""
    if not made:
        Path(dst).mkdir(exist_ok=True)
    _clone(src, dst, _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, UID_POOL.userns_fd(uid)), 0,
           f"idmapping {src}")


def bind_clone(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
               readonly: bool) -> None:
    """Bind ``src`` and every mount below it at the existing directory ``dst``: nosuid, nodev,
    and read-only throughout when ``readonly`` (one syscall for the whole tree)."""
    flags = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | (_MOUNT_ATTR_RDONLY if readonly else 0)
    _clone(src, dst, _MountAttr(flags, 0, 0, 0), _AT_RECURSIVE, f"attributes of {src}")


def _clone(src: str | os.PathLike[str], dst: str | os.PathLike[str], attr: _MountAttr,
           recursive: int, what: str) -> None:
    fd = _check(_libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(src),
                              _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | recursive),
                f"open_tree {src}")
    try:
        _check(_libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH | recursive,
                             ctypes.byref(attr), ctypes.sizeof(attr)), what)
        _check(_libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, os.fsencode(dst),
                             _MOVE_MOUNT_F_EMPTY_PATH), f"move_mount to {dst}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def as_fsuid(uid: int | None) -> Iterator[None]:
    """Do file operations in this thread as ``uid`` (files created are that sandbox's)."""
    if uid is None or os.geteuid() != 0:
        yield
        return
    _libc.setfsgid(uid)
    _libc.setfsuid(uid)
    try:
        yield
    finally:
        _libc.setfsuid(0)
        _libc.setfsgid(0)
