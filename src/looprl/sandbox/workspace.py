"""Copy-on-write workspaces over an immutable base directory (a task's repository).

A workspace is a writable view of ``base``. As root, it is a kernel overlayfs mount (lower = the
base, plus any frozen snapshot layers; upper/work on a small per-workspace tmpfs that doubles as a
disk quota): creating one costs a few milliseconds whatever the repository size. Elsewhere (not
root, overlay refused) it falls back to ``cp -a`` of the base; ``Workspace.cow_backend`` says which
one is in use and a log line reports the fallback.

    ws = create_workspace("/data/repos/attrs-23.1")     # ws.path is the writable tree
    snap = ws.snapshot()                                  # freeze the current state
    kids = fork(snap, 8)                                  # a group's G rollouts start here
    print(kids[0].diff())                                 # unified diff against the base
    for w in (ws, *kids): w.destroy()
    snap.release()

Given ``uid`` (``BwrapSandbox`` does, as root), the lower layers are idmapped so that host root's
files appear owned by that unprivileged uid, which owns the upper layer too (see ``idmap.py``).

Nothing leaks: every workspace and layer directory is named after its owner pid; ``destroy`` and
an atexit hook unmount and remove them, and ``janitor()`` (run once per process, on first use)
removes mounts and directories left behind by processes that died (e.g. killed with SIGKILL).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from looprl.diffs import blob_diff
from looprl.errors import SandboxError
from looprl.sandbox.beneath import Root
from looprl.sandbox.idmap import idmapped_clone

log = logging.getLogger(__name__)

CowBackend = Literal["overlay", "copy"]
IGNORED_NAMES = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git",
                           ".hypothesis", ".tox", ".nox"})
IGNORED_SUFFIXES = (".pyc", ".pyo")
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_lock = threading.Lock()
_live: weakref.WeakSet[Workspace] = weakref.WeakSet()
_layer_refs: dict[str, int] = {}
_janitor_done = False


def sandbox_root() -> Path:
    """Where workspaces, layers and sandbox roots live on the host: ``LOOPRL_SANDBOX_DIR``, by
    default /dev/shm/looprl-sandbox when running as root (the overlay backend) and /dev/shm is a
    tmpfs — they are mount points and small layers there, and a directory is made in ~5 us on
    tmpfs against 0.3-1 ms on this host's disk, several per sandbox — else under /tmp."""
    env = os.environ.get("LOOPRL_SANDBOX_DIR")
    p = Path(env) if env else _default_root()
    p.mkdir(parents=True, exist_ok=True)
    return _resolved(p)


