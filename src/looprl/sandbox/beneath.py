"""The one way looprl's host side touches a tree an agent can shape: ``Root``.

The host (root, with per-sandbox uids) reads, writes, stats, lists and diffs a sandbox's
workspace while its commands may rename anything there, and the grader reads a task's base at
paths taken from an agent's diff. Checking a path first (``realpath``) and opening it next leaves
a window in which a directory on the way becomes a symlink to the host; following a symlink
that is *already* there reads the host's file as root. Every lookup here is therefore one
``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` relative to an fd of the tree's root (Linux
≥ 5.6): the kernel refuses, atomically, a resolution that would leave the root (``EXDEV``) or go
through any symlink (``ELOOP``). Where ``openat2`` is missing (or a seccomp filter denies it),
each component is opened with ``O_NOFOLLOW`` from the previous one's fd: the same rule.

What a symlink in the tree means here — what it means to git:

- a symlink as the *last* component is an entry of its own: ``lstat`` and ``blob`` see the link
  (a diff shows it as git does: mode 120000 and its target's text), never what it points to;
  ``read`` refuses it (``ELOOP``); ``write`` replaces the link with a regular file (the link's
  target is never touched);
- a symlink *on the way* (``pkg`` in ``pkg/mod.py``, where ``pkg`` is a link) means there is no
  such entry: ``lstat``/``blob`` say absent, ``read``/``write``/``open`` refuse it (``ELOOP``)
  — whether the link stays in the tree or not. Commands inside the sandbox follow in-tree links
  as usual (the kernel resolves them in the sandbox's own view); only the host side does not.
- ``walk`` lists links as entries and never enters them; it opens each directory anew beneath
  the root with the same rule (``O_DIRECTORY``: a name swapped for a device is refused before
  any driver sees an open), so a directory swapped for a link while it walks is skipped.

    with Root(workspace.path) as ws:
        blob = ws.blob("pkg/mod.py")      # (data, mode); None: absent, a directory, under a link
        ws.write("src/new.py", b"x = 1\\n")      # parents made; OSError(ELOOP) through a link
        for rel_dir, dir_fd, entries in ws.walk():
            ...

What this does NOT protect against: the root path itself is opened as given (the caller's, e.g.
a workspace's mount point or a task's base directory: trusted); mount points inside the tree
are crossed (a sandbox cannot make mounts the host sees); a hard link inside the tree to a file
elsewhere is read as a file (a sandbox can only link files on its own filesystem, the
workspace); a tree listed while commands run may mix states (each lookup is safe, the listing as
a whole is not a snapshot: ``BwrapSandbox.snapshot`` stops commands first); files are read whole
(their size is bounded by the sandbox's file-size limit, not here).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import io
import os
import posixpath
import stat
from collections.abc import Iterator

from looprl.diffs import Blob

_SYS_OPENAT2 = 437  # the same number on x86-64, aarch64 and the other generic-table machines
_RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x04, 0x08
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV, errno.ENAMETOOLONG)
"""Errors that mean "no entry at this path beneath the root" (ELOOP: a link on the way)."""



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
                   _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS)
    fd = _libc().syscall(_SYS_OPENAT2, ctypes.c_int(dir_fd), os.fsencode(path),
                         ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def open_beneath(dir_fd: int, path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags, mode)`` resolved strictly under ``dir_fd`` (a relative ``path``),
    following no symlink in any component; ``OSError`` as ``os.open`` raises it, ``EXDEV`` for a
    resolution that would leave, ``ELOOP`` for a symlink on the way (or as the last component,
    unless ``flags`` has ``O_PATH | O_NOFOLLOW``: then the fd is the link's own)."""
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
            nxt = _open_component(part, os.O_PATH | os.O_DIRECTORY, 0, cur, path)
            if cur != dir_fd:
                os.close(cur)
            cur = nxt
        return _open_component(parts[-1] if parts else ".", flags, mode, cur, path)
    finally:
        if cur != dir_fd:
            os.close(cur)


