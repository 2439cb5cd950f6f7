"""Every leaf field of a config dataclass, found by introspection (a new field is found too):
what the config tests count and fuzz. A leaf is a field that is not itself a section (a nested
config dataclass); a section that may be absent (``X | None``) is walked like any other.

    >>> from looprl.train.config import TrainConfig
    >>> [leaf.key for leaf in leaves(TrainConfig)][:3]
    ['name', 'seed', 'tasks.train_file']
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


@dataclasses.dataclass(frozen=True)
class Leaf:
    key: str
    """The dotted key a user writes: ``rollout.group_size``."""
    type: Any
    """The field's annotation, ``Annotated`` metadata and ``| None`` kept."""
    default: Any

    @property
    def experimental(self) -> bool:
        return "experimental" in self.key.split(".")


def sections(tp: Any) -> list[type]:
    """The config dataclasses a field of type ``tp`` holds (``X`` or ``X | None``)."""
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    return [t for t in (tp, *(typing.get_args(tp) if union else ()))
            if isinstance(t, type) and dataclasses.is_dataclass(t)]


def leaves(cls: type, prefix: str = "") -> list[Leaf]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out: list[Leaf] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        inner = sections(hints[f.name])
        if inner:
            for section in inner:
                out += leaves(section, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append(Leaf(prefix + f.name, hints[f.name], default))
    return out
