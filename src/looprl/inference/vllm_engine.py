"""VLLMEngine: the ``Engine`` protocol over an in-process vLLM ``AsyncLLM`` (GPU machines).

    engine = VLLMEngine("/models/qwen2.5-coder-1.5b", dtype="bfloat16", gpu_memory_utilization=0.6)
    gen = await engine.generate(prompt_ids, SamplingParams(), session_id=traj_id, group_id=gid)

vLLM's automatic prefix caching gives what TorchEngine does by hand: a group's shared prompt and a
session's earlier turns hit cached KV blocks, so ``session_id`` / ``group_id`` need no bookkeeping
here. Logprobs are requested as ``processed_logprobs`` (after temperature / top-p), the
distribution actually sampled. Weight updates call each worker's ``model.load_weights`` through
``collective_rpc`` and reset the prefix cache (old KV was computed by the old weights).

vLLM is optional (``pip install looprl[vllm]``; CUDA only): importing this module works without it,
constructing a ``VLLMEngine`` raises ``ConfigError`` saying how to install it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Literal

import torch

from looprl.errors import ConfigError, PolicyError
from looprl.types import Generation, SamplingParams

try:  # optional dependency
    import vllm
    from vllm import AsyncEngineArgs
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM
except ImportError:  # pragma: no cover - exercised only where vLLM is missing
    vllm = None


def _load_weights_on_worker(worker: Any, items: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside each vLLM worker (``collective_rpc``): load the new tensors in place."""
    device = next(worker.model_runner.model.parameters()).device
    worker.model_runner.model.load_weights(weights=[(k, v.to(device)) for k, v in items])


class VLLMEngine:
    """See the module docstring."""

    def __init__(self, model_path: str, *, dtype: str = "auto", max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.8, seed: int = 0, **engine_kwargs: Any) -> None:
        if vllm is None:
            raise ConfigError("the 'vllm' engine needs vLLM (CUDA only): `pip install looprl[vllm]` "
                              "on a GPU machine, or use engine 'torch' / 'openai'")
        args = AsyncEngineArgs(model=model_path, dtype=dtype, max_model_len=max_model_len,
                               gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                               enable_prefix_caching=True, logprobs_mode="processed_logprobs",
                               **engine_kwargs)
        self._llm = AsyncLLM.from_engine_args(args)
        self.tokenizer = self._llm.tokenizer
        self._version = 0
        self._ids = itertools.count()

    @property
    def policy_version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation:
        sp = VLLMSamplingParams(max_tokens=params.max_new_tokens, temperature=params.temperature,
                                top_p=params.top_p, stop=list(params.stop), seed=params.seed,
                                logprobs=0, skip_special_tokens=False)
        request_id = f"{session_id or 'req'}-{next(self._ids)}"
        version = self._version  # vLLM cannot tell per token; the version at the request's start
        final = None
        try:
            async for out in self._llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), sp,
                                                request_id=request_id):
                final = out
        except Exception as e:
            raise PolicyError(f"vLLM generate failed: {type(e).__name__}: {e}") from e
        if final is None or not final.outputs:
            raise PolicyError(f"vLLM returned no output for request {request_id}")
        o = final.outputs[0]
        ids = list(o.token_ids)
        lps = [float(d[t].logprob) for t, d in zip(ids, o.logprobs or [], strict=False)]
        if len(lps) != len(ids):
            raise PolicyError("vLLM returned logprobs for fewer tokens than it generated")
        r = o.finish_reason
        finish: Literal["stop", "length", "abort"] = (
            "stop" if r == "stop" else "length" if r == "length" else "abort")
        return Generation(tuple(ids), tuple(lps), (version,) * len(ids), finish, o.text)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        items = [(k, v.detach().cpu()) for k, v in state_dict.items()]
        await self._llm.collective_rpc(_load_weights_on_worker, args=(items,))
        await self._llm.reset_prefix_cache()
        self._version = version

    async def release(self, session_id: str) -> None:
        """Nothing to do: vLLM's prefix cache evicts unused blocks itself."""

    def close(self) -> None:
        self._llm.shutdown()
