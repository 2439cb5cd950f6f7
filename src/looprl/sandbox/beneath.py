"""Open paths under a directory without ever leaving it, even while what is inside changes.

The host reads, writes and lists a sandbox's workspace while its commands run and may rename
anything there. Checking a path first (``realpath``) and opening it next leaves a window in which
a directory on the way can become a symlink to the host, and the host — root — would follow it.
Here every lookup is one ``openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`` relative to an fd
of the directory (Linux ≥ 5.6): the kernel refuses, atomically, any resolution that would leave it
(``EXDEV``), and symlinks that stay inside still work. Where ``openat2`` is missing, each
component is opened with ``O_NOFOLLOW`` from the previous one instead: no symlink is followed at
all (``ELOOP``/``ENOTDIR``), which is stricter but just as safe.

    root = os.open(workspace, os.O_PATH | os.O_DIRECTORY)
    fd = open_beneath(root, "src/pkg/a.py", os.O_RDONLY)      # OSError(EXDEV) on an escape
    dfd = makedirs_beneath(root, "src/new")                    # creates what is missing
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os

_SYS_OPENAT2 = 437  # the same number on x86-64, aarch64 and the other generic-table machines
_RESOLVE_NO_MAGICLINKS, _RESOLVE_BENEATH = 0x02, 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.lru_cache(maxsize=1)
def has_openat2() -> bool:
    """Whether this kernel has ``openat2`` (else the component walk is used)."""
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.close(_openat2(root, ".", os.O_PATH, 0))
    except OSError as e:
        return e.errno not in (errno.ENOSYS, errno.EPERM)  # EPERM: a seccomp filter denies it
    finally:
        os.close(root)
    return True


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0,
                   _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = _libc().syscall(_SYS_OPENAT2, ctypes.c_int(dir_fd), os.fsencode(path),
                         ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def open_beneath(dir_fd: int, path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags, mode)`` resolved strictly under ``dir_fd`` (a relative ``path``);
    ``OSError`` as ``os.open`` raises it, ``EXDEV`` for a resolution that would leave."""
    if os.path.isabs(path):
        raise OSError(errno.EXDEV, "absolute path", path)
    if has_openat2():
        while True:
            try:
                return _openat2(dir_fd, path, flags, mode)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EINTR):  # EAGAIN: a rename raced it
                    raise
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OSError(errno.EXDEV, "'..' in path", path)
    cur = dir_fd
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=cur)
            if cur != dir_fd:
                os.close(cur)
            cur = nxt
        last = parts[-1] if parts else "."
        return os.open(last, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=cur)
    finally:
        if cur != dir_fd:
            os.close(cur)


def makedirs_beneath(dir_fd: int, path: str) -> int:
    """An ``O_PATH`` fd of directory ``path`` under ``dir_fd``, creating what is missing (mode
    0755, owned per the caller's fsuid); never creates or opens anything outside."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done = ""
    for part in parts:
        nxt = f"{done}/{part}" if done else part
        try:
            os.close(open_beneath(dir_fd, nxt, os.O_PATH | os.O_DIRECTORY))
        except FileNotFoundError:
            parent = open_beneath(dir_fd, done or ".", os.O_PATH | os.O_DIRECTORY)
            try:
                os.mkdir(part, 0o755, dir_fd=parent)
            except FileExistsError:
                pass  # made meanwhile: opened (and checked) below
            finally:
                os.close(parent)
        done = nxt
    return open_beneath(dir_fd, done or ".", os.O_PATH | os.O_DIRECTORY)
