"""Tools, reward terms, feedback signals, task sources and engines, found by name.

    cls = find("tools", "count_lines", TOOLS)     # a built-in, an entry point, or module:attr

A name is looked up, in order:

1. the built-ins of its kind (the registry dict the caller passes);
2. the Python entry points of the group ``looprl.<kind>``, which an installed package declares
   in its ``pyproject.toml``::

       [project.entry-points."looprl.tools"]
       count_lines = "my_pkg.tools:CountLines"

3. a ``module:attr`` string (``my_pkg.tools:CountLines``), imported from ``sys.path`` and
   ``PYTHONPATH``, then from the current directory (as ``python -m`` would).

So users extend looprl without editing it (``docs/extending.md``). What each kind must be:

- ``tools``: a class whose instances follow ``protocols.Tool``; ``__init__`` may ask for any of
  the per-task resources ``make_tools`` passes (``test_command``, ``search_index``, ...);
- ``rewards``: a ``protocols.RewardFn``, ``(task, trajectory) -> float | None``;
- ``signals``: ``feedback.signals.SignalFn``, ``(session, events) -> RewardBreakdown | None``;
- ``task_sources``: ``(seed: int) -> list[Task]``, tasks to train on (split like any others);
- ``engines``: a factory ``(**kwargs) -> protocols.Engine``.
- ``loggers``: a class ``(run_dir, *, run_name, config)`` whose instances follow
  ``trainer.loggers.MetricLogger`` (per-step training metrics).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import TypeVar

from looprl.config import nearest
from looprl.errors import ConfigError

T = TypeVar("T")

KINDS = {"tools": "tool", "rewards": "reward term", "signals": "feedback signal",
         "task_sources": "task source", "engines": "engine", "loggers": "logger"}
"""Each kind of plugin and what one of it is called in messages."""


def _entry_points(kind: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=f"looprl.{kind}")}


def _import(module: str) -> object:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module.split(".")[0] or os.getcwd() in sys.path:
            raise
        sys.path.append(os.getcwd())  # after everything else: it shadows nothing
        return importlib.import_module(module)


def names(kind: str, builtins: Mapping[str, object]) -> list[str]:
    """Every name ``find`` knows without a ``module:attr``: built-ins, then installed plugins."""
    return sorted(builtins) + sorted(set(_entry_points(kind)) - set(builtins))


def find(kind: str, name: str, builtins: Mapping[str, T]) -> T:
    """The ``kind`` plugin called ``name`` (module docstring); ``ConfigError`` if there is none.

    >>> find("rewards", "json:dumps", {}).__name__
    'dumps'
    >>> find("rewards", "no_such_term", {"length": 1})
    Traceback (most recent call last):
    looprl.errors.ConfigError: unknown reward term 'no_such_term': choose one of length, or name your own as module:attr (see docs/extending.md)
    >>> find("rewards", "lenght", {"length": 1})
    Traceback (most recent call last):
    looprl.errors.ConfigError: unknown reward term 'lenght' (did you mean length?): choose one of length, or name your own as module:attr (see docs/extending.md)
    """
    assert kind in KINDS, f"unknown plugin kind {kind!r}"
    if name in builtins:
        return builtins[name]
    ep = _entry_points(kind).get(name)
    what = f"entry point {name!r} of group looprl.{kind}" if ep else f"{kind} plugin {name!r}"
    try:
        if ep is not None:
            return ep.load()
        if ":" in name:
            module, _, attr = name.partition(":")
            obj: object = _import(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            return obj  # type: ignore[return-value]
    except Exception as e:  # noqa: BLE001 — any failure in the user's module is a config error
        raise ConfigError(f"cannot load {what}: {type(e).__name__}: {e}") from None
    known = names(kind, builtins)
    near = nearest(name, known)
    raise ConfigError(f"unknown {KINDS[kind]} {name!r}"
                      + (f" (did you mean {near}?)" if near else "")
                      + f": choose one of {', '.join(known)}, or name your own as module:attr "
                      "(see docs/extending.md)")
