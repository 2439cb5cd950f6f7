"""The launcher that starts each sandboxed command: one small exec before bubblewrap.

A command's process must join its cgroups, get its rlimits and drop to the sandbox's host uid
before bwrap runs — in that order, in the process itself, so nothing it forks escapes. Doing that
with stock tools costs three execs (``sh`` to join the cgroups, ``prlimit``, ``setpriv``); this
module builds a small C helper (``launch.c``) once (cached under ``LOOPRL_HOME/bin``, keyed by its source) that
does all three in one exec, then reads the command line to run from a pipe and execs it:

    looprl-launch [-c CGROUP_PROCS]... [-r RES:SOFT:HARD]... [-u UID] -w FD
    looprl-launch [-c ...]... [-r ...]... [-u UID] -- PROGRAM ARGS...      (exec it right away)
    looprl-launch -x -w FD [-s FD]   (the message is CWD, KEY=VALUE..., "", then the command
                                      line; -s: run it as a child and report on FD (below);
                                      a program without a / is looked up on the message's PATH,
                                      and run by /bin/sh -c when it is found nowhere)

The last two together prepare a whole sandboxed command ahead: the launcher sets up and execs
bwrap at once, and inside the sandbox a copy of it (``-x``) waits for the working directory,
environment and command line (``encode_message``), so a command pays neither for the setup nor
for bwrap's namespaces (``root.py`` says how the workspace reaches a bwrap started before it).

Reading the command line *after* the setup is what lets a sandbox keep one launcher *prepared*:
spawned, already in fresh cgroups with fresh rlimits and the sandbox's uid, blocked on its pipe.
Joining a cgroup v1 costs an RCU grace period (~1 ms idle, 10+ ms on a loaded host); a prepared
launcher has paid it before the command arrives. A prepared launcher that is never used sees EOF
on its pipe (sandbox closed, or this process died) and exits 0 without running anything.

Whether a command ran is told by a status channel, never by its output (a command can print
anything, ``bwrap: ...`` included): a pipe only the machinery writes to, read as ``LaunchStatus``.
A ``-s`` launcher writes ``R`` once the sandbox is up (before it forks the child that will run
the command), then either the command's exit status (128+N: killed by signal N) or ``F`` and why
it failed (the child reports its own failures on a close-on-exec pipe, so a command that
started can report nothing there). ``R`` with no end is a command that killed its launcher: its
own doing. Without a ``-s`` launcher, bubblewrap's own ``--json-status-fd`` tells: it writes an
``exit-code`` only for a command it started. The command cannot reach either channel (held by
the launcher, undumpable; closed in bwrap's child). No report that the command started means
the machinery failed: infrastructure.

Without a C compiler (or with ``LOOPRL_SANDBOX_LAUNCHER=tools``), ``launcher_path()`` is None and
``bwrap.py`` falls back to the stock-tool chain (``tool_chain``), with no prepared launchers.
``Prepared`` is a plain ``Popen`` (bound to no event loop); ``pump``/``Capped`` read its output
with a cap.

    path = launcher_path()                     # None: no cc here
    argv = [path, "-c", procs, "-r", "7:1024:1024", "-u", "200001", "-w", "3"]
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from looprl import paths
from looprl.errors import SandboxError, ToolError
from looprl.sandbox.cgroups import Cgroup

MAX_ARG_BYTES = 131_072
"""The kernel's limit on one argument or environment string, its NUL included (MAX_ARG_STRLEN):
a longer one fails the exec, which would read as the machinery failing."""

_SOURCE_FILE = Path(__file__).with_name("launch.c")
"""The launcher's C source, shipped as package data (``pyproject.toml``) and compiled on first use."""