def realpath(path: str | os.PathLike[str]) -> str:
    """``os.path.realpath(path)``; for a path that exists, as the kernel resolves it (open with
    O_PATH, read the fd's link): three syscalls, ~5x faster than resolving each component."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = ""
    finally:
        os.close(fd)
    # ("... (deleted)": removed meanwhile; not absolute: not a path, e.g. without /proc)
    return real if real.startswith("/") and not real.endswith(" (deleted)") else \
        os.path.realpath(path)


@functools.lru_cache(maxsize=16)
def _resolved(p: Path) -> Path:
    """``p`` with symlinks resolved, once per configured root: paths made under the root are
    then real as made (a sandbox does not resolve its workspace path again in every lease)."""
    return p.resolve()


@functools.lru_cache(maxsize=1)
def _default_root() -> Path:
    if _overlay_ok():
        with open("/proc/mounts") as f:
            if any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in f):
                return Path("/dev/shm/looprl-sandbox")
    return Path(tempfile.gettempdir()) / "looprl-sandbox"


# ---------------------------------------------------------------- mounts


def _mount(source: str, target: Path, fstype: str, options: str, flags: int = 0) -> None:
    rc = _libc.mount(source.encode(), str(target).encode(), fstype.encode(), flags,
                     options.encode())
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount -t {fstype} {target}: {os.strerror(err)} (options {options})")


def _mount_bind(source: str, target: Path) -> None:
    ms_bind, ms_rec = 4096, 16384
    if _libc.mount(source.encode(), str(target).encode(), None, ms_bind | ms_rec, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bind mount {source} on {target}: {os.strerror(err)}")


def _umount(target: Path) -> None:
    if _libc.umount2(str(target).encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mount point; ENOENT: already gone
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def mounts_under(prefix: Path) -> list[Path]:
    """Mount points at or below ``prefix``, deepest first (from /proc/self/mountinfo)."""
    out = []
    pre = str(prefix)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == pre or mp.startswith(pre + "/"):
                out.append(Path(mp))
    return sorted(out, key=lambda p: len(p.parts), reverse=True)


def _remove_tree(path: Path) -> None:
    for mp in mounts_under(path):
        _umount(mp)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def _overlay_ok() -> bool:
    return os.geteuid() == 0 and os.environ.get("LOOPRL_SANDBOX_COW", "auto") != "copy"


def _check_overlay_path(p: str) -> None:
    if any(c in p for c in ",:\\\n"):
        raise SandboxError(f"path {p!r} contains ',', ':' or '\\' which overlayfs options cannot "
                           "carry; move the repository to a plain path")


# ---------------------------------------------------------------- janitor


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(name: str) -> int | None:
    parts = name.split("-")
    if len(parts) >= 3 and parts[0] in ("ws", "layer", "mnt", "root") and parts[1].isdigit():
        return int(parts[1])
    return None


def janitor(root: Path | None = None) -> list[Path]:
    """Unmount and delete workspaces and layers whose owner process is dead. Returns what went."""
    root = root or sandbox_root()
    removed = []
    for entry in sorted(root.iterdir()):
        pid = _owner_pid(entry.name)
        if pid is None or _pid_alive(pid):
            continue
        _remove_tree(entry)
        removed.append(entry)
    if removed:
        log.info("sandbox janitor removed %d stale workspace/layer dirs under %s", len(removed), root)
    return removed


def _ensure_janitor() -> None:
    global _janitor_done
    with _lock:
        if _janitor_done:
            return
        _janitor_done = True
    janitor()


@atexit.register
def _cleanup_at_exit() -> None:
    for ws in list(_live):
        ws.destroy()
    for layer in list(_layer_refs):
        _remove_tree(Path(layer))
    _layer_refs.clear()


# ---------------------------------------------------------------- layers and snapshots


def _incref(layers: tuple[str, ...]) -> None:
    with _lock:
        for lay in layers:
            _layer_refs[lay] = _layer_refs.get(lay, 0) + 1


def _decref(layers: tuple[str, ...]) -> None:
    dead = []
    with _lock:
        for lay in layers:
            n = _layer_refs.get(lay, 0) - 1
            if n <= 0:
                _layer_refs.pop(lay, None)
                dead.append(lay)
            else:
                _layer_refs[lay] = n
    for lay in dead:
        _remove_tree(Path(lay))


@dataclass(frozen=True, eq=False)
class Snapshot:
    """A frozen workspace state: read-only layers (top first) over ``base``. Fork workspaces from
    it with ``fork``; call ``release`` (or drop it) when no new fork is needed."""

    id: str
    base: str
    layers: tuple[str, ...]
    """Frozen layer dirs, top first. Overlay: each is a frozen upper dir; copy: one full tree."""
    cow_backend: CowBackend

    def __post_init__(self) -> None:
        _incref(self.layers)
        object.__setattr__(self, "_finalizer", weakref.finalize(self, _decref, self.layers))

    def release(self) -> None:
        """Drop this handle's reference; layers go when no workspace uses them either."""
        self._finalizer()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- workspaces


