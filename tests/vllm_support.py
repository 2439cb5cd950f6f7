"""Whether the vLLM tests can run here: `make vllm`'s venv (vLLM's CPU build on this machine).
Without it they skip, except under CI (``CI`` or ``LOOPRL_REQUIRE_SANDBOX=1``), where they fail:
`make test` builds it first. Shared by every test package that starts a vLLM worker."""

from __future__ import annotations

import os

import pytest

from looprl.inference.vllm_engine import find_vllm_python


def require_vllm() -> None:
    """Skip the calling test (fail it under CI) when there is no vLLM venv."""
    if find_vllm_python() is None:
        why = "no .venv-vllm: run `make vllm`"
        if os.environ.get("LOOPRL_REQUIRE_SANDBOX") == "1" or os.environ.get("CI"):
            pytest.fail(f"{why} (CI runs the vLLM tests; `make test` builds it)")
        pytest.skip(why)