@functools.lru_cache(maxsize=1)
def launcher_path() -> str | None:
    """Path of the compiled launcher (built on first use), or None where no C compiler works."""
    if os.environ.get("LOOPRL_SANDBOX_LAUNCHER") == "tools":  # force the stock-tool chain
        return None
    source = _SOURCE_FILE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    out = paths.sub("bin") / f"looprl-launch-{digest}"
    if out.is_file() and _trusted(out):
        return str(out)
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory(prefix="looprl-cc-") as tmp:
        src, exe = Path(tmp) / "launch.c", Path(tmp) / "launch"
        src.write_bytes(source)
        r = subprocess.run([cc, "-O2", "-o", str(exe), str(src)], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            return None
        os.chmod(exe, 0o755)
        tmp_out = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        shutil.copy2(exe, tmp_out)
        os.replace(tmp_out, out)  # atomic: concurrent builders never see half a binary
    return str(out)


def _trusted(path: Path) -> bool:
    """Ours and writable by no one else: it runs with our privileges (root, for per-sandbox uids)."""
    st = path.stat()
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022 and os.access(path, os.X_OK)


def launcher_argv(path: str, procs_files: list[str], rlimits: list[tuple[int, int, int]],
                  uid: int | None, wait_fd: int) -> list[str]:
    """Argument vector of the launcher: join ``procs_files``, set ``rlimits``, become ``uid``."""
    argv = [path]
    for f in procs_files:
        argv += ["-c", f]
    for res, soft, hard in rlimits:
        argv += ["-r", f"{res}:{soft}:{hard}"]
    if uid is not None:
        argv += ["-u", str(uid)]
    return [*argv, "-w", str(wait_fd)]


def encode_argv(argv: list[str]) -> bytes:
    """The command line as the launcher reads it: each argument NUL-terminated (encoded as
    ``os.fsencode`` does). An argument no exec can take is the caller's ``ToolError``."""
    for a in argv:
        if "\0" in a:
            raise ToolError(f"command contains a NUL byte: {a[:80]!r}; remove it")
    data = os.fsencode("\0".join(argv) + "\0") if argv else b""
    longest = max((len(a) for a in data.split(b"\0")), default=0)
    if longest >= MAX_ARG_BYTES:
        raise ToolError(f"a command line argument of {longest} bytes is longer than the kernel "
                        f"takes ({MAX_ARG_BYTES - 1}); write long input to a file and read that")
    return data


def check_env(env: Mapping[str, str]) -> None:
    """``ToolError`` for a variable no process environment can hold."""
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise ToolError(f"invalid environment variable {k!r}: names need no '=' or NUL")


def encode_message(cwd: str, env: Mapping[str, str], argv: list[str]) -> bytes:
    """What a ``-x`` launcher reads: the working directory, the environment, the command line."""
    check_env(env)
    return encode_argv([cwd, *(f"{k}={v}" for k, v in env.items())]) + b"\0" + encode_argv(argv)


def launcher_exec_argv(path: str, procs_files: list[str], rlimits: list[tuple[int, int, int]],
                       uid: int | None, program: list[str]) -> list[str]:
    """Argument vector of a launcher that sets up and then execs ``program`` at once."""
    return [*launcher_argv(path, procs_files, rlimits, uid, 0)[:-2], "--", *program]


@dataclass(frozen=True)
class LaunchStatus:
    """What a command's status channel said (module docstring): whether the command itself ran,
    and how it ended."""

    started: bool
    """The command was executed: how it ends is its own doing. False: the machinery failed."""
    code: int | None = None
    """Its exit status (128+N: killed by signal N); None when not reported."""
    failure: str = ""
    """The launcher's own account of why it could not start the command."""


def parse_status(data: bytes) -> LaunchStatus:
    """Read a status channel: a ``-s`` launcher's lines or bubblewrap's JSON records.

    >>> parse_status(b"R\\n3\\n")
    LaunchStatus(started=True, code=3, failure='')
    >>> parse_status(b"R\\n")  # the command ran and killed its launcher: its own doing
    LaunchStatus(started=True, code=None, failure='')
    >>> parse_status(b"R\\nF looprl-launch: chdir /w: No such file or directory\\n").started
    False
    >>> parse_status(b'{ "child-pid": 7 }\\n{ "exit-code": 1 }\\n').code
    1
    >>> parse_status(b'{ "child-pid": 7 }\\n').started  # bwrap could not set up or exec
    False
    """
    ready, code, failure = False, None, ""
    for line in data.decode(errors="replace").splitlines():
        line = line.strip()
        if line == "R":
            ready = True
        elif line.startswith("F "):
            failure = line[2:].strip() or "the launcher failed"
        elif line.isdigit():
            code = int(line)
        elif line.startswith("{"):
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and isinstance(record.get("exit-code"), int):
                    code = record["exit-code"]
    started = not failure and (code is not None or ready)
    return LaunchStatus(started, code if started else None, failure)


class Prepared:
    """A spawned launcher for one command: set up, blocked on its pipe until ``go(argv)``.

    A plain ``subprocess.Popen`` (waited through a pidfd, its pipes read with ``add_reader``), so
    it is bound to no event loop: a sandbox made under one ``asyncio.run`` works under the next.
    ``cg`` is the command's ``Cgroup`` (owned: ``run_bwrap`` closes it). Dropping the object
    closes the pipe, so an unused launcher exits on its own. ``status``: the read end of its
    status channel (``read_status``), which a ``-s`` launcher or bwrap writes to.
    """

    def __init__(self, proc: subprocess.Popen[bytes], cg: Cgroup, ctl: BinaryIO | None,
                 status: int | None = None, seccomp_fd: int | None = None,
                 status_fd: int | None = None):
        self.proc = proc
        self.cg = cg
        self._ctl = ctl
        self.status = status
        self.seccomp_fd = seccomp_fd
        """The fd number, in the launcher, of the seccomp program its bwrap is to read."""
        self.status_fd = status_fd
        """The fd number, in the launcher, of its status channel's write end (for bwrap's
        ``--json-status-fd``, when the command line is built after the spawn)."""

    @classmethod
    def spawn(cls, chain: list[str], cg: Cgroup, pipe: tuple[int, int] | None = None,
              status: tuple[int, int] | None = None, seccomp_fd: int | None = None) -> Prepared:
        """Start ``chain`` (stdout/stderr piped, in its own session). ``pipe``: the (read, write)
        ends of its command pipe: the child gets the read end, this side keeps the write end.
        ``status``: (read, write) ends of its status pipe: the child gets the write end (under
        the same number), this side reads the other, non-blocking.
        ``seccomp_fd``: handed to the child under the same number (the caller closes its own)."""
        keep = ([] if pipe is None else [pipe[0]]) + ([] if status is None else [status[1]])
        lend = keep + ([] if seccomp_fd is None else [seccomp_fd])
        ours = ([] if pipe is None else [pipe[1]]) + ([] if status is None else [status[0]])
        try:
            proc = subprocess.Popen(chain, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    pass_fds=lend)
        except (OSError, subprocess.SubprocessError) as e:
            for fd in ours:
                os.close(fd)
            raise SandboxError(f"could not start the sandbox launcher: {e}") from e
        finally:
            for fd in keep:
                os.close(fd)
        for f in (proc.stdout, proc.stderr):  # read by ``pump``/``drain``: never block on them
            assert f is not None
            os.set_blocking(f.fileno(), False)
        if status is not None:
            os.set_blocking(status[0], False)
        return cls(proc, cg, None if pipe is None else os.fdopen(pipe[1], "wb", buffering=0),
                   None if status is None else status[0], seccomp_fd,
                   None if status is None else status[1])

    def usable(self) -> bool:
        """Still waiting for its command."""
        return self._ctl is not None and self.proc.poll() is None

    async def go(self, data: bytes) -> None:
        """Hand the launcher its command line (``encode_argv``, or ``encode_message`` for a
        ``-x`` launcher); it execs it (no-op for a stock-tool chain)."""
        if self._ctl is None:
            return
        ctl, self._ctl = self._ctl, None
        try:
            if len(data) > 32_768:  # could fill the pipe while the launcher is still joining
                await asyncio.to_thread(ctl.write, data)
            else:
                ctl.write(data)
        except BrokenPipeError:
            pass  # the launcher died during setup: its stderr says why
        finally:
            ctl.close()

    async def wait(self) -> int:
        """Wait for the process to exit (without blocking the loop) and reap it."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        loop = asyncio.get_running_loop()
        fd = os.pidfd_open(self.proc.pid)  # not reaped yet: the pid is still ours
        exited = loop.create_future()
        loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
        try:
            await exited
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        return self.proc.wait()

    async def read_status(self) -> LaunchStatus:
        """What the status channel says, as soon as it tells how the command ended (or closes:
        everything holding its write end is gone)."""
        assert self.status is not None
        loop = asyncio.get_running_loop()
        buf = b""
        while True:
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self.status, _set_once, readable)
            try:
                await readable
            finally:
                loop.remove_reader(self.status)
            try:
                chunk = os.read(self.status, 4096)
            except BlockingIOError:
                continue
            buf += chunk
            st = parse_status(buf)
            if not chunk or (buf.endswith(b"\n") and (st.code is not None or st.failure)):
                return st

    def kill_now(self) -> None:
        """SIGKILL the process group, without waiting. (Its pid namespace dies with it; what
        is left in its cgroups is killed by ``discard``.)"""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def discard(self) -> None:
        """Done, or never used: close its pipes (unused, it exits 0 unrun), remove its cgroups
        and reap it."""
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        try:  # an unused launcher exits at EOF, once its setup is done (a few ms)
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.cg.close()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        if self.status is not None:
            os.close(self.status)
            self.status = None


_PRLIMIT_NAMES = {resource.RLIMIT_CPU: "cpu", resource.RLIMIT_AS: "as",
                  resource.RLIMIT_FSIZE: "fsize", resource.RLIMIT_NOFILE: "nofile",
                  resource.RLIMIT_NPROC: "nproc", resource.RLIMIT_CORE: "core"}


def tool_chain(rlimits: list[tuple[int, int, int]], procs_files: list[str],
               uid: int | None) -> list[str]:
    """The stock-tool exec chain before bwrap, used where the C launcher (``launch.py``) cannot
    be built: join the cgroups (sh), set rlimits (prlimit), drop to the sandbox's host uid
    (setpriv). Plain execs, so spawning never forks this (possibly large, torch-holding) Python
    process the slow way, as a ``preexec_fn`` would."""
    chain: list[str] = []
    if procs_files:  # join before anything else runs: every descendant is then counted
        script = " && ".join(f"echo $$ > {shlex.quote(f)}" for f in procs_files)
        chain += ["/bin/sh", "-c", script + ' && exec "$@"', "sh"]
    chain += ["prlimit", *(f"--{_PRLIMIT_NAMES[r]}={soft}:{hard}"
                           for r, soft, hard in rlimits), "--"]
    if uid is not None:  # last: an unprivileged host uid, so RLIMIT_NPROC and DAC apply
        chain += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    return chain


class Capped:
    """Keeps the first and last ``cap // 2`` bytes of a stream."""

    def __init__(self, cap: int):
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> tuple[str, bool]:
        tail = bytes(self.tail[-self.half:]) if self.tail else b""
        dropped = self.total - len(self.head) - len(tail)
        body = bytes(self.head) + (f"\n[... {dropped} bytes truncated ...]\n".encode()
                                   if dropped > 0 else b"") + tail
        return body.decode("utf-8", errors="replace"), dropped > 0


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def drain(f: BinaryIO, sink: Capped) -> None:
    """Read what a (non-blocking) pipe holds now into ``sink``, without waiting for EOF."""
    with contextlib.suppress(BlockingIOError, OSError, ValueError):
        while chunk := os.read(f.fileno(), 65536):
            sink.add(chunk)


async def pump(f: BinaryIO, sink: Capped) -> None:
    """Drain a non-blocking pipe (``Prepared.spawn`` makes them so) into ``sink`` until EOF, on
    the running loop (no thread)."""
    loop = asyncio.get_running_loop()
    fd = f.fileno()
    eof = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError as e:
            if not eof.done():
                eof.set_exception(e)
            return
        if chunk:
            sink.add(chunk)
        elif not eof.done():
            eof.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await eof
    finally:
        loop.remove_reader(fd)