class Workspace:
    """A writable copy-on-write view of a base directory. ``path`` is the tree to work in."""

    def __init__(self, base: Path, layers: tuple[str, ...], disk_mb: int, backend: CowBackend,
                 uid: int | None = None, staged: Path | None = None):
        self.base = base
        self.uid = uid
        """Unprivileged host uid that owns the view (idmapped layers), or None: host ids as-is."""
        self.layers = layers
        self.disk_mb = disk_mb
        self.cow_backend: CowBackend = backend
        self.dir = staged or _new_workspace_dir()
        self.path = self.dir / "merged"
        self.closed = False
        _incref(layers)
        _live.add(self)
        try:
            if staged is None:
                self.dir.mkdir()
                self.path.mkdir()
            self._populate(staged=staged is not None)
        except Exception:
            self.destroy()
            raise

    def __repr__(self) -> str:
        return f"Workspace({self.path}, base={self.base}, backend={self.cow_backend})"

    @property
    def _rw(self) -> Path:
        return self.dir / "rw"

    @property
    def upper(self) -> Path:
        return self._rw / "upper"

    def _populate(self, staged: bool = False) -> None:
        """Fill ``path``: a copy, or the overlay (``staged``: its upper and work exist already)."""
        if self.cow_backend == "copy":
            src = Path(self.layers[0]) if self.layers else self.base
            _cp_a(src, self.path)
            if self.uid is not None:
                subprocess.run(["chown", "-R", "--no-dereference", f"{self.uid}:{self.uid}",
                                str(self.path)], check=True)
            return
        if not staged:
            _stage_rw(self.dir, self.disk_mb, self.uid)
        d = str(self.dir)  # (plain strings: this runs in every lease)
        lowers = [*self.layers, str(self.base)]
        if self.uid is not None:
            # lower layers are seen through an idmap (root's files -> self.uid)
            for i, lower in enumerate(lowers):  # (a staged dir has lower0 made)
                lowers[i] = f"{d}/lower{i}"
                idmapped_clone(lower, lowers[i], self.uid, made=staged and i == 0)
        opts = f"lowerdir={':'.join(lowers)},upperdir={d}/rw/upper,workdir={d}/rw/work"
        try:  # self-contained uppers, so a frozen upper is a valid lower layer elsewhere
            _mount("overlay", self.path, "overlay", opts + ",redirect_dir=off,index=off,metacopy=off")
        except OSError:
            _mount("overlay", self.path, "overlay", opts)

    def snapshot(self) -> Snapshot:
        """Freeze the current state into a new read-only layer (the workspace stays usable).
        Callers must not run commands in the workspace meanwhile (``BwrapSandbox`` locks)."""
        self._check_open()
        layer = sandbox_root() / f"layer-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        if self.cow_backend == "copy":
            _cp_a(self.path, layer)
            layers: tuple[str, ...] = (str(layer),)
        else:
            _cp_a(self.upper, layer)  # only the changes: cheap
            if self.uid is not None:  # layers are root's, like the base: any fork can idmap them
                subprocess.run(["chown", "-R", "--no-dereference", "0:0", str(layer)], check=True)
            layers = (str(layer), *self.layers)
        return Snapshot(uuid.uuid4().hex[:12], str(self.base), layers, self.cow_backend)

    def reset(self) -> None:
        """Back to the state this workspace started from (its base or snapshot)."""
        self._check_open()
        if self.cow_backend == "copy":
            shutil.rmtree(self.path)
            self.path.mkdir()
        else:
            for mp in mounts_under(self.dir):
                _umount(mp)
        self._populate()

    def destroy(self) -> None:
        """Unmount and delete everything; idempotent."""
        if self.closed:
            return
        self.closed = True
        _live.discard(self)
        try:
            _remove_tree(self.dir)
        finally:
            _decref(self.layers)

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError(f"workspace {self.dir} is already destroyed")

    def changed_paths(self) -> list[str]:
        """Workspace-relative paths that may differ from the base (a superset, cheap to compute)."""
        with Root(self.base) as base:
            if self.cow_backend == "copy":
                with Root(self.path) as ws:
                    return sorted(set(base.files(skip=IGNORED_NAMES)) |
                                  set(ws.files(skip=IGNORED_NAMES)))
            cands: set[str] = set()
            for layer in (str(self.upper), *self.layers):
                for rel, opaque_or_gone in _layer_entries(layer):
                    cands.add(rel)
                    if opaque_or_gone:  # a deleted/replaced dir hides every base file below it
                        cands.update(base.files(rel, skip=IGNORED_NAMES))
        return sorted(cands)

    def diff(self) -> str:
        """Unified (git-style) diff of the workspace against its base; caches are ignored. Read
        by ``beneath.Root``: a symlink is diffed as a symlink (its target's text), and nothing
        under a symlinked directory is read — a file there is absent, as it is to git."""
        self._check_open()
        parts = []
        with Root(self.base) as base, Root(self.path) as ws:
            for rel in self.changed_paths():
                if _ignored(rel):
                    continue
                d = file_diff(rel, base, ws)
                if d:
                    parts.append(d)
        return "".join(parts)


