"""Dockerfiles of the common Python shape, read with a maintained parser (``dockerfile-parse``)
and turned into what looprl's sandbox realises without a container engine: a workspace tree and
a venv.

    env = read_dockerfile(task_dir / "environment")   # -> DockerEnv, or Unsupported (one line)
    env.python, env.requirements, env.workdir, env.copies, env.env, env.notes

What maps to what:
- ``FROM python:X.Y[...]`` (any registry, any variant; also ``...python-X-Y`` image names) -> the
  host's Python X.Y (``envs.python_for``); ``FROM debian:*``/``ubuntu:*`` -> the host's system and
  its default Python, said in a note (the sandbox runs the host's /usr whatever the tag).
- ``RUN pip install SPEC...`` (``pip3``, ``python -m pip``, ``uv pip install``; ``-r FILE`` for a
  file COPY'd from the build context) -> requirements of the venv, from the package registry.
- ``RUN apt-get install PKG...`` -> accepted when every package is installed on this host (the
  sandbox sees the host's /usr read-only); ``apt-get update``/``clean`` and removing apt's lists
  are no-ops; ``mkdir -p`` below the WORKDIR makes the directory in the workspace.
- ``COPY``/``ADD`` of build-context files to the WORKDIR or below -> files of the workspace
  (``.dockerignore`` honoured, ``--chmod`` applied, ``--chown`` moot: one user owns the sandbox).
- ``WORKDIR`` -> where the workspace is mounted for the verifier; ``ENV`` -> the verifier's
  environment (a note says so: the agent's commands do not get it); ``ARG`` values substitute;
  ``CMD`` is ignored (Harbor replaces it with ``sleep infinity`` too); ``LABEL``/``MAINTAINER``
  mean nothing here; ``USER`` changes nothing (the sandbox always runs one unprivileged user).

Everything else is refused with ``Unsupported`` naming the file, line and instruction: another
base image, a second ``FROM`` (multi-stage), ``ENTRYPOINT``, ``EXPOSE``/``HEALTHCHECK``
(services), ``VOLUME``, ``SHELL``, ``ONBUILD``, ``COPY --from``, ``ADD`` of URLs or archives, a
copy outside the WORKDIR, ``pip install`` of paths, URLs or editable installs, an apt package
this host lacks, and any other ``RUN`` command.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from looprl.errors import TaskError
from looprl.sandbox.root import rootable

_PYTHON_TAG = re.compile(r"(?:^|/)python:(?P<v>3\.\d+)(?:[.\-@]|$)")
_PYTHON_NAME = re.compile(r"(?:^|/)python-?(?P<v>3)[.-](?P<m>\d+)(?::|@|$)")
_SYSTEM_IMAGES = ("debian", "ubuntu")
_PIP_FLAGS = {"--no-cache-dir", "-q", "--quiet", "-U", "--upgrade", "--system",
              "--break-system-packages", "--no-warn-script-location", "--disable-pip-version-check",
              "--root-user-action=ignore", "--compile", "--no-compile", "--prefer-binary"}
_APT_FLAGS = {"-y", "--yes", "-q", "-qq", "--no-install-recommends", "--quiet",
              "--assume-yes"}
_SANDBOX_ENV = {"PATH", "HOME", "USER", "TMPDIR", "PWD", "VIRTUAL_ENV", "LANG", "LC_ALL"}
"""Variables the sandbox sets itself: an ENV of one of them is not applied (noted)."""
_NOOP_RUN = (re.compile(r"apt(-get)? (update|clean|autoclean|autoremove)( -y| -q+)*"),
             re.compile(r"rm -rf (/var/lib/apt/lists/?\*?|/var/cache/apt/?\S*|/root/\.cache\S*|"
                        r"/tmp/\S*)( \S+)*"),
             re.compile(r"(pip3?|python3? -m pip) (cache purge|install --upgrade pip)"))


class Unsupported(TaskError):
    """A Dockerfile instruction looprl cannot realise offline; the message names it."""


@dataclass(frozen=True)
class Copy:
    source: str
    """Path in the build context (a file or directory)."""
    dest: str
    """Path relative to the WORKDIR ('' = the WORKDIR itself)."""
    into: bool
    """The destination is a directory the source goes into (a directory's contents always do)."""
    mode: int | None = None


@dataclass(frozen=True)
class DockerEnv:
    """What a Dockerfile of the supported shape sets up."""

    image: str
    python: str
    """'X.Y': the interpreter version the venv is made from."""
    workdir: str
    requirements: tuple[str, ...] = ()
    copies: tuple[Copy, ...] = ()
    dirs: tuple[str, ...] = ()
    """Directories to make below the WORKDIR (``mkdir -p``), relative to it."""
    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    """One line each for what the sandbox realises differently from a container."""


def host_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _python_of(image: str) -> str | None:
    for pat in (_PYTHON_TAG, _PYTHON_NAME):
        m = pat.search(image.lower())
        if m:
            return m.group("v") if "m" not in pat.groupindex else f"{m.group('v')}.{m.group('m')}"
    return None


def _apt_installed(pkg: str) -> bool:
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and r.stdout.endswith("installed")


def _segments(command: str) -> list[list[str]]:
    """A RUN line's ``&&``/``;``-joined commands, each as its words."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=";&|<>()")
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    for tok in lex:
        if tok in ("&&", ";"):
            out.append([])
        elif set(tok) <= set(";&|<>()"):
            raise ValueError(f"shell operator {tok!r}")
        else:
            out[-1].append(tok)
    return [s for s in out if s]


class _Reader:
    """One Dockerfile, instruction by instruction (``read_dockerfile``)."""

    def __init__(self, path: Path, context: Path, extra_dests: tuple[str, ...]) -> None:
        self.path, self.context, self.extra_dests = path, context, extra_dests
        self.image = ""
        self.python = ""
        self.workdir = "/"
        self.requirements: list[str] = []
        self.copies: list[Copy] = []
        self.dirs: list[str] = []
        self.env: dict[str, str] = {}
        self.notes: list[str] = []
        self.line = 0
        self.text = ""
        self.pre_from: dict[str, str] = {}

    def refuse(self, why: str) -> Unsupported:
        rel = f"{self.path.parent.name}/{self.path.name}"
        return Unsupported(f"{rel}:{self.line}: {self.text[:120]}: {why}")

    # -- instructions
    def FROM(self, value: str) -> None:
        if self.image:
            raise self.refuse("a second FROM (a multi-stage build); looprl realises one stage")
        words = value.split()
        if len(words) not in (1, 3) or (len(words) == 3 and words[1].lower() != "as") or \
                words[0].startswith("--"):
            raise self.refuse("write FROM IMAGE[:TAG] [AS NAME]")
        self.image = words[0]
        py = _python_of(self.image)
        name = self.image.split("@")[0].rsplit("/", 1)[-1].split(":")[0].lower()
        if py:
            self.python = py
        elif name in _SYSTEM_IMAGES:
            self.python = host_python_version()
            self.notes.append(f"FROM {self.image} runs on this host's own system (its /usr) "
                              f"with Python {self.python}")
        else:
            raise self.refuse("looprl realises Python images (python:X.Y) with the host's "
                              "interpreter and Debian/Ubuntu ones with the host's system; this "
                              "image needs a container engine (the container backend)")

    def WORKDIR(self, value: str) -> None:
        self.workdir = posixpath.normpath(posixpath.join(self.workdir, value.strip()))

    def ENV(self, value: str) -> None:
        words = shlex.split(value)
        pairs = ([w.split("=", 1) for w in words] if words and "=" in words[0]
                 else [[words[0], " ".join(words[1:])]] if words else [])
        for pair in pairs:
            if len(pair) != 2 or not pair[0]:
                raise self.refuse("write ENV NAME=value ...")
            name, val = pair
            if name in _SANDBOX_ENV:
                self.notes.append(f"ENV {name} is not applied: the sandbox sets {name} itself")
                continue
            self.env[name] = val

    def RUN(self, value: str) -> None:
        if value.lstrip().startswith(("[", "<<", "--")):
            raise self.refuse("only the shell form of RUN, without heredocs or flags, is read")
        try:
            segments = _segments(value)
        except ValueError as e:
            raise self.refuse(f"{e}: looprl reads RUN lines of commands joined by && or ;") \
                from None
        for words in segments:
            self._run(words)

    def _run(self, words: list[str]) -> None:
        line = " ".join(words)
        if any(p.fullmatch(line) for p in _NOOP_RUN):
            return
        if words[:2] in (["pip", "install"], ["pip3", "install"], ["uv", "pip"]) or (
                re.fullmatch(r"python3?(\.\d+)?", words[0]) and words[1:4] == ["-m", "pip",
                                                                              "install"]):
            start = 3 if words[0] == "uv" else 4 if words[0].startswith("python") else 2
            if words[0] == "uv" and words[2:3] != ["install"]:
                raise self.refuse(f"`{line}`: only `uv pip install` is read")
            return self._pip(words[start:])
        if words[0] in ("apt-get", "apt") and words[1:2] == ["install"]:
            return self._apt(words[2:])
        if words[0] == "mkdir":
            return self._mkdir(words[1:])
        raise self.refuse(f"`{line}`: looprl realises `pip install` from the package registry, "
                          "`apt-get install` of packages this host has and `mkdir -p` in the "
                          "WORKDIR; run anything else in solution/solve.sh or drop it")

    def _pip(self, args: list[str]) -> None:
        it = iter(args)
        for a in it:
            if a in _PIP_FLAGS:
                continue
            if a in ("-r", "--requirement"):
                self._requirements_file(next(it, ""))
            elif a.startswith("-"):
                raise self.refuse(f"pip option {a} is not read (editable installs, indexes and "
                                  "paths cannot be realised as a cached registry venv)")
            else:
                self._requirement(a)

    def _requirement(self, spec: str) -> None:
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            raise self.refuse(f"{spec!r} is not a package requirement (paths and URLs are not "
                              "installed from the registry)") from None
        if req.url:
            raise self.refuse(f"{spec!r} installs from a URL, not the package registry")
        self.requirements.append(str(req))

    def _requirements_file(self, name: str) -> None:
        src = self._context_file_for(name)
        if src is None:
            raise self.refuse(f"-r {name}: not a file COPY'd from the build context before")
        for raw in src.read_text(errors="replace").splitlines():
            line = raw.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                if line.startswith("-"):
                    raise self.refuse(f"{name}: option line {line!r} is not read")
                self._requirement(line)

    def _context_file_for(self, name: str) -> Path | None:
        """The build-context file an earlier COPY put at ``name`` (in the image)."""
        target = posixpath.normpath(posixpath.join(self.workdir, name))
        for c in reversed(self.copies):
            dest = posixpath.normpath(posixpath.join(self.workdir, c.dest))
            src = self.context / c.source
            if src.is_file() and target == (posixpath.join(dest, src.name) if c.into else dest):
                return src
            if src.is_dir() and target.startswith(dest.rstrip("/") + "/"):
                cand = src / target[len(dest.rstrip("/")) + 1:]
                if cand.is_file():
                    return cand
        return None

    def _apt(self, args: list[str]) -> None:
        missing = []
        for a in args:
            if a.startswith("-"):
                if a not in _APT_FLAGS:
                    raise self.refuse(f"apt-get option {a} is not read")
                continue
            pkg = a.split("=", 1)[0]
            if not _apt_installed(pkg):
                missing.append(pkg)
        if missing:
            raise self.refuse(f"apt package(s) {', '.join(missing)} not installed on this host "
                              "(the sandbox uses the host's /usr; install them here, or use a "
                              "container engine)")

    def _mkdir(self, args: list[str]) -> None:
        for a in args:
            if a in ("-p", "--parents"):
                continue
            if a.startswith("-"):
                raise self.refuse(f"mkdir option {a} is not read")
            self.dirs.append(self._below_workdir(a, "mkdir"))

    def _below_workdir(self, path: str, what: str) -> str:
        p = posixpath.normpath(posixpath.join(self.workdir, path))
        w = self.workdir.rstrip("/")
        if p == self.workdir:
            return ""
        if not p.startswith(w + "/"):
            raise self.refuse(f"{what} to {p}, outside the WORKDIR {self.workdir}: the workspace "
                              "is the only tree looprl builds")
        return p[len(w) + 1:]

    def COPY(self, value: str, add: bool = False) -> None:
        words = json_or_words(value)
        mode = None
        while words and words[0].startswith("--"):
            flag = words.pop(0)
            if flag.startswith("--chmod="):
                try:
                    mode = int(flag.split("=", 1)[1], 8)
                except ValueError:
                    raise self.refuse(f"{flag}: write an octal mode") from None
            elif flag.startswith(("--chown=", "--link")):
                continue
            else:
                raise self.refuse(f"{flag} is not read (a copy from another stage or image "
                                  "needs a container engine)")
        if len(words) < 2:
            raise self.refuse("write COPY SOURCE... DEST")
        *sources, dest = words
        target = posixpath.normpath(posixpath.join(self.workdir, dest))
        if any(target == d or target.startswith(d.rstrip("/") + "/") for d in self.extra_dests):
            return  # the verifier's own files (tests/Dockerfile's `COPY . /tests/`): mounted anyway
        rel = self._below_workdir(dest, "COPY" if not add else "ADD")
        into = dest.endswith("/") or len(sources) > 1 or rel == ""
        for s in sources:
            if add and (re.match(r"[a-z]+://", s) or re.search(r"\.(tar(\.\w+)?|tgz|zip)$", s)):
                raise self.refuse(f"ADD {s}: URLs and archives are not unpacked offline; COPY "
                                  "the files instead")
            found = self._glob(s)
            for f in found:
                self.copies.append(Copy(f, rel, into or len(found) > 1 or (self.context / f).is_dir(),
                                        mode))

    def ADD(self, value: str) -> None:
        self.COPY(value, add=True)

    def _glob(self, source: str) -> list[str]:
        pattern = posixpath.normpath(source.lstrip("/"))
        if pattern.startswith(".."):
            raise self.refuse(f"{source}: outside the build context")
        matches = [p.relative_to(self.context).as_posix() for p in sorted(self.context.glob(pattern))
                   ] if any(c in pattern for c in "*?[") else (
            [pattern] if (self.context / pattern).exists() else [])
        if not matches:
            raise self.refuse(f"{source}: no such file in the build context {self.context}")
        return matches

    def CMD(self, value: str) -> None:
        return  # Harbor runs `sleep infinity` in place of CMD; so does nothing here

    def LABEL(self, value: str) -> None:
        return

    MAINTAINER = LABEL

    def ARG(self, value: str) -> None:
        """(the parser gives their values to later instructions; one before FROM is kept here,
        for FROM, which the parser gives none)"""
        if not self.image:
            name, _, default = value.strip().partition("=")
            self.pre_from[name] = default.strip().strip("\"'")

    def USER(self, value: str) -> None:
        if value.strip() not in ("root", "0"):
            self.notes.append(f"USER {value.strip()} changes nothing: the sandbox runs one "
                              "unprivileged user")


def json_or_words(value: str) -> list[str]:
    """An instruction's arguments in JSON (exec) form or shell form."""
    v = value.strip()
    if v.startswith("["):
        try:
            words = json.loads(v)
        except json.JSONDecodeError:
            words = None
        if isinstance(words, list) and all(isinstance(w, str) for w in words):
            return words
    return shlex.split(v)


_VAR = re.compile(r"\$(?:\{(?P<b>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<n>[A-Za-z_][A-Za-z0-9_]*))")


def _substitute(value: str, variables: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` replaced by the ARG/ENV values in force (others left as written).

    >>> _substitute("WORKDIR ${APP}/x $HOME", {"APP": "/app"})
    'WORKDIR /app/x $HOME'
    """
    def sub(m: re.Match[str]) -> str:
        name = m.group("b") or m.group("n")
        return variables.get(name, m.group(0))

    return _VAR.sub(sub, value)


def _dockerignore(context: Path) -> list[str]:
    p = context / ".dockerignore"
    if not p.is_file():
        return []
    pats = [ln.strip() for ln in p.read_text(errors="replace").splitlines()
            if ln.strip() and not ln.startswith("#")]
    if any(x.startswith("!") for x in pats):
        raise Unsupported(f"{context.name}/.dockerignore: exceptions (!PATTERN) are not read")
    return [posixpath.normpath(x.lstrip("/")) for x in pats]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether ``.dockerignore`` patterns exclude ``rel`` (or a directory above it)."""
    parts = rel.split("/")
    return any(fnmatch.fnmatch("/".join(parts[:i]), pat) for pat in patterns
               for i in range(1, len(parts) + 1))


def read_dockerfile(context: Path, *, name: str = "Dockerfile", extra_dests: tuple[str, ...] = (),
                    workspace: bool = True) -> DockerEnv:
    """The ``DockerEnv`` of ``context/name``; ``Unsupported`` (one line) for what looprl cannot
    realise. ``extra_dests``: absolute paths a COPY may target that are not the workspace (the
    verifier's ``/tests``, mounted anyway). ``workspace=False``: the image only provides an
    environment (a verifier's), so it needs no WORKDIR of its own."""
    from dockerfile_parse import DockerfileParser

    path = context / name
    try:
        with open(path, "rb") as f:
            parser = DockerfileParser(fileobj=f)
            structure = parser.structure
            contexts = parser.context_structure
    except OSError as e:
        raise TaskError(f"{path}: cannot read ({e.strerror})") from None
    r = _Reader(path, context, extra_dests)
    for ins, ctx in zip(structure, contexts, strict=True):
        kind = ins["instruction"].upper()
        if kind == "COMMENT":
            continue
        r.line, r.text = ins["startline"] + 1, " ".join(ins["content"].split())
        handler = getattr(r, kind, None) if kind.isupper() and kind.isalpha() else None
        if handler is None:
            raise r.refuse(f"{kind} is not realised offline (services, volumes, shells and "
                           "entrypoints need a container engine)")
        if not r.image and kind not in ("FROM", "ARG", "LABEL"):
            raise r.refuse("an instruction before FROM")
        scope = {**r.pre_from, **ctx.args, **(r.env if kind == "ENV" else ctx.envs)}
        handler(_substitute(ins["value"], scope))
    if not r.image:
        raise Unsupported(f"{path}: no FROM instruction")
    if workspace and (r.workdir == "/" or not rootable([r.workdir])):
        raise Unsupported(f"{path}: the WORKDIR is {r.workdir}: the workspace needs a directory "
                          "of its own outside the system's (e.g. WORKDIR /app)")
    patterns = _dockerignore(context)
    copies = tuple(c for c in r.copies if not ignored(c.source, patterns))
    return DockerEnv(r.image, r.python, r.workdir, tuple(dict.fromkeys(r.requirements)), copies,
                     tuple(r.dirs), r.env, tuple(r.notes))


def materialise(env: DockerEnv, context: Path, dest: Path) -> None:
    """Lay out the WORKDIR's files in ``dest`` (a new directory): every COPY, in order (a later
    one overwrites), and every ``mkdir -p``."""
    patterns = _dockerignore(context)
    dest.mkdir(parents=True)
    for d in env.dirs:
        (dest / d).mkdir(parents=True, exist_ok=True)
    for c in env.copies:
        src = context / c.source
        if src.is_dir():
            target = dest / c.dest
            for root, dirnames, files in os.walk(src):
                def in_context(name: str, root: str = root) -> str:
                    return os.path.relpath(os.path.join(root, name), context)

                dirnames[:] = [d for d in dirnames if not ignored(in_context(d), patterns)]
                for fn in files:
                    rel = Path(root, fn).relative_to(src)
                    if ignored(in_context(fn), patterns):
                        continue
                    out = target / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(Path(root, fn), out, follow_symlinks=False)
                    if c.mode is not None:
                        out.chmod(c.mode)
        else:
            out = dest / c.dest / src.name if c.into else dest / c.dest
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out, follow_symlinks=False)
            if c.mode is not None:
                out.chmod(c.mode)
