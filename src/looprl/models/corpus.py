"""The source corpus: library code of pinned pure-Python packages from PyPI. It is the default
model's tokenizer and pretraining text and the synthetic demos' repositories. Pinned sdists, not
the venv's site-packages: a venv holds whatever versions pip resolved on the day it was made, so
a fresh clone on another date would build another tokenizer, another pretraining text and other
demos, i.e. another start.

    for repo in corpus_repos(exclude={"toolz"}):   # every package, fetched on first use
        repo / repo.name / "__init__.py"            # a repository holding one import package

Layout (``looprl.paths.sub("corpus")``)::

    NAME-VERSION/IMPORT/IMPORT/...   the sdist's import package IMPORT, in a folder of its own
                                     name: a repository whose paths start with the package
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from looprl import paths
from looprl.pypi import NOT_SOURCE_DIRS, download_sdist, normalize, parse_spec, spec_name, unpack

CORPUS = (
    "anyio==4.16.0", "arrow==1.4.0", "astor==0.8.1", "asttokens==3.0.2", "attrs==26.1.0",
    "beautifulsoup4==4.15.0", "bidict==0.24.1", "bleach==6.4.0", "blinker==1.9.0",
    "cattrs==26.2.1", "cerberus==1.3.8", "chardet==7.7.0", "charset-normalizer==3.5.3",
    "click==8.5.1", "cloudpickle==3.1.3", "colorama==0.4.6", "deprecated==3.0.1", "dill==0.4.1",
    "distlib==0.4.4", "docutils==0.23", "exceptiongroup==1.3.2", "executing==2.3.0",
    "filelock==4.3.1", "flask==3.1.3", "fsspec==2026.9.0", "funcy==2.1", "glom==25.12.0",
    "h11==0.16.0", "h2==4.4.1", "hpack==4.2.0", "html5lib==1.1", "httpcore==1.0.9",
    "httpx==0.28.1", "hyperframe==6.1.0", "idna==3.20", "importlib-metadata==10.2.0",
    "inflect==7.6.0", "isort==9.0.2", "itsdangerous==2.2.0", "jinja2==3.1.6", "jmespath==1.1.0",
    "jsonpickle==4.1.4", "jsonschema==4.26.0", "lark==1.3.1", "mako==1.4.3",
    "markdown-it-py==4.3.0", "markdown==3.11.3", "marshmallow==4.4.0", "mistune==3.4.0",
    "more-itertools==11.2.1", "mpmath==1.4.1", "natsort==8.4.0", "networkx==3.7",
    "oauthlib==4.0.1", "packaging==26.4", "parso==0.8.7", "pexpect==4.9.0", "platformdirs==4.14.8",
    "pluggy==1.7.0", "prompt-toolkit==3.0.53", "ptyprocess==0.7.0", "pure-eval==0.2.4",
    "pyasn1==0.6.5", "pycparser==3.12", "pyflakes==4.1.0", "pyjwt==2.15.1", "pyparsing==3.3.3",
    "python-dateutil==4.0.0", "python-dotenv==1.2.4", "python-json-logger==4.2.0", "pytz==2026.6",
    "pyyaml==6.0.4", "referencing==0.37.0", "requests==2.34.2", "rich==15.0.0", "rsa==4.9.1",
    "simplejson==4.3.0", "sortedcontainers==2.4.0", "soupsieve==4.1.3", "starlette==1.10.0",
    "structlog==26.1.0", "tenacity==9.2.1", "tinycss2==1.5.1", "toml==0.10.2", "tomli==2.5.0",
    "tomlkit==0.15.2", "tqdm==4.70.1", "traitlets==5.16.1", "trio==0.35.0", "typer==0.29.2",
    "tzlocal==5.4.5", "urllib3==2.8.0", "voluptuous==0.16.0", "webencodings==0.6.1",
    "webob==1.8.11", "werkzeug==3.1.9", "wrapt==2.5.2", "wsproto==1.3.2",
)
"""Pinned releases with an sdist, each >= 20K characters of library code in >= 3 files; none is
a task package of a shipped config (a test checks). Changing it changes every default start:
bump ``models.tiny.INIT_RECIPE`` with it."""


def _import_packages(root: Path) -> list[Path]:
    """The import packages of an unpacked sdist: folders with an ``__init__.py`` at its top, under
    ``src/`` or under ``lib/``, never tests, docs or examples."""
    out = []
    for base in (root, root / "src", root / "lib"):
        if base.is_dir():
            out += [d for d in sorted(base.iterdir())
                    if d.is_dir() and (d / "__init__.py").is_file()
                    and not d.name.startswith((".", "_")) and d.name not in NOT_SOURCE_DIRS]
    return out


def fetch_repos(spec: str) -> list[Path]:
    """The repositories (one per import package) of the pinned ``spec``, made once from its
    sdist."""
    name, version = parse_spec(spec)
    dest = paths.sub("corpus") / f"{normalize(name)}-{version}"
    if not dest.is_dir():
        tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
        unpacked = unpack(download_sdist(name, version), tmp / ".sdist")
        for pkg in _import_packages(unpacked):
            (tmp / pkg.name).mkdir()
            os.replace(pkg, tmp / pkg.name / pkg.name)
        shutil.rmtree(unpacked)
        try:
            tmp.rename(dest)
        except OSError:  # another process made it first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    return sorted(p for p in dest.iterdir() if p.is_dir())


def banned_names(exclude: Iterable[str]) -> set[str]:
    """The normalised names of ``exclude`` (``NAME`` or ``NAME==VERSION``; distribution or
    import names), as a repository's name is compared with them."""
    return {spec_name(x) for x in exclude if x}


def _kept(specs: Iterable[str], banned: set[str]) -> list[str]:
    return sorted(s for s in specs if normalize(parse_spec(s)[0]) not in banned)


def corpus_repos(exclude: Iterable[str] = (), specs: Iterable[str] = CORPUS) -> list[Path]:
    """Every repository of ``specs`` minus the packages in ``exclude`` (``NAME`` or
    ``NAME==VERSION``; distribution or import names), fetched in parallel on first use."""
    banned = banned_names(exclude)
    with ThreadPoolExecutor(8) as pool:
        repos = [r for rs in pool.map(fetch_repos, _kept(specs, banned)) for r in rs]
    return [r for r in repos if normalize(r.name) not in banned]


def iter_corpus(seed: int, exclude: Iterable[str] = (), specs: Iterable[str] = CORPUS
                ) -> Iterator[Path]:
    """The repositories of ``specs`` minus ``exclude`` in an order seeded by ``seed``, each
    fetched only when reached: a reader that needs little text downloads little."""
    banned = banned_names(exclude)
    order = _kept(specs, banned)
    random.Random(seed).shuffle(order)
    for spec in order:
        yield from (r for r in fetch_repos(spec) if normalize(r.name) not in banned)
