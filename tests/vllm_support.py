"""Whether the vLLM tests can run here: `make vllm`'s venv (vLLM's CPU build on this machine).
Without it they skip, except under CI (``CI`` or ``LOOPRL_REQUIRE_SANDBOX=1``), where they fail:
`make test` builds it first. Shared by every test package that starts a vLLM worker."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from looprl.inference.vllm_engine import find_vllm_python


def require_vllm() -> None:
    """Skip the calling test (fail it under CI) when there is no vLLM venv."""
    if find_vllm_python() is None:
        why = "no .venv-vllm: run `make vllm`"
        if os.environ.get("LOOPRL_REQUIRE_SANDBOX") == "1" or os.environ.get("CI"):
            pytest.fail(f"{why} (CI runs the vLLM tests; `make test` builds it)")
        pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(cmd: list[str], health_url: str, env: dict[str, str], what: str) -> Iterator[None]:
    """Run ``cmd`` (a server that starts vLLM: minutes on 2 cores) until ``health_url`` answers
    200, then yield; the test fails with the log's tail if it exits or is not healthy in 600 s.
    Terminated (killed after 60 s) on the way out."""
    log = tempfile.NamedTemporaryFile(prefix="looprl-vllm-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{what} exited {proc.returncode}: "
                            f"{Path(log.name).read_text()[-3000:]}")
            try:
                if httpx.get(health_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{what} not healthy in 600 s: {Path(log.name).read_text()[-3000:]}")
            time.sleep(1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
