"""Typed configs: one dataclass per component, a docstring under every field.

Experiments are TOML files under ``configs/``; any field can be overridden from the command line
with a dotted path: ``-o grpo.lr=1e-5 -o rollout.group_size=4``. The resolved config is saved
with every run and checkpoint (``save_config``).

    cfg = load_config(TrainConfig, "configs/quickstart.toml", ["grpo.lr=1e-5"])

Everything is checked at load, before any work starts: unknown keys (the nearest valid one is
named), values of the wrong type, and each dataclass's own rules (``__post_init__``). A dataclass
refuses a value with ``FieldError(field, problem)`` (``check_choice`` for named choices), and the
loader names the field by the dotted key the user wrote, whatever section the dataclass sits in.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import tomllib

from looprl.errors import ConfigError

C = TypeVar("C")


class FieldError(ConfigError):
    """A config field holds a value its dataclass refuses. Raised from ``__post_init__`` with the
    field's own name (``loss``); ``from_dict`` re-raises it with the full dotted key
    (``grpo.loss``), so the message names the section the user actually wrote."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} {problem}")
        self.key = key
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # picklable despite two arguments
        return type(self), (self.key, self.problem)


def nearest(name: str, names: Iterable[str]) -> str | None:
    """The closest of ``names`` to a misspelt ``name``, or None when none is close."""
    found = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return found[0] if found else None


def check_choice(key: str, value: object, choices: Iterable[str]) -> None:
    """Raise ``FieldError`` unless ``value`` is one of ``choices`` (naming them and the nearest).

    >>> check_choice("loss", "drgrpo", ["dr_grpo", "grpo", "cispo"])
    Traceback (most recent call last):
    looprl.config.FieldError: loss must be one of cispo, dr_grpo, grpo; got 'drgrpo' (did you mean dr_grpo?)
    """
    options = sorted(choices)
    if value in options:
        return
    near = nearest(str(value), options)
    raise FieldError(key, f"must be one of {', '.join(options)}; got {value!r}"
                          + (f" (did you mean {near}?)" if near else ""))


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "none"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(tp)))
    if origin in (list, tuple):
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "a table"
    return getattr(tp, "__name__", str(tp))


def _json(value: str, tp: Any, where: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise ConfigError(f"{where}: expected {_type_name(tp)} written as JSON, got {value!r}"
                          ) from None


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert ``value`` (from TOML or a CLI string) to the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        errors = []
        for a in args:
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(e)
        tables = [e for a, e in zip(args, errors, strict=True) if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(tables) == 1:
            raise tables[0]  # a section's own error (a key inside it) says more than its type
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table of fields ([{where}] in TOML), "
                              f"got {value!r}")
        return from_dict(tp, value, where + ".")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v] if not value.startswith("[") else _json(
                value, tp, where)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (inner, *_) = typing.get_args(tp) or (Any,)
        seq = [_coerce(v, inner, f"{where}[]") for v in value]
        return tuple(seq) if origin is tuple else seq
    if origin is dict:
        if isinstance(value, str):
            value = _json(value, tp, where)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        _, vt = typing.get_args(tp) or (Any, Any)
        return {str(k): _coerce(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp in (int, float, str):
        return _scalar(value, tp, where)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: expected one of {allowed}, got {value!r}")
        return value
    return value


def _scalar(value: Any, tp: type, where: str) -> Any:
    """``value`` as an int, float or str; tables, lists, booleans-as-numbers and NaN refused."""
    bad = isinstance(value, (dict, list, tuple)) or (tp is not str and isinstance(value, bool))
    try:
        if bad or (tp is int and isinstance(value, float) and not value.is_integer()):
            raise ValueError
        out = tp(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    if tp is float and math.isnan(out):  # NaN passes no range check: it would run unnoticed
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    return out


def from_dict(cls: type[C], data: dict[str, Any], where: str = "") -> C:
    """Build config ``cls`` from a nested dict, rejecting unknown keys with the valid ones listed."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = [k for k in data if k not in names]
    if unknown:
        near = [f"{where}{n}" for n in (nearest(k, names) for k in unknown) if n]
        raise ConfigError(f"unknown config key(s) {[f'{where}{k}' for k in unknown]}"
                          + (f" (did you mean {', '.join(near)}?)" if near else "")
                          + f"; valid keys{' under ' + where.rstrip('.') if where else ''}: "
                          f"{sorted(names)}")
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in data  # type: ignore[arg-type]
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing config key(s) {[f'{where}{k}' for k in missing]}: they have "
                          "no default")
    kwargs = {k: _coerce(v, hints[k], f"{where}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except FieldError as e:
        if not where:
            raise
        raise FieldError(where + e.key, e.problem) from None


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings to a nested dict (values stay strings; ``from_dict`` types them)."""
    out = json.loads(json.dumps(data))
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r} must look like 'section.key=value'")
        path, value = ov.split("=", 1)
        node = out
        *parents, leaf = path.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {ov!r}: {p!r} is a value, not a section")
        node[leaf] = value
    return out


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None) -> C:
    """Defaults of ``cls``, then the TOML file at ``path``, then dotted ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} {'is a directory' if p.is_dir() else 'does not exist'}"
                              "; give a TOML file (examples: configs/)")
        try:
            data = tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    data = apply_overrides(data, overrides or [])
    return from_dict(cls, data)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as JSON next to a run or checkpoint."""
    Path(path).write_text(json.dumps(to_dict(cfg), indent=2, default=str) + "\n")
