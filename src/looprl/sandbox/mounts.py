"""The mounts of a sandboxed command, as bwrap arguments: the read-only system (/usr, the /bin and
/lib* links, a small staged /etc), the workspace read-write, the task's venv read-only, and the
harness's own programs (``TOOLS_DIR``: ruff, which ``read_lints`` runs inside the sandbox, and
the grader's pytest runner).

    argv += [*system_binds(), *bind_args(workspace_dir, workdir, venv, staged=True)]
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from looprl.errors import SandboxError
from looprl.paths import installed_program
from looprl.sandbox.workspace import _mount_bind, _remove_tree, sandbox_root

_ETC_ENTRIES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime",
                "mime.types", "ssl/certs")


@functools.lru_cache(maxsize=1)
def system_layout() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The host's read-only system: directories to bind (/usr, and /bin, /lib* where they are
    directories) and (target, link) pairs for the /bin, /lib* entries that are symlinks."""
    dirs, links = ["/usr"], []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / name
        if p.is_symlink():
            links.append((os.readlink(p), str(p)))
        elif p.is_dir():
            dirs.append(str(p))
    return tuple(dirs), tuple(links)


@functools.lru_cache(maxsize=2)
def system_binds(links: bool = True) -> tuple[str, ...]:
    """bwrap arguments of the read-only system: /usr, the /bin and /lib* entries, an /etc.
    ``links=False``: leave the symlinks out (a ``SandboxRoot`` has them already)."""
    dirs, symlinks = system_layout()
    args: list[str] = []
    for d in dirs:
        args += ["--ro-bind", d, d]
    for target, link in symlinks if links else ():
        args += ["--symlink", target, link]
    return (*args, "--ro-bind", str(_staged_etc()), "/etc")


def _staged_etc() -> Path:
    """The sandbox's /etc: copies of the few host entries commands need plus our own passwd and
    group, in one directory — one bind mount instead of one per file (each costs ~0.5 ms per
    command). Built once per process (removed at exit, or by the janitor), so host changes to
    these files (e.g. ``ldconfig``) reach sandboxes of processes started after them."""
    etc = sandbox_root() / f"mnt-{os.getpid()}-etc"
    _remove_tree(etc)
    etc.mkdir(mode=0o755)
    atexit.register(_remove_tree, etc)
    for name in _ETC_ENTRIES:
        src, dst = Path("/etc") / name, etc / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dst)
    (etc / "passwd").write_text("root:x:0:0::/root:/bin/sh\nsandbox:x:1000:1000::/tmp:/bin/sh\n"
                                "nobody:x:65534:65534::/nonexistent:/bin/false\n")
    (etc / "group").write_text("root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n")
    for d, dirnames, filenames in os.walk(etc):
        for name in (".", *dirnames, *filenames):
            p = os.path.join(d, name)
            if not os.path.islink(p):
                os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)
    return etc


def venv_paths(venv: str | None) -> list[str]:
    """A venv's root and the interpreter prefix it links to (both mounted read-only)."""
    return [] if venv is None else list(_venv_paths(venv))


@functools.lru_cache(maxsize=256)
def _venv_paths(venv: str) -> tuple[str, ...]:
    v = Path(venv).absolute()
    if not (v / "bin").is_dir():
        raise SandboxError(f"venv {venv} has no bin/ directory; pass the venv's root directory "
                           "(the one holding pyvenv.cfg)")
    out = [str(v)]
    cfg = v / "pyvenv.cfg"
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            key, _, val = line.partition("=")
            if key.strip() == "home":
                prefix = Path(val.strip()).resolve().parent
                if prefix.is_dir() and not str(prefix).startswith("/usr"):
                    out.append(str(prefix))
    return tuple(out)


TOOLS_DIR = "/.looprl/bin"
"""Where a sandbox's commands find the harness's own programs (``harness_tools``), read-only, the
same whatever the task's environment holds: tools that run a program on model-written files run
it there, inside the sandbox (``read_lints``), not on the host."""


GRADER_RUNNER = Path(__file__).resolve().parents[1] / "rewards" / "pytest_runner.py"
"""The grader's pytest entry point (``rewards/isolation.py`` runs it by this name): a standalone
script bound as a file, so this layer imports nothing from the rewards layer."""


@functools.lru_cache(maxsize=1)
def harness_tools() -> tuple[tuple[str, str], ...]:
    """(name, host path) of the harness's programs every sandbox gets at ``TOOLS_DIR``: ruff, the
    one next to this Python (the harness's venv) or else on PATH (none when it is not installed:
    ``read_lints`` then says so), and ``GRADER_RUNNER``."""
    ruff = installed_program("ruff")
    ruff_tool = (("ruff", os.path.realpath(ruff)),) if ruff else ()
    return (*ruff_tool, (GRADER_RUNNER.name, str(GRADER_RUNNER)))


def tool_binds(staged: bool) -> list[str]:
    """bwrap arguments putting ``harness_tools`` at ``TOOLS_DIR`` (``staged``: see ``bind_args``)."""
    args: list[str] = []
    for name, host in harness_tools():
        src = f"{_staged(os.path.dirname(host))}/{os.path.basename(host)}" if staged else host
        args += ["--ro-bind", src, f"{TOOLS_DIR}/{name}"]
    return args


@dataclass(frozen=True)
class Mount:
    """A host directory a sandbox's commands also see, at ``target`` (absolute), e.g. a
    verifier's pristine tests read-only at /tests or its output directory at /logs. The host
    reads what a command left in a writable one only through ``beneath.Root``."""

    source: str
    target: str
    readonly: bool = True


def bind_args(host_dir: Path, workdir: str, venv: str | None, staged: bool,
              mounts: tuple[Mount, ...] = ()) -> list[str]:
    """bwrap bind arguments: the workspace read-write, the venv and its prefix read-only, the
    extra ``mounts``, the harness's programs (``tool_binds``). ``staged``: the bwrap runs
    unprivileged, so sources are first bind-mounted under the sandbox root, where it can reach
    them (e.g. a venv under a 0700 /root)."""
    args = ["--bind", str(host_dir), workdir]
    for p in venv_paths(venv):
        args += ["--ro-bind", _staged(p) if staged else p, p]
    for m in mounts:
        args += ["--ro-bind" if m.readonly else "--bind",
                 _staged(m.source) if staged else m.source, m.target]
    return [*args, *tool_binds(staged)]


@functools.lru_cache(maxsize=256)
def _staged(path: str) -> str:
    dst = sandbox_root() / f"mnt-{os.getpid()}-{hashlib.sha1(path.encode()).hexdigest()[:16]}"
    dst.mkdir(exist_ok=True)
    try:
        _mount_bind(path, dst)
    except OSError as e:
        raise SandboxError(f"cannot stage {path} for the sandbox: {e}") from e
    atexit.register(_remove_tree, dst)
    return str(dst)
