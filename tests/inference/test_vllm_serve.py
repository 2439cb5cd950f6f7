"""The OpenAI engine against a real ``vllm serve`` process (an external server, as users run it).

Needs `make vllm`'s .venv-vllm (CPU build here); skips without it, fails under CI.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from looprl.inference.openai_engine import OpenAIEngine
from looprl.inference.vllm_engine import find_vllm_python
from looprl.types import SamplingParams
from tests.vllm_support import free_port, require_vllm, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require_vllm()
    py = find_vllm_python()
    from looprl.models.tiny import init_default_model
    model = init_default_model(tmp_path_factory.mktemp("m"), size="small", corpus_chars=200_000)
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "PYTHONPATH": ""}
    # `vllm serve`'s CLI asks importlib.metadata for a "vllm" distribution, which the CPU build
    # (distribution "vllm-cpu") lacks; its API server module is the same server without that
    with serving([str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                  "--served-model-name", "looprl", "--host", "127.0.0.1", "--port", str(port),
                  "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
                  "--gpu-memory-utilization", "0.1", "--seed", "0"],
                 f"http://127.0.0.1:{port}/health", env, "vllm serve"):
        yield model, f"http://127.0.0.1:{port}/v1"


@pytest.mark.slow
def test_openai_engine_gets_token_ids_and_logprobs_from_vllm_serve(server):
    _, url = server

    async def go():
        engine = OpenAIEngine(url, "looprl")
        try:
            params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=1)
            gens = await asyncio.gather(*(engine.generate(list(range(20, 40)), params,
                                                          group_id="g") for _ in range(2)))
            with pytest.raises(Exception, match="does not accept weight updates"):
                await engine.update_weights({}, 1)
            return gens
        finally:
            await engine.aclose()

    for g in asyncio.run(go()):
        n = len(g.token_ids)
        assert 1 <= n <= 12 and len(g.logprobs) == n and g.policy_versions == (0,) * n
        assert all(lp <= 0.0 for lp in g.logprobs) and any(lp < 0.0 for lp in g.logprobs)
