"""TEST DOUBLE of the ``Sandbox`` protocol: a temp copy of a directory, commands run with plain
``subprocess`` (NO isolation). For harness tests only; the real sandbox is ``looprl.sandbox``.

It enforces the protocol's path rules (workspace-relative, no escape through '..' or symlinks)
so the tools' error messages can be tested without bubblewrap.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from looprl.diffs import REGULAR, blob_diff
from looprl.errors import PathEscapeError
from looprl.types import ExecResult, FileEntry

SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
VENV_BIN = str(Path(sys.executable).parent)


def _cap(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[: limit // 2] + "\n[... output truncated ...]\n" + text[-limit // 2:], True


class DirSandbox:
    tools_dir = VENV_BIN  # the harness's ruff: the venv's, as commands here run on the host

    def __init__(self, base_dir: str | Path, *, output_limit: int = 200_000) -> None:
        self.base = Path(base_dir)
        self._tmp = tempfile.mkdtemp(prefix="looprl-dirsb-")
        self.root = Path(self._tmp) / "ws"
        shutil.copytree(self.base, self.root, symlinks=True)
        self.output_limit = output_limit

    def _resolve(self, path: str) -> Path:
        if os.path.isabs(path):
            raise PathEscapeError(f"{path!r} is absolute")
        full = (self.root / path)
        real = Path(os.path.realpath(full))
        root = Path(os.path.realpath(self.root))
        if real != root and root not in real.parents:
            raise PathEscapeError(f"{path!r} resolves outside the workspace")
        return full

    async def exec(self, cmd: str, *, timeout_s: float = 60.0,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        t0 = time.monotonic()
        full_env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": self._tmp, "LANG": "C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", cmd, cwd=self.root, env=full_env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        timed_out = False
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = await proc.communicate()
        except asyncio.CancelledError:  # the agent's wall clock ran out: leave nothing running
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        stdout, t1 = _cap(out.decode("utf-8", "replace"), self.output_limit)
        stderr, t2 = _cap(err.decode("utf-8", "replace"), self.output_limit)
        return ExecResult(None if timed_out else proc.returncode, stdout, stderr, timed_out,
                          t1 or t2, time.monotonic() - t0)

    async def read(self, path: str) -> bytes:
        return self._resolve(path).read_bytes()

    async def write(self, path: str, data: bytes) -> None:
        full = self._resolve(path)
        full.parent.mkdir(parents=True, exist_ok=True)
        self._resolve(path)  # the parents may have been links out
        full.write_bytes(data)

    async def walk(self, under: str = ".", *, max_entries: int = 100_000) -> list[FileEntry]:
        top = self._resolve(under)
        if not top.exists():
            raise FileNotFoundError(under)
        if not top.is_dir():
            raise NotADirectoryError(under)
        return _walk(self.root, top, max_entries)

    async def diff(self) -> str:
        return tree_diff(self.base, self.root)

    async def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def _walk(root: Path, top: Path, max_entries: int) -> list[FileEntry]:
    out: list[FileEntry] = []
    for d, dirs, files in os.walk(top):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        for name in dirs + sorted(files):
            p = Path(d) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out.append(FileEntry(rel, "link"))
            elif p.is_dir():
                out.append(FileEntry(rel, "dir"))
            else:
                out.append(FileEntry(rel, "file", p.stat().st_size))
        dirs[:] = [x for x in dirs if not (Path(d) / x).is_symlink()]
    out.sort(key=lambda e: e.path)
    return out[:max_entries]


def _files(root: Path) -> dict[str, bytes]:
    return {e.path: (root / e.path).read_bytes() for e in _walk(root, root, 10**9) if e.kind == "file"}


def tree_diff(base: Path, work: Path) -> str:
    """The git diff of ``work`` against ``base``, written as the real sandbox writes it."""
    a, b = _files(base), _files(work)
    return "".join(blob_diff(p, (a[p], REGULAR) if p in a else None,
                             (b[p], REGULAR) if p in b else None) for p in sorted({*a, *b}))
