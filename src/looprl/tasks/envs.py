"""Python environments of imported tasks: a venv per (interpreter, requirements), installed from
the package registry once and cached, as the PyPI task builder's are (``sources.build_venv``).

    python = python_for("3.12")                  # the host's 3.12 (PATH, pyenv), or TaskError
    venv = cached_venv("3.12", ("pytest==8.3.5", "attrs==23.2.0"))   # LOOPRL_HOME/envs/<key>/venv

The venv holds exactly the requirements (and what they depend on); a task's own code stays in
its workspace. Builds of one key are serialised by a file lock, so concurrent imports share it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from looprl import paths
from looprl.errors import TaskError
from looprl.tasks.sources import uv_binary


def _version_of(python: str) -> str | None:
    try:
        r = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def python_for(version: str) -> str:
    """The path of a host interpreter of ``version`` ('X.Y'): this one, ``pythonX.Y`` on PATH,
    or a pyenv version; ``TaskError`` naming the versions there are when none matches."""
    if not re.fullmatch(r"3\.\d+", version):
        raise TaskError(f"Python {version!r} is not a version looprl can look for (write 3.X)")
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    found = [shutil.which(f"python{version}")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        found += [str(p / "bin" / "python") for p in sorted(pyenv.glob(f"{version}.*"))]
    for p in found:
        if p and Path(p).is_file() and _version_of(p) == version:
            return str(Path(p).resolve())
    have = sorted({v for v in (_version_of(p) for p in _candidates()) if v})
    raise TaskError(f"no Python {version} on this host (it has {', '.join(have) or 'none'}); "
                    f"install python{version} or change the task's base image")


def _candidates() -> list[str]:
    out = [sys.executable]
    for n in range(6, 20):
        p = shutil.which(f"python3.{n}")
        if p:
            out.append(p)
    return out


def env_key(version: str, requirements: tuple[str, ...]) -> str:
    blob = json.dumps({"python": version, "requirements": sorted(requirements)})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached_venv(version: str, requirements: tuple[str, ...]) -> Path:
    """A venv of Python ``version`` holding ``requirements``, built once per key under
    ``LOOPRL_HOME/envs``. ``TaskError`` with the installer's message when it cannot be built
    (a requirement the registry lacks, no such Python); the failure is not cached."""
    python = python_for(version)
    root = paths.sub("envs") / f"py{version}-{env_key(version, requirements)}"
    root.mkdir(exist_ok=True)
    venv = root / "venv"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".looprl-ok").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        uv = uv_binary()
        if uv:
            steps = [[uv, "venv", "-q", "--python", python, str(venv)]]
            if requirements:
                steps.append([uv, "pip", "install", "-q", "--compile-bytecode", "--python",
                              str(venv / "bin" / "python"), *requirements])
        else:
            steps = [[python, "-m", "venv", str(venv)]]
            if requirements:
                steps.append([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                              "--disable-pip-version-check", *requirements])
        for cmd in steps:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                raise TaskError(f"building the Python {version} environment "
                                f"({' '.join(requirements) or 'no packages'}) failed: "
                                f"{(r.stderr or r.stdout).strip()[-600:]}")
        (root / "requirements.json").write_text(json.dumps(list(requirements)))
        (venv / ".looprl-ok").touch()
    return venv


def frozen_requirements(venv: str) -> tuple[str, ...]:
    """``NAME==VERSION`` of every distribution in ``venv`` (what an exported Dockerfile pins),
    read from its metadata, not by running it."""
    out = []
    for site in sorted(Path(venv).glob("lib/python*/site-packages")):
        for dist in sorted(site.glob("*.dist-info")):
            meta = dist / "METADATA"
            if not meta.is_file():
                continue
            name = version = ""
            for line in meta.read_text(errors="replace").splitlines():
                if line.startswith("Name:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                elif not line:
                    break
            if name and version:
                out.append(f"{name}=={version}")
    return tuple(sorted(set(out), key=str.lower))


def venv_python_version(venv: str) -> str:
    """'X.Y' of a venv's interpreter, from its layout (``lib/pythonX.Y``)."""
    for p in sorted(Path(venv).glob("lib/python3.*")):
        return p.name.removeprefix("python")
    raise TaskError(f"{venv} is not a venv (no lib/python3.X)")
