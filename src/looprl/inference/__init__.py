"""looprl.inference: rollout engines behind the ``Engine`` protocol, picked by name.

    from looprl.inference import make_engine
    engine = make_engine("torch", path="~/.cache/looprl/models/default")       # in-process, CPU
    engine = make_engine("openai", base_url="http://host:8000/v1", model="m")  # any OpenAI server
    engine = make_engine("vllm", model_path="/models/qwen")                    # vLLM (`make vllm`)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from looprl.plugins import find
from looprl.protocols import Engine


def _torch(**kw: Any) -> Engine:
    from looprl.inference.torch_engine import TorchEngine
    if "path" in kw:
        return TorchEngine.from_path(kw.pop("path"), **kw)
    return TorchEngine(**kw)


def _openai(**kw: Any) -> Engine:
    from looprl.inference.openai_engine import OpenAIEngine
    return OpenAIEngine(**kw)


def _vllm(**kw: Any) -> Engine:
    from looprl.inference.vllm_engine import VLLMEngine
    return VLLMEngine(**kw)


ENGINES: dict[str, Callable[..., Engine]] = {"torch": _torch, "openai": _openai, "vllm": _vllm}


def make_engine(name: str, **kwargs: Any) -> Engine:
    """Build the engine registered as ``name`` ("torch", "openai", "vllm", or a plugin:
    ``looprl.plugins``) with its own kwargs."""
    return find("engines", name, ENGINES)(**kwargs)


def __getattr__(name: str) -> Any:
    # lazy: importing a light module of the package (``inference.config``) must not load torch
    if name == "TorchEngine":
        from looprl.inference.torch_engine import TorchEngine
        return TorchEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ENGINES", "TorchEngine", "make_engine"]