def _new_workspace_dir() -> Path:
    return sandbox_root() / f"ws-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _stage_rw(d: Path, disk_mb: int, uid: int | None) -> None:
    """The writable half of an overlay workspace in ``d``: a private tmpfs (the workspace's disk
    quota: a disk-fill attack hits ENOSPC there, never the host disk) holding the upper layer,
    ``uid``'s as it is, and the overlay's work dir, which must stay root's."""
    rw = d / "rw"
    rw.mkdir(exist_ok=True)
    _mount("tmpfs", rw, "tmpfs", f"size={disk_mb}m,nr_inodes=200k,mode=0755")
    (rw / "upper").mkdir()
    (rw / "work").mkdir()
    if uid is not None:
        os.chown(rw / "upper", uid, uid)


def stage_workspace(disk_mb: int, uid: int | None) -> Path:
    """What an overlay workspace needs before its base is known, made ahead (a pool's blank
    sandbox): its directory and the tmpfs with its upper and work dirs. ``create_workspace(...,
    staged=)`` finishes it over any base; ``_remove_tree`` drops it unused."""
    d = _new_workspace_dir()
    d.mkdir()
    try:
        (d / "merged").mkdir()
        (d / "lower0").mkdir()  # where the base's idmapped view goes (~0.07 ms at a lease)
        _stage_rw(d, disk_mb, uid)
    except BaseException:
        _remove_tree(d)
        raise
    return d


def _cp_a(src: Path, dst: Path) -> None:
    if dst.exists():
        dst.rmdir()
    r = subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(dst)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SandboxError(f"copying {src} to {dst} failed: {r.stderr.strip()}")


def create_workspace(base: str | os.PathLike[str], *, snapshot: Snapshot | None = None,
                     disk_mb: int = 1024, backend: CowBackend | None = None,
                     uid: int | None = None, staged: Path | None = None,
                     resolved: bool = False, vetted: bool = False) -> Workspace:
    """A fresh workspace over ``base`` (or over ``snapshot``'s state). With ``uid``, the view
    shows host root's files as owned by that unprivileged uid (see ``idmap.py``). ``staged``:
    from ``stage_workspace(disk_mb, uid)`` (taken over; dropped if the overlay cannot be used).
    ``resolved``: ``base`` is already ``os.path.realpath``'d (the lease path resolves it once).
    ``vetted``: ``overlay_capable(base)`` was just True (a directory, all root's: not checked
    again)."""
    _ensure_janitor()
    try:
        base_p = Path(base if resolved else os.path.realpath(base))
        return _create_workspace(base_p, snapshot, disk_mb, backend, uid, staged, vetted)
    except BaseException:
        if staged is not None and staged.exists():
            _remove_tree(staged)
        raise


