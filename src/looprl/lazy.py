"""Lazy re-exports for package ``__init__`` files: a package names its public API without
importing it, so importing one light module of the package (the one a command needs, say) does not drag in
torch, transformers or a web server through the package (``looprl --help`` stays well under a
second).

    # looprl/harness/__init__.py
    from looprl.lazy import lazy_exports

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {
        "agent": ["AgentConfig", "run_agent"],      # submodule -> the names the package exports
        "format": ["ChatFormat", "parse_turn"],
    })

``from looprl.harness import run_agent`` imports ``looprl.harness.agent`` on first use (a PEP 562
module ``__getattr__``) and binds the name in the package, so later lookups are plain attribute
reads. The submodules named are reachable as attributes too (``looprl.harness.agent``). A name
exported from the submodule of the same name (``looprl.trainer.sft``, the function in ``sft.py``)
means the export, as an eager ``from .sft import sft`` would: the package keeps the import system
from binding the submodule over it.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any


class _Package(types.ModuleType):
    """A package whose exports named like their submodule are not replaced by the submodule when
    the import system binds it (it does so the first time anyone imports the submodule)."""

    _looprl_shadowed: frozenset[str] = frozenset()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._looprl_shadowed and isinstance(value, types.ModuleType):
            self.__dict__.pop(name, None)  # the next lookup goes through __getattr__: the export
            return
        super().__setattr__(name, value)


def lazy_exports(package: str, exports: Mapping[str, Iterable[str]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, exporting each submodule's names."""
    home = {name: module for module, names in exports.items() for name in names}
    shadowed = frozenset(n for n, m in home.items() if n == m)
    if shadowed:
        module = sys.modules[package]
        module.__class__ = _Package
        module._looprl_shadowed = shadowed  # type: ignore[attr-defined]

    def __getattr__(name: str) -> Any:
        if name in home:
            value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
            setattr(sys.modules[package], name, value)
            return value
        if name in exports:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(home))

    return __getattr__, __dir__, sorted(home)
