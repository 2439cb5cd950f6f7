"""Typed configs: one dataclass per component, a docstring under every field.

Experiments are TOML files under ``configs/``; any field can be overridden from the command line
with a dotted path: ``-o grpo.lr=1e-5 -o rollout.group_size=4``. The resolved config is saved
with every run and checkpoint (``save_config``).

    cfg = load_config(TrainConfig, "configs/quickstart.toml", ["grpo.lr=1e-5"])

Everything is checked at load, before any work starts: unknown keys (the nearest valid one is
named), values of the wrong type, each numeric field's range, and each dataclass's own rules
(``__post_init__``). A field declares its range on its type and the loader checks it::

    group_size: Annotated[int, Range(1, 4096)] = 8
    tis_cap: Annotated[float, Range(0.0, math.inf, lo_open=True)] = 2.0   # (0, inf]: inf = no cap
    tools: Annotated[tuple[str, ...], Length(1, 256)] = DEFAULT_TOOLS

A float field refuses NaN, and refuses inf unless its range reaches a closed inf; a bool is never
a number and a number never a string. A dataclass refuses a value with ``FieldError(field,
problem)`` (``check_choice`` for named choices); the loader names the field by the dotted key
the user wrote, whatever section the dataclass sits in:
``rollout.group_size must be in [1, 4096], got 0``.

A config that code or CLI flags build directly (not through ``from_dict``) calls
``check_ranges(self)`` in its ``__post_init__``, so the one declaration is checked either way.
A key a config no longer has but older files may hold is named in the dataclass's ``RETIRED``
(``ClassVar``: key -> what to do instead); a key that moved into a nested section is found
there by name, and the error says where it is now.

To give a config its ranges, annotate its numeric fields (and, where empty is wrong, its
strings and lists) and drop the hand checks of its ``__post_init__`` that only checked ranges;
``tests/test_config.py`` fuzzes every field of the root configs it lists (``ROOTS``).

Sections named ``experimental`` hold a component's research switches and tuning knobs: each
default is the measured choice, and a newcomer trains without reading them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

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
    raise FieldError(key, f"must be one of {', '.join(options)}; got {_show(value)}"
                          + (f" (did you mean {near}?)" if near else ""))


def _num(x: float) -> str:
    """A bound as it reads best: 4096, 1e-05, inf."""
    return str(int(x)) if math.isfinite(x) and float(x).is_integer() and abs(x) < 1e15 else repr(
        float(x))


def _show(value: Any) -> str:
    """``repr(value)`` cut to one readable line (a 10,000-character string stays one line)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric config field, ``lo <= x <= hi``; ``lo_open`` / ``hi_open``
    exclude a bound; ``hint`` ends the error (what to do instead). A float field admits inf only
    where ``hi`` is a closed inf (``-inf`` the same for ``lo``); NaN never.

    >>> Range(1, 4096).problem(0)
    'must be in [1, 4096], got 0'
    >>> Range(0.0, 1.0, lo_open=True).problem(1.0) is None
    True
    """

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    hint: str = ""

    def __post_init__(self) -> None:
        assert self.lo <= self.hi, f"empty range {self}"

    @property
    def admits_inf(self) -> bool:
        return (self.hi == math.inf and not self.hi_open) or (self.lo == -math.inf
                                                              and not self.lo_open)

    def problem(self, x: float) -> str | None:
        """Why ``x`` is out of range, or None when it is in."""
        low_ok = x > self.lo if self.lo_open else x >= self.lo
        high_ok = x < self.hi if self.hi_open else x <= self.hi
        if low_ok and high_ok:
            return None
        span = (f"{'(' if self.lo_open else '['}{_num(self.lo)}, "
                f"{_num(self.hi)}{')' if self.hi_open else ']'}")
        return f"must be in {span}, got {_show(x)}" + (f"; {self.hint}" if self.hint else "")


@dataclass(frozen=True)
class Length:
    """The valid lengths of a string, list or table config field, ``lo <= len(x) <= hi``.

    >>> Length(1, 64).problem(())
    'must have 1 to 64 entries, got 0'
    """

    lo: int
    hi: int

    def problem(self, x: Any) -> str | None:
        if self.lo <= len(x) <= self.hi:
            return None
        what = "characters" if isinstance(x, str) else "entries"
        return f"must have {self.lo} to {self.hi} {what}, got {len(x)}"


Seed = Annotated[int, Range(0, 2**32 - 1)]
"""A random seed: what numpy, torch and ``random`` all take."""
Share = Annotated[float, Range(0.0, 1.0)]
"""A fraction in [0, 1]."""
Tokens = Annotated[int, Range(1, 2**30)]
"""A positive token count; 2^30 is far beyond any context window, so a slip such as 10^26 is
refused."""


def _checks(tp: Any) -> tuple[Any, list[Range | Length]]:
    """``(the plain type, its Range/Length checks)`` of a possibly ``Annotated`` type."""
    if typing.get_origin(tp) is Annotated:
        base, *meta = typing.get_args(tp)
        return base, [m for m in meta if isinstance(m, (Range, Length))]
    return tp, []


def _type_name(tp: Any) -> str:
    tp, _ = _checks(tp)
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
        raise ConfigError(f"{where}: expected {_type_name(tp)} written as JSON, got {_show(value)}"
                          ) from None


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert ``value`` (from TOML or a CLI string) to the annotated type ``tp`` and check it
    against the type's ``Range`` / ``Length``."""
    base, checks = _checks(tp)
    if checks:
        inf_ok = any(isinstance(c, Range) and c.admits_inf for c in checks)
        out = (_scalar(value, base, where, inf_ok) if base in (int, float)
               else _coerce(value, base, where))
        for c in checks:
            problem = None if out is None else c.problem(out)
            if problem:
                raise FieldError(where, problem)
        return out
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
        # a value of the right type but out of range, or a section's own error (a key inside
        # it), says more than the union's type
        ranged = [e for e in errors if isinstance(e, FieldError)]
        if ranged:
            raise ranged[0]
        tables = [e for a, e in zip(args, errors, strict=True) if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(tables) == 1:
            raise tables[0]
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {_show(value)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table of fields ([{where}] in TOML), "
                              f"got {_show(value)}")
        return from_dict(cast(type, tp), value, where + ".")
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v] if not value.startswith("[") else _json(
                value, tp, where)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {_show(value)}")
        (inner, *_) = typing.get_args(tp) or (Any,)
        seq = [_coerce(v, inner, f"{where}[]") for v in value]
        return tuple(seq) if origin is tuple else seq
    if origin is dict:
        if isinstance(value, str):
            value = _json(value, tp, where)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {_show(value)}")
        _, vt = typing.get_args(tp) or (Any, Any)
        return {str(k): _coerce(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where}: expected true/false, got {_show(value)}")
    if tp in (int, float, str):
        return _scalar(value, tp, where)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: expected one of {allowed}, got {_show(value)}")
        return value
    return value


def _scalar(value: Any, tp: type, where: str, inf_ok: bool = False) -> Any:
    """``value`` as an int, float or str: a string is parsed into a number (CLI overrides are
    strings); tables, lists, booleans as numbers, numbers as strings, NaN and (unless
    ``inf_ok``) inf refused."""
    bad = (isinstance(value, (dict, list, tuple)) or isinstance(value, bool) and tp is not bool
           or tp is str and not isinstance(value, str))
    try:
        if bad or (tp is int and isinstance(value, float) and not value.is_integer()):
            raise ValueError
        out = tp(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {_show(value)}") from None
    if tp is float and (math.isnan(out) or math.isinf(out) and not inf_ok):
        # NaN passes no range check and inf overflows what it touches: either runs unnoticed
        raise ConfigError(f"{where}: expected a finite number, got {_show(value)}")
    return out


def _moved(cls: type, key: str) -> str | None:
    """The one field called ``key`` in a section nested in ``cls`` (``experimental.max_heldout``
    for ``max_heldout``): where a key of an older config now lives."""
    found: list[str] = []

    def walk(c: type, prefix: str) -> None:
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            sections = [t for t in (hints[f.name], *typing.get_args(hints[f.name]))
                        if isinstance(t, type) and dataclasses.is_dataclass(t)]
            if prefix and f.name == key:
                found.append(prefix + f.name)
            for t in sections:
                walk(t, f"{prefix}{f.name}.")

    walk(cls, "")
    return found[0] if len(found) == 1 else None


def from_dict(cls: type[C], data: dict[str, Any], where: str = "") -> C:
    """Build config ``cls`` from a nested dict, rejecting unknown keys with the valid ones listed."""
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = [k for k in data if k not in names]
    retired = getattr(cls, "RETIRED", {})
    for k in unknown:
        if k in retired:
            raise ConfigError(f"config key {where}{k} was removed: {retired[k]}")
    if unknown:
        near = [f"{where}{n}" for n in (_moved(cls, k) or nearest(k, names) for k in unknown) if n]
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


def check_ranges(cfg: Any) -> None:
    """Raise ``FieldError`` for a field of ``cfg`` (a config dataclass) outside its declared
    ``Range`` / ``Length``: for the ``__post_init__`` of a config that code or a CLI's flags
    build directly, not only ``from_dict`` (which checks every value it reads already).

    >>> @dataclass(frozen=True)
    ... class Users:
    ...     population: Annotated[int, Range(1, 10_000)] = 10
    ...     def __post_init__(self) -> None: check_ranges(self)
    >>> Users(population=0)
    Traceback (most recent call last):
    looprl.config.FieldError: population must be in [1, 10000], got 0
    """
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        _, checks = _checks(hints[f.name])
        for c in checks:
            problem = None if value is None else c.problem(value)
            if problem:
                raise FieldError(f.name, problem)


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
