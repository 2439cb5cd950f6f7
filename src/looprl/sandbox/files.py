"""The file half of a ``Sandbox`` whose workspace lives on the host: read, write and walk go
through ``beneath.Root`` (no lookup leaves the workspace), whatever runs the commands.

    class MySandbox(WorkspaceFiles):         # sets workspace, workdir, _root; has _check_open
        ...
    await sb.read("src/a.py"); await sb.write("b.txt", b"x"); await sb.walk("src")

``BwrapSandbox`` and ``ContainerSandbox`` share it, so a tool call sees the same files and
gets the same one-line errors under either backend. A path is refused before any lookup when
it is absolute, has ``..``, a NUL or is not text; ``Root`` refuses the rest (symlinks are not
followed; the error names the link and where it leads, as commands see it at ``workdir``).

What this does NOT protect against: a command swapping a path's components between this
check and the lookup is handled by ``Root`` (openat2 / per-component ``O_NOFOLLOW``), not
here; files a command makes are as the command left them (modes, sizes up to the disk).
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import stat
from pathlib import PurePosixPath
from typing import Literal

from looprl.errors import PathEscapeError, ToolError
from looprl.sandbox.beneath import Root
from looprl.sandbox.idmap import as_fsuid
from looprl.sandbox.workspace import IGNORED_NAMES, Workspace
from looprl.types import FileEntry


class WorkspaceFiles:
    """``read``/``write``/``walk`` of the ``Sandbox`` protocol over ``workspace`` on the host."""

    workspace: Workspace
    workdir: str
    """Where commands see the workspace (for the error that says where a symlink leads)."""
    _root: str
    """The workspace's real path, as made."""

    def _check_open(self) -> None:
        raise NotImplementedError

    def _check_path(self, path: str) -> str:
        """``path`` normalised, or the model's ``ToolError`` for one no lookup may take; the
        lookup itself (``beneath.Root``) is what keeps every access inside the workspace."""
        self._check_open()
        if not isinstance(path, str) or not path or "\0" in path:
            raise ToolError(f"invalid path {path!r}: give a workspace-relative path like 'src/a.py'")
        try:
            os.fsencode(path)
        except UnicodeEncodeError:  # a lone surrogate no file name can hold
            raise ToolError(f"invalid path {ascii(path)[:100]}: not valid Unicode text") from None
        p = PurePosixPath(path)
        if p.is_absolute():
            raise PathEscapeError(f"path {path!r} is absolute; use a path relative to the workspace root")
        if ".." in p.parts:
            raise PathEscapeError(f"path {path!r} contains '..'; paths must stay inside the workspace")
        return str(p)

    def _os_error(self, ws: Root, path: str, e: OSError) -> ToolError:
        if e.errno == errno.ENOENT:
            return ToolError(f"file not found: {path}")
        if e.errno == errno.ELOOP:
            link = ws.link_on_path(path)
            if link is None:  # (gone again: a command is swapping it)
                return PathEscapeError(f"path {path!r} goes through a symlink; the file tools "
                                       "do not follow symlinks")
            name, target = link
            # where it leads, as commands see it (the workspace is mounted at ``workdir``)
            inner = posixpath.join(self.workdir, posixpath.dirname(name), target,
                                   path[len(name) + 1:])
            where = posixpath.relpath(posixpath.normpath(inner), self.workdir)
            hint = ("it leads outside the workspace" if where == ".." or where.startswith("../")
                    else f"use the path it points to ({where!r})")
            what = "is a symlink" if name == path else f"goes through the symlink {name!r}"
            return PathEscapeError(f"path {path!r} {what} (-> {target!r}); the file tools do not "
                                   f"follow symlinks: {hint}")
        if e.errno == errno.EXDEV:
            return PathEscapeError(f"path {path!r} resolves outside the workspace")
        if e.errno == errno.EISDIR:
            return ToolError(f"{path} is a directory, not a regular file")
        if e.errno == errno.EINVAL:
            return ToolError(f"{path} is not a regular file")
        return ToolError(f"cannot access {path}: {e.strerror}")

    async def read(self, path: str) -> bytes:
        rel = self._check_path(path)
        with Root(self._root) as ws:
            try:
                return ws.read(rel)
            except OSError as e:
                raise self._os_error(ws, path, e) from None

    async def write(self, path: str, data: bytes) -> None:
        rel = self._check_path(path)
        if rel == ".":
            raise ToolError("cannot write to the workspace root; name a file")
        await asyncio.to_thread(self._write_as_owner, path, rel, data)

    def _write_as_owner(self, path: str, rel: str, data: bytes) -> None:
        with as_fsuid(self.workspace.uid), Root(self._root) as ws:  # new files: the sandbox's
            try:
                ws.write(rel, data)
            except OSError as e:
                raise self._os_error(ws, path, e) from None

    async def walk(self, under: str = ".", *, max_entries: int = 100_000) -> list[FileEntry]:
        rel = self._check_path(under)
        out: list[FileEntry] = []
        with Root(self._root) as ws:
            try:
                for d, _, entries in ws.walk(rel):
                    entries[:] = [e for e in entries if e[0] not in IGNORED_NAMES
                                  or not stat.S_ISDIR(e[1].st_mode)]
                    for name, st in entries:
                        kind: Literal["file", "dir", "link"] = (
                            "link" if stat.S_ISLNK(st.st_mode) else
                            "dir" if stat.S_ISDIR(st.st_mode) else "file")
                        out.append(FileEntry(name if d == "." else f"{d}/{name}", kind,
                                             st.st_size if kind == "file" else 0))
                        if len(out) >= max_entries:
                            return sorted(out, key=lambda e: e.path)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise ToolError(f"{under} is not a directory in the workspace") from None
                raise self._os_error(ws, under, e) from None
        return sorted(out, key=lambda e: e.path)
