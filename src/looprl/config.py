"""Typed configs: one dataclass per component, a docstring under every field.

Experiments are TOML files under ``configs/``; any field can be overridden from the command line
with a dotted path: ``-o trainer.lr=1e-5 -o rollout.group_size=4``. The resolved config is saved
with every run and checkpoint (``save_config``).

    cfg = load_config(QuickstartConfig, "configs/quickstart.toml", ["trainer.lr=1e-5"])
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import tomllib

from looprl.errors import ConfigError

C = TypeVar("C")


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


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
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} matches none of {args}: {errors}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table of fields, got {value!r}")
        return from_dict(tp, value, where + ".")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v] if not value.startswith("[") else json.loads(value)
        (inner, *_) = typing.get_args(tp) or (Any,)
        seq = [_coerce(v, inner, f"{where}[]") for v in value]
        return tuple(seq) if origin is tuple else seq
    if origin is dict:
        if isinstance(value, str):
            value = json.loads(value)
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp in (int, float, str):
        try:
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return tp(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    if typing.get_origin(tp) is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: expected one of {allowed}, got {value!r}")
        return value
    return value


def from_dict(cls: type[C], data: dict[str, Any], where: str = "") -> C:
    """Build config ``cls`` from a nested dict, rejecting unknown keys with the valid ones listed."""
    hints = _field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"unknown config key(s) {sorted(f'{where}{k}' for k in unknown)}; "
                          f"valid keys{' under ' + where.rstrip('.') if where else ''}: {sorted(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{where}{k}") for k, v in data.items()}
    return cls(**kwargs)


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
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist; see configs/ for examples")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    data = apply_overrides(data, overrides or [])
    return _merge_defaults(cls, data)


def _merge_defaults(cls: type[C], data: dict[str, Any]) -> C:
    return from_dict(cls, data)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as JSON next to a run or checkpoint."""
    Path(path).write_text(json.dumps(to_dict(cfg), indent=2, default=str) + "\n")
