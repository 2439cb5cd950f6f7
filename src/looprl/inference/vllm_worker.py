"""The vLLM side of ``VLLMEngine``: a process of vLLM's own venv serving one model over a socket.

    .venv-vllm/bin/python vllm_worker.py FD CONFIG_JSON   # started by VLLMEngine, not by hand

Imports only the standard library, torch, safetensors and vllm (looprl is not installed in that
venv); ``vllm_rpc.py`` beside it is loaded by path. Requests arrive as token ids and stream back
as deltas: sampled ids, their logprobs (``processed_logprobs``: after temperature / top-p, the
distribution sampled) and the policy version of each token.

Weight updates use vLLM's own RL hooks: pause the scheduler keeping the running requests
(``pause_generation(mode="keep")``: no step runs), reload them in place through
``collective_rpc("reload_weights")`` (checkpoint-format tensors, re-packed for vLLM's kernels as
at start-up; a plain ``load_weights`` fails on CPU, whose linear layers are re-packed), label the weights (``update_weight_version``) and
resume. vLLM tags each step's outputs with that label; the final output of a request lists the
spans of output tokens each version sampled (``CompletionOutput.weight_versions``). Running
requests keep their KV (computed by the old weights, as in looprl's ``TorchEngine``); new
requests get a ``cache_salt`` of the version, so they never reuse prefix blocks computed by older
weights.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any


def _load_rpc() -> Any:
    spec = importlib.util.spec_from_file_location("looprl_vllm_rpc", Path(__file__).with_name("vllm_rpc.py"))
    assert spec is not None and spec.loader is not None, "vllm_rpc.py lies beside this file"
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rpc = _load_rpc()


def _repack_head(worker: Any) -> None:
    """Runs in vLLM's worker after ``reload_weights``. On CPU vLLM computes logits with a packed
    copy of ``lm_head`` (``cpu_linear``); a head tied to the embedding is never "loaded" by a
    reload, so its copy would keep the old weights (measured: logprobs off by up to 0.06)."""
    head = getattr(worker.model_runner.model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is not None and hasattr(head, "cpu_linear") and method is not None:
        method.process_weights_after_loading(head)


def _tap_routes(worker: Any) -> list[int]:
    """Runs in vLLM's engine process once, at start-up: records the experts every MoE layer routes
    each computed position to, per request (``[positions, layers, top_k]`` uint8, 255 = not
    computed: prefix-cache hits), for ``_take_routes``. Returns ``[layers, top_k]``, or ``[]`` for a
    dense model (nothing hooked).

    vLLM's own capture (``enable_return_routed_experts``) needs its V2 runner (Triton); this uses
    the same per-router callback it binds (``BaseRouter.set_capture_fn``: the logical top-k ids
    ``select_experts`` chose) and learns each step's layout — which request owns which rows of the
    flattened batch, from which position on — where the runner builds it (``_prepare_inputs``,
    the order ``query_start_loc`` follows). A step's rows are filed lazily, when the next step
    starts or routes are taken: both happen after its forward, on the engine's one thread."""
    import numpy as np
    import torch
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runner = worker.model_runner
    moe = sorted((m for m in runner.get_model().modules() if isinstance(m, MoERunner)),
                 key=lambda m: m.layer_id)
    if not moe:
        return []
    top_k = int(moe[0].router.top_k)
    state: dict[str, Any] = {"step": None, "cap": {}, "reqs": {}}

    def capture(layer: int, topk_ids: torch.Tensor) -> None:
        state["cap"][layer] = topk_ids.to("cpu", torch.uint8, copy=True)

    for i, m in enumerate(moe):
        m.router.set_capture_fn(lambda ids, i=i: capture(i, ids))

    def flush() -> None:
        step, cap = state["step"], state["cap"]
        state["step"], state["cap"] = None, {}
        if step is None or len(cap) != len(moe):
            return  # a warm-up / profiling forward: no request owns it
        ids_N_L_K = torch.stack([cap[i] for i in range(len(moe))], dim=1).numpy()
        off = 0
        for rid, start, n in zip(*step, strict=True):
            rows = state["reqs"].get(rid)
            if rows is None or len(rows) < start + n:
                grown = np.full((max(start + n, 2 * (0 if rows is None else len(rows))), len(moe), top_k),
                                255, dtype=np.uint8)
                if rows is not None:
                    grown[:len(rows)] = rows
                rows = state["reqs"][rid] = grown
            rows[start:start + n] = ids_N_L_K[off:off + n]
            off += n

    prepare = runner._prepare_inputs

    def prepare_inputs(scheduler_output: Any, num_scheduled_tokens: Any) -> Any:
        flush()
        b = runner.input_batch
        n = b.num_reqs
        state["step"] = (list(b.req_ids[:n]), [int(x) for x in b.num_computed_tokens_cpu[:n]],
                         [int(x) for x in num_scheduled_tokens[:n]])
        return prepare(scheduler_output, num_scheduled_tokens)

    runner._prepare_inputs = prepare_inputs
    runner.looprl_routes = (state, flush)
    return [len(moe), top_k]


