"""Source distributions from PyPI: pinned specs, downloaded once and unpacked. Task packages
(``tasks.sources``) and the default model's source corpus (``models.corpus``) both start here.

    name, version = parse_spec("toolz==1.2.0")
    sdist = download_sdist(name, version)      # LOOPRL_HOME/packages/sdists/toolz-1.2.0.tar.gz
    root = unpack(sdist, dest)                  # dest is the package's root directory
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from packaging.version import InvalidVersion, Version

from looprl import paths
from looprl.errors import TaskError

NOT_SOURCE_DIRS = {"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts",
                   "tools", "build", "dist", ".github", "tests", "test", "testing"}
"""Top-level folders of an sdist that hold no library code."""


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'NAME==VERSION' -> (NAME, VERSION); 'NAME' -> (NAME, None) meaning the latest release."""
    name, _, version = spec.strip().partition("==")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or (version and not re.fullmatch(
            r"[A-Za-z0-9.+!_-]+", version)):
        raise TaskError(f"bad package spec {spec!r}: write NAME==VERSION, e.g. toolz==1.2.0")
    return name, version or None


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def spec_name(spec: str) -> str:
    """The normalised name of ``NAME`` or ``NAME==VERSION``, as two specs of one package compare
    (unchecked: ``parse_spec`` says what is wrong with a bad spec where it is built)."""
    return normalize(spec.split("==")[0])


def _find_sdist(folder: Path, name: str, version: str | None) -> Path | None:
    stem = normalize(name)
    for p in sorted(folder.iterdir()):
        n = p.name.lower()
        for ext in (".tar.gz", ".zip", ".tar.bz2"):
            if n.endswith(ext):
                base = n[: -len(ext)]
                pname, _, pver = base.rpartition("-")
                if normalize(pname) == stem and (version is None or pver == version.lower()):
                    return p
    return None


def index_url() -> str:
    """The package index's simple API (PEP 691 JSON); ``LOOPRL_INDEX_URL`` points it at a mirror."""
    return os.environ.get("LOOPRL_INDEX_URL", "https://pypi.org/simple").rstrip("/")


_SDIST_NAME = re.compile(r"(?P<name>.+)-(?P<version>[^-]+)\.(?:tar\.gz|zip|tar\.bz2)")


def _sdist_files(name: str) -> list[tuple[str, dict]]:
    """(version, file record) of every sdist of ``name`` on the index that is not yanked; a
    record's ``url`` is absolute (a mirror may give it relative to the project page)."""
    url = f"{index_url()}/{normalize(name).replace('_', '-')}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            files = json.load(r)["files"]
    except urllib.error.HTTPError as e:
        hint = "check the name" if e.code == 404 else "try again later"
        raise TaskError(f"the package index answered {e.code} for {name!r} ({url}); "
                        f"{hint}") from None
    except (urllib.error.URLError, TimeoutError, OSError, ValueError, KeyError) as e:
        raise TaskError(f"could not read {url} ({e}); is the network up, or set LOOPRL_INDEX_URL "
                        "to a mirror with PEP 691 JSON") from None
    out = []
    for f in files:
        if f.get("yanked") or f.get("filename", "").endswith(".whl"):
            continue
        hit = _SDIST_NAME.fullmatch(f["filename"])
        if hit and normalize(hit["name"]) == normalize(name):
            out.append((hit["version"], {**f, "url": urllib.parse.urljoin(url, f["url"])}))
    return out


def _final(version: str) -> Version | None:
    try:
        parsed = Version(version)
    except InvalidVersion:  # a legacy version string: never "the latest"
        return None
    return None if parsed.is_prerelease or parsed.is_devrelease else parsed


def download_sdist(name: str, version: str | None) -> Path:
    """The sdist of NAME==VERSION (the latest final release without a version), downloaded once
    into ``packages/sdists`` and checked against the sha256 the index publishes."""
    folder = paths.sub("packages") / "sdists"
    folder.mkdir(exist_ok=True)
    if version and (hit := _find_sdist(folder, name, version)):
        return hit
    files = _sdist_files(name)
    if version is None:
        finals = [(parsed, v) for v, _ in files if (parsed := _final(v))]
        version = max(finals)[1] if finals else None
    picked = [f for v, f in files if version and v.lower() == version.lower()]
    req = f"{name}=={version}" if version else name
    if not picked:
        raise TaskError(f"{req}: the index has no sdist of it (a wrong version, or wheels only); "
                        "pick another version")
    dest = folder / picked[0]["filename"]
    if dest.is_file():
        return dest
    tmp = folder / f".dl-{os.getpid()}-{dest.name}"
    try:
        with urllib.request.urlopen(picked[0]["url"], timeout=120) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f)
        want = picked[0].get("hashes", {}).get("sha256")  # PyPI publishes it; a mirror may not
        if want and sha256(tmp) != want:
            raise TaskError(f"{req}: the downloaded sdist does not match the index's sha256; "
                            "try again")
        os.replace(tmp, dest)
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise TaskError(f"downloading {dest.name} failed ({e}); is the network up?") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unpack(sdist: Path, dest: Path) -> Path:
    """Unpack ``sdist`` so that ``dest`` is the package's root directory."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if sdist.name.endswith(".zip"):
        with zipfile.ZipFile(sdist) as z:
            z.extractall(tmp)
    else:
        with tarfile.open(sdist) as t:
            t.extractall(tmp, filter="data")
    entries = list(tmp.iterdir())
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(root, dest)
    shutil.rmtree(tmp, ignore_errors=True)
    for d in list(dest.rglob("__pycache__")):
        shutil.rmtree(d, ignore_errors=True)
    for p in dest.rglob("*"):  # the sandbox user (not root) must read the base
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | 0o444 | (0o111 if p.is_dir() else 0))
    return dest