def _create_workspace(base_p: Path, snapshot: Snapshot | None, disk_mb: int,
                      backend: CowBackend | None, uid: int | None,
                      staged: Path | None, vetted: bool = False) -> Workspace:
    if not vetted and not base_p.is_dir():
        raise SandboxError(f"base directory {base_p} does not exist or is not a directory; pass the "
                           "path of the task's repository snapshot")
    if snapshot is not None:
        assert Path(snapshot.base) == base_p, "snapshot was taken over a different base"
        backend = snapshot.cow_backend
    if backend is None:
        backend = "overlay" if _overlay_ok() else "copy"
    if backend == "overlay" and uid is not None and snapshot is None and not vetted:
        stranger = _stranger(base_p)
        if stranger:  # an idmap shows only root's files as the sandbox's: copy + chown instead
            log.warning("base %s has files not owned by root (e.g. %s): sandboxes over it use "
                        "the slow copy backend; extract repositories with "
                        "tarfile.extractall(filter='data') or `chown -R 0:0` them", base_p, stranger)
            backend = "copy"
    if backend == "overlay":
        _check_overlay_path(str(base_p))
        try:
            return Workspace(base_p, snapshot.layers if snapshot else (), disk_mb, "overlay", uid,
                             staged)
        except OSError as e:
            staged = None  # the failed Workspace removed it
            if snapshot is not None:
                raise SandboxError(f"overlay mount failed for a snapshot fork: {e}") from e
            log.warning("overlayfs unavailable (%s); falling back to copying the base (slow)", e)
            backend = "copy"
    if staged is not None:
        _remove_tree(staged)
        staged = None
    if backend == "copy":
        log.info("workspace backend: copy (cp -a of %s)", base_p)
    return Workspace(base_p, snapshot.layers if snapshot else (), disk_mb, "copy", uid)


def overlay_capable(base: str | os.PathLike[str], resolved: bool = False) -> bool:
    """Whether ``create_workspace(base, uid=...)`` mounts an overlay (fast) rather than copying
    (``resolved``: ``base`` is ``realpath``'d already)."""
    if not _overlay_ok():
        return False
    real = os.fspath(base) if resolved else os.path.realpath(base)
    try:
        st = os.stat(real)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and _foreign_owned(real, st.st_mtime_ns) is None


def _stranger(base_p: Path) -> str | None:
    """A path under the (resolved) base not owned by uid 0: then an idmap cannot serve it."""
    return _foreign_owned(str(base_p), base_p.stat().st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _foreign_owned(base: str, mtime_ns: int) -> str | None:
    """A path under ``base`` not owned by uid 0, or None (cached per base and mtime)."""
    del mtime_ns  # part of the cache key only
    for dirpath, dirnames, filenames in os.walk(base):
        for name in [".", *dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            if os.lstat(full).st_uid != 0:
                return os.path.relpath(full, base)
    return None


def fork(snapshot: Snapshot, n: int, *, disk_mb: int = 1024) -> list[Workspace]:
    """``n`` independent workspaces starting from ``snapshot``."""
    return [create_workspace(snapshot.base, snapshot=snapshot, disk_mb=disk_mb) for _ in range(n)]


# ---------------------------------------------------------------- diff


def _ignored(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in IGNORED_NAMES for p in parts) or rel.endswith(IGNORED_SUFFIXES)


def _layer_entries(layer: str) -> list[tuple[str, bool]]:
    """(path, hides-base-subtree) for every entry of an overlay upper/layer dir: a whiteout, a
    file or link (replacing whatever the base had there), or an opaque directory."""
    out = []
    with Root(layer) as root:
        for d, fd, entries in root.walk():
            if d != ".":
                try:
                    opaque = os.getxattr(fd, "trusted.overlay.opaque") == b"y"
                except OSError:
                    opaque = False
                out.append((d, opaque))
            out += [(name if d == "." else f"{d}/{name}", True)
                    for name, st in entries if not stat.S_ISDIR(st.st_mode)]
    return out


def file_diff(rel: str, old_root: Root, new_root: Root) -> str:
    """Git diff of one path ('' when unchanged), as ``diffs.blob_diff`` writes it: ``git apply``
    reproduces it exactly. Each side is looked up beneath its root without following a link
    (``beneath.Root.blob``); a directory, or anything but a file or a symlink, is absent here
    (a directory's files have diffs of their own)."""
    return blob_diff(rel, old_root.blob(rel), new_root.blob(rel))