def _take_routes(worker: Any, rid: str) -> tuple[bytes, int]:
    """Runs in vLLM's engine process: pops the routes ``_tap_routes`` filed for the request
    ``rid`` (vLLM's internal id is ``rid`` plus ``-`` and 8 random characters); (bytes, positions)."""
    state, flush = worker.model_runner.looprl_routes
    flush()
    keys = [k for k in state["reqs"] if k == rid or (k.startswith(rid + "-") and len(k) == len(rid) + 9)]
    if len(keys) != 1:
        raise KeyError(f"{len(keys)} route records for request {rid!r}")
    rows = state["reqs"].pop(keys[0])
    return rows.tobytes(), len(rows)


class BadArguments(Exception):
    """vLLM refused the engine arguments it was started with."""


class Worker:
    def __init__(self, sock: socket.socket, config: dict[str, Any]) -> None:
        import torch
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        torch.set_num_threads(int(config.pop("threads", 1)))
        self.sock = sock
        self.lock = threading.Lock()
        self.version = int(config.pop("policy_version", 0))
        self.route_shape: list[int] = []
        """``[layers, top_k]`` of a MoE model (routes recorded: ``_tap_routes``), else empty."""
        # vLLM 0.32's CPU runner crashes the engine when a seeded request's partial prefill
        # discards its sampled token ("CPU Generator does not use offset", gpu_model_runner
        # _bookkeeping_sync): on CPU requests sample from the engine's seeded generator instead
        self.request_seeds = torch.cuda.is_available()
        try:  # vLLM refusing an argument (a name it lacks, a bad value) is the caller's to fix
            args = AsyncEngineArgs(skip_tokenizer_init=True, enable_prefix_caching=True,
                                   logprobs_mode="processed_logprobs", enforce_eager=True,
                                   disable_log_stats=False,
                                   **{"distributed_executor_backend": "uni", **config})
            vllm_config = args.create_engine_config()
        except (TypeError, ValueError) as e:  # pydantic's ValidationError is a ValueError
            raise BadArguments(f"{type(e).__name__}: {e}") from e
        self.llm = AsyncLLM.from_vllm_config(vllm_config, disable_log_stats=False)

    def send(self, msg: dict[str, Any]) -> None:
        with self.lock:
            rpc.send(self.sock, msg)

    async def generate(self, m: dict[str, Any]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        rid = m["rid"]
        n_sent = 0
        sp = SamplingParams(max_tokens=m["max_tokens"], temperature=m["temperature"], top_p=m["top_p"],
                            seed=m["seed"] if self.request_seeds else None, logprobs=0, stop_token_ids=m["stop_token_ids"], ignore_eos=True,
                            detokenize=False, output_kind=RequestOutputKind.DELTA)
        try:
            prompt = TokensPrompt(prompt_token_ids=m["prompt"], cache_salt=f"v{self.version}")
            async for out in self.llm.generate(prompt, sp, request_id=rid):
                o = out.outputs[0]
                ids = list(o.token_ids)
                lps = [float(d[t].logprob) for t, d in zip(ids, o.logprobs or [], strict=True)]
                n_sent += len(ids)
                msg: dict[str, Any] = {"kind": "tokens", "rid": rid, "ids": ids, "logprobs": lps}
                if out.finished:
                    spans = [(int(w.version), w.start, w.end) for w in o.weight_versions or []]
                    if not spans or spans[-1][2] != n_sent:
                        raise RuntimeError(f"vLLM labelled {spans} of {n_sent} output tokens")
                    msg.update(finish=o.finish_reason or "abort", prompt_tokens=len(m["prompt"]),
                               cached_tokens=int(out.num_cached_tokens or 0), versions=spans)
                    if self.route_shape:
                        msg["routes"] = await self.routes(rid, len(m["prompt"]), n_sent)
                self.send(msg)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # one bad request is data for the caller, not the end of the worker
            self.send({"kind": "tokens", "rid": rid, "error": f"{type(e).__name__}: {e}",
                       "ids": [], "logprobs": []})

    async def routes(self, rid: str, n_prompt: int, n_out: int) -> dict[str, Any]:
        """The routes of the request's ``n_out`` sampled tokens as ``Routes`` fields: token i was
        sampled from position ``n_prompt - 1 + i`` (the last prompt token's, then each earlier
        sampled token's), whose forward is the one these routes come from (``TorchEngine``'s
        convention)."""
        import base64

        import numpy as np

        layers, top_k = self.route_shape
        (raw, n), = await self.llm.collective_rpc(_take_routes, args=(rid,))
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(n, layers, top_k)[n_prompt - 1:n_prompt - 1 + n_out]
        if len(rows) != n_out or (rows == 255).all(axis=(1, 2)).any():
            raise RuntimeError(f"vLLM computed no routes for some of the {n_out} sampled tokens of {rid}")
        return {"layers": layers, "top_k": top_k, "data": base64.b64encode(rows.tobytes()).decode()}

    async def update_weights(self, m: dict[str, Any], blob: bytes) -> dict[str, Any]:
        version = int(m["version"])
        with tempfile.TemporaryDirectory(dir=_tmp_dir()) as d:
            Path(d, "model.safetensors").write_bytes(blob)
            await self.llm.pause_generation(mode="keep", clear_cache=False)
            try:
                await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": d})
                await self.llm.collective_rpc(_repack_head)
                await self.llm.update_weight_version(str(version))
                self.version = version
            finally:
                await self.llm.resume_generation()
        return {}

    async def metrics(self) -> dict[str, Any]:
        from vllm.v1.metrics.reader import Counter, Gauge, get_metrics_snapshot

        await self.llm.do_log_stats()
        out: dict[str, float] = {}
        for mt in get_metrics_snapshot():  # the Prometheus registry of this (the front) process
            if isinstance(mt, Counter | Gauge):
                out[mt.name] = out.get(mt.name, 0.0) + float(mt.value)
        return {"metrics": out}

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        threading.Thread(target=self._read, args=(loop, inbox), daemon=True).start()
        await self.llm.update_weight_version(str(self.version))
        self.route_shape = (await self.llm.collective_rpc(_tap_routes))[0]
        self.send({"kind": "ready", "route_shape": self.route_shape})
        tasks: dict[str, asyncio.Task] = {}
        while True:
            m, blob = await inbox.get()
            op = m["op"]
            if op == "shutdown":
                break
            if op == "generate":
                tasks[m["rid"]] = asyncio.create_task(self.generate(m))
                tasks = {k: t for k, t in tasks.items() if not t.done()}
            elif op == "abort":  # its stream ends with a final output (finish "abort", versions)
                await self.llm.abort(m["rid"])
            else:
                asyncio.create_task(self._reply(m, blob))
        for t in tasks.values():
            t.cancel()
        self.llm.shutdown()

    async def _reply(self, m: dict[str, Any], blob: bytes) -> None:
        try:
            if m["op"] == "update_weights":
                body = await self.update_weights(m, blob)
            elif m["op"] == "metrics":
                body = await self.metrics()
            else:
                raise ValueError(f"unknown op {m['op']!r}")
            self.send({"kind": "reply", "cid": m["cid"], **body})
        except Exception as e:
            self.send({"kind": "reply", "cid": m["cid"], "error": f"{type(e).__name__}: {e}"})

    def _read(self, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue) -> None:
        try:
            while True:
                loop.call_soon_threadsafe(inbox.put_nowait, rpc.recv(self.sock))
        except (EOFError, OSError):  # the engine closed or died: shut down with it
            loop.call_soon_threadsafe(inbox.put_nowait, ({"op": "shutdown"}, b""))


def _tmp_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    try:
        worker = Worker(sock, json.loads(sys.argv[2]))
    except Exception as e:
        traceback.print_exc()
        error = str(e) if isinstance(e, BadArguments) else f"{type(e).__name__}: {e}"
        rpc.send(sock, {"kind": "fatal", "error": error, "bad_arguments": isinstance(e, BadArguments)})
        raise SystemExit(1) from e
    asyncio.run(worker.serve())


if __name__ == "__main__":  # vLLM spawns its engine process: the guard keeps it from re-running this
    main()