def _open_component(name: str, flags: int, mode: int, dir_fd: int, path: str) -> int:
    """One step of the component walk; a symlink is ``ELOOP``, as openat2 reports it (with
    ``O_DIRECTORY`` the kernel says ``ENOTDIR`` for one)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except NotADirectoryError:
        try:
            link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            link = False
        if link:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None
        raise


def makedirs_beneath(dir_fd: int, path: str) -> int:
    """An ``O_PATH`` fd of directory ``path`` under ``dir_fd``, creating what is missing (mode
    0755, owned per the caller's fsuid); never creates or opens anything outside, nor through a
    symlink (``ELOOP``)."""
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


def _git_mode(st: os.stat_result) -> int:
    return 0o100755 if st.st_mode & 0o111 else 0o100644


class Root:
    """A directory that paths are resolved beneath by the rules of the module docstring; its fd
    is held until ``close`` (or the end of a ``with`` block). Paths are relative to it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, rel: str, flags: int, mode: int = 0o644) -> int:
        """``open_beneath`` from this root."""
        return open_beneath(self.fd, rel, flags, mode)

    def lstat(self, rel: str) -> os.stat_result | None:
        """The entry at ``rel`` itself (a symlink as a symlink), or None when there is none
        beneath the root (absent, under a non-directory or a link, or leaving the root)."""
        fd = self._entry(rel)
        if fd is None:
            return None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _entry(self, rel: str) -> int | None:
        """An ``O_PATH`` fd on the entry at ``rel`` itself (a symlink as a symlink), or None
        when there is none beneath the root."""
        try:
            return self.open(rel, os.O_PATH | os.O_NOFOLLOW)
        except OSError as e:
            if e.errno in _ABSENT:
                return None
            raise

    def read(self, rel: str, last: int | None = None) -> bytes:
        """The bytes of the regular file at ``rel`` (its ``last`` bytes only, when given: a log
        the agent may have made huge). ``OSError``: ``ELOOP`` for a symlink (on the way or as
        the file), ``EISDIR`` for a directory, ``EINVAL`` for anything else that is not a
        regular file (a FIFO is never waited on)."""
        fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory", rel)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", rel)
            if last is not None:
                os.lseek(fd, max(0, st.st_size - last), os.SEEK_SET)
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read()
            return data if last is None else data[-last:]
        finally:
            os.close(fd)

    def read_text(self, rel: str, errors: str = "strict") -> str:
        """``read``, decoded as ``Path.read_text`` decodes (UTF-8, universal newlines)."""
        return io.TextIOWrapper(io.BytesIO(self.read(rel)), encoding="utf-8", errors=errors).read()

    def blob(self, rel: str) -> Blob | None:
        """What git would store for ``rel`` (``diffs.Blob``): a file's bytes (mode 100644 or
        100755), a symlink's target (120000); None when there is no file or link there (absent,
        a directory, a link on the way, anything else)."""
        for _ in range(3):  # a command may swap a file and a link under us: judged anew
            fd = self._entry(rel)
            if fd is None:
                return None
            try:
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode):
                    return os.readlink(b"", dir_fd=fd), 0o120000
                if not stat.S_ISREG(st.st_mode):
                    return None
            finally:
                os.close(fd)
            try:  # opened again to read (an O_PATH fd cannot be), by the same rules
                return self.read(rel), _git_mode(st)
            except OSError as e:
                if e.errno not in (*_ABSENT, errno.EISDIR, errno.EINVAL):
                    raise
                if e.errno != errno.ELOOP:
                    return None
        return None

    def write(self, rel: str, data: bytes) -> None:
        """Make ``rel`` a regular file holding ``data``: missing parents are made, an existing
        file is truncated (its mode kept), a symlink there is replaced (its target untouched).
        ``OSError``: ``ELOOP`` for a symlink on the way, ``EISDIR`` for a directory."""
        parent, name = posixpath.split(posixpath.normpath(rel))
        if name in ("", ".", ".."):
            raise IsADirectoryError(errno.EISDIR, "not a file name", rel)
        dfd = makedirs_beneath(self.fd, parent)
        try:
            fd = self._create(dfd, name, rel)
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", rel)
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(data)
        finally:
            os.close(fd)

    @staticmethod
    def _create(dfd: int, name: str, rel: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(3):  # a command may put a link back between the unlink and the create
            try:  # (O_NONBLOCK: a FIFO fails, never blocks)
                return os.open(name, flags, 0o644, dir_fd=dfd)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
            try:
                os.unlink(name, dir_fd=dfd)  # the link itself (unlink never follows one)
            except FileNotFoundError:
                pass
            flags |= os.O_EXCL
        raise OSError(errno.ELOOP, "a symlink kept reappearing", rel)

    def walk(self, rel: str = ".") -> Iterator[tuple[str, int, list[tuple[str, os.stat_result]]]]:
        """Top-down over directory ``rel`` and every directory below it: ``(dir, fd, entries)``
        with ``dir`` relative to the root ('.' for the root), ``fd`` an open fd of it (valid
        until the next step) and ``entries`` its (name, lstat) pairs, sorted; remove a
        directory's pair from ``entries`` to skip it. Links are entries, never entered.
        ``OSError`` when ``rel`` itself is not a directory beneath the root (``ELOOP``: a link)."""
        top = posixpath.normpath(rel)
        stack = [top]
        while stack:
            d = stack.pop()
            try:
                fd = self.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
            except OSError as e:
                if d == top or e.errno not in _ABSENT:
                    raise
                continue  # removed, or swapped for a link or a file, since its parent was read
            try:
                entries = []
                with os.scandir(fd) as it:
                    for entry in it:
                        try:
                            entries.append((entry.name, entry.stat(follow_symlinks=False)))
                        except FileNotFoundError:
                            continue  # removed by a running command
                entries.sort(key=lambda e: e[0])
                yield d, fd, entries
            finally:
                os.close(fd)
            stack.extend(name if d == "." else f"{d}/{name}"
                         for name, st in reversed(entries) if stat.S_ISDIR(st.st_mode))

    def files(self, rel: str = ".", skip: frozenset[str] = frozenset()) -> list[str]:
        """Every entry below directory ``rel`` that is not a directory (files, links, ...), as
        root-relative paths; directories named in ``skip`` are not entered. [] when ``rel`` is
        not a directory beneath the root."""
        st = self.lstat(rel)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return []
        out = []
        for d, _, entries in self.walk(rel):
            entries[:] = [e for e in entries if e[0] not in skip or not stat.S_ISDIR(e[1].st_mode)]
            out += [name if d == "." else f"{d}/{name}"
                    for name, st in entries if not stat.S_ISDIR(st.st_mode)]
        return out

    def link_on_path(self, rel: str) -> tuple[str, str] | None:
        """The first symlink among ``rel``'s components and its target (for error messages), or
        None when there is none."""
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            st = self.lstat(prefix)
            if st is None:
                return None
            if stat.S_ISLNK(st.st_mode):
                link = self.blob(prefix)
                return prefix, os.fsdecode(link[0] if link else b"")
        return None
