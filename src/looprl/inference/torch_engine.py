"""TorchEngine: the in-process rollout engine (continuous batching over a static KV cache).

    engine = TorchEngine.from_path("~/.cache/looprl/models/default", dtype="float32")
    gen = await engine.generate(prompt_ids, SamplingParams(temperature=1.0),
                                session_id=traj_id, group_id=group_id)
    await engine.update_weights(state_dict, version=3)   # applied between decode steps
    await engine.release(traj_id)                         # the trajectory ended

One background thread owns the model and the cache and runs the loop: apply commands (new
requests, releases, weight updates) -> admit waiting requests (prefill only what is not cached)
-> one decode step for every running request together. Requests join and leave the batch between
steps, so a trajectory waiting on its tools simply has no request in flight. It runs on the
model's device (move the model before building the engine); the random generators stay on CPU,
so a seeded request draws the same random numbers on any device.

KV reuse, by cache *entry* (one slot of the static cache each):
- ``s:<session_id>`` keeps a trajectory's KV across turns; the harness resends the full context
  and only the tokens after the longest common prefix are prefilled.
- ``g:<group_id>`` holds a group's first prompt; the other G-1 rollouts copy its KV rows instead
  of prefilling the same prompt again.
- When slots run out (``kv_budget_mb``), the least recently used idle entry is evicted; a session
  that comes back is recomputed from its prompt.

Speculative decoding (``speculative="auto" | "on" | "off"``, ``inference/spec.py``): when the
model carries MTP heads (``looprl.models.mtp``; ``load_model`` attaches saved ones) or
``lookup`` > 0 (prompt lookup: drafts copied from the row's own context, any model), a step
drafts k tokens per row, verifies all rows' drafts in one forward of k+1 tokens, and keeps each
row's accepted prefix plus one token by exact rejection sampling. Rows accept different
numbers of tokens; a row's rejected drafts leave KV past its length, which its next step
overwrites (the cache is position-addressed, so rollback is the length alone). Heads
are swapped with the weights (their keys are part of ``model.state_dict()``). ``auto`` measures
plain and speculative steps per batch size and uses the faster one (``engine.metrics()``).

MoE models (Qwen3-MoE): every ``Generation`` carries ``routes``, the top-k experts of each MoE
layer at the position each sampled token was sampled from (uint8), which the trainer can replay
(``looprl.models.moe``, ``grpo.experimental.router_replay``).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from looprl import faults
from looprl.errors import ConfigError, ContextFullError, InfraKind, PolicyError
from looprl.inference.kv_forward import CachedForward, ForwardOut
from looprl.inference.sampling import sample_B
from looprl.inference.spec import Drafter, NgramIndex, SpecController, accept
from looprl.models.loading import load_model, resolve_dtype
from looprl.models.mtp import heads_of
from looprl.types import Generation, Routes, SamplingParams


@dataclass
class _Entry:
    """A cache slot's owner: the tokens whose KV sits in positions 0..len(tokens)-1 of ``slot``."""

    key: str
    slot: int
    tokens: list[int] = field(default_factory=list)
    last_used: float = 0.0
    active: bool = False
    released: bool = False
    prefix: _Entry | None = None
    """The group entry whose first ``prefix_len`` positions equal ours (cascade attention)."""
    prefix_len: int = 0


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    key: str
    group_key: str | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    generator: torch.Generator | None = None
    entry: _Entry | None = None
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routes: list[torch.Tensor] = field(default_factory=list)
    """MoE models: per sampled token, the [L, K] uint8 experts of the forward that sampled it."""
    finish: Literal["stop", "length"] | None = None
    hidden: torch.Tensor | None = None
    """The LM head's input that gave the last sampled token's distribution (drafting starts there)."""
    index: NgramIndex | None = None
    """The n-grams of ``prompt_ids + out_ids`` (prompt lookup), built at the request's first
    speculative step."""

    @property
    def live_entry(self) -> _Entry:
        """``entry`` of a request in the batch (``_rows``): ``_start`` set it before adding it."""
        assert self.entry is not None, "only a request admitted by _start has a cache entry"
        return self.entry


@dataclass
class EngineStats:
    """Counters for benchmarks and dashboards (prefill work saved by KV reuse, ...)."""

    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    reused_session_tokens: int = 0
    reused_group_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    busy_s: float = 0.0
    """Seconds the decode thread spent admitting (prefill) and decoding: the loop's per-step
    engine busy/idle and its overlap with the trainer's step (``trainer.grpo``)."""
    evictions: int = 0
    weight_updates: int = 0
    threads: int = 0
    """The decode thread's torch intra-op threads at its last step."""


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TorchEngine:
    """The ``Engine`` protocol over a local HF Llama-family model (see module docstring)."""

    def __init__(self, model, tokenizer, *, max_len: int | None = None, max_batch: int = 64,
                 kv_budget_mb: float = 2048.0, seed: int = 0, stop_on_eos: bool = True,
                 num_threads: int | None = None, max_slots: int = 256, cascade: bool = True,
                 speculative: str = "auto", lookup: int = 0, policy_version: int = 0) -> None:
        """``policy_version``: the version of ``model``'s weights (a served policy's), which its
        tokens carry until ``update_weights`` brings another."""
        # torch's intra-op thread count is per OS thread and a new thread takes the count last
        # set anywhere in the process at its first op: the decode thread sets its own (in _run),
        # or it would run with whatever the trainer set meanwhile
        self._num_threads = num_threads
        self.model = model.eval()
        self.tokenizer = tokenizer
        limit = getattr(model.config, "max_position_embeddings", 4096)
        self.max_len = min(max_len or limit, limit)
        probe = CachedForward(model, 1, self.max_len)
        num_slots = max(2, min(max_slots, int(kv_budget_mb * 2**20 // probe.slot_bytes)))
        del probe
        self.fwd = CachedForward(model, num_slots, self.max_len)
        self.max_batch = min(max_batch, num_slots)
        self.cascade = cascade  # attend to a group's shared prompt once per group, not per row
        self.eos_ids = self._eos_ids(tokenizer, model) if stop_on_eos else set()
        self.stats = EngineStats()
        heads = heads_of(model)
        if lookup < 0:
            raise ConfigError(f"engine lookup={lookup}: the tokens a step drafts by prompt lookup "
                              "must be >= 0 (0 = none)")
        self.drafter = Drafter(model, heads, lookup) if heads is not None or lookup else None
        # speculative: "auto" drafts when it pays per batch size, "on" always, "off" never
        self.spec = SpecController(speculative, self.drafter.max_draft if self.drafter else 0)
        self._version = policy_version
        self._gen = torch.Generator().manual_seed(seed)
        self._commands: queue.Queue = queue.Queue()
        self._waiting: list[_Request] = []
        self._rows: list[_Request] = []  # running requests; row i decodes in cache slot i
        self._answers: list[tuple[_Request, Generation]] = []
        """Requests the current step finished, answered once it is counted (``_answer``)."""
        self._entries: dict[str, _Entry] = {}
        self._owner: list[_Entry | None] = [None] * num_slots
        self._ids = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="looprl-torch-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_path(cls, path: str | Path, dtype: str | torch.dtype = "float32", **kwargs) -> TorchEngine:
        lm = load_model(path, dtype=resolve_dtype(dtype))
        return cls(lm.model, lm.tokenizer, **kwargs)

    @staticmethod
    def _eos_ids(tokenizer, model) -> set[int]:
        ids = set()
        for t in ("<|im_end|>", tokenizer.eos_token):
            i = tokenizer.convert_tokens_to_ids(t) if t else None
            if isinstance(i, int) and i != tokenizer.unk_token_id:
                ids.add(i)
        eos = model.config.eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return ids

    # -- public API (event-loop side) ---------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return int(getattr(self.model.config, "vocab_size", 0) or len(self.tokenizer))

    @property
    def weights_bytes(self) -> int:
        """Bytes of a safetensors file that holds every weight (tensors and a header bound)."""
        tensors = self.model.state_dict()
        return sum(t.numel() * t.element_size() for t in tensors.values()) + 256 * len(tensors)

    @property
    def num_slots(self) -> int:
        return self.fwd.num_slots

    def metrics(self) -> dict[str, float]:
        """For the run's log: speculation (acceptance, tokens per verify step, measured speed-up
        of speculative over plain steps, share of steps that drafted) and decoding counters."""
        st = self.stats
        return {**{f"engine/{k}": v for k, v in self.spec.metrics().items()},
                "engine/generated_tokens": float(st.generated_tokens),
                "engine/decode_steps": float(st.decode_steps),
                "engine/busy_s": st.busy_s,
                "engine/prefill_fraction": st.prefilled_tokens / max(st.prompt_tokens, 1)}

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation:
        if self._closed:
            raise PolicyError("TorchEngine is closed; create a new engine")
        faults.maybe_raise(InfraKind.ENGINE_ERROR, "TorchEngine.generate")
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; render at least the chat template's header")
        if len(prompt_ids) >= self.max_len:
            raise ContextFullError(f"prompt of {len(prompt_ids)} tokens does not fit the engine's "
                                   f"context of {self.max_len}; summarize or shorten the context")
        if params.max_new_tokens < 1:
            raise ValueError("SamplingParams.max_new_tokens must be >= 1")
        loop = asyncio.get_running_loop()
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        key = f"s:{session_id}" if session_id is not None else f"r:{next(self._ids)}"
        req = _Request(list(prompt_ids), params, key, f"g:{group_id}" if group_id else None,
                       loop, loop.create_future(), gen)
        self._commands.put(("generate", req))
        return await req.future

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._commands.put(("weights", (state_dict, version, fut, asyncio.get_running_loop())))
        await fut

    async def release(self, session_id: str) -> None:
        self._commands.put(("release", f"s:{session_id}"))

    def close(self) -> None:
        """Stop the decode thread (pending requests fail with PolicyError)."""
        if not self._closed:
            self._closed = True
            self._commands.put(("stop", None))
            self._thread.join(timeout=30)

    # -- decode thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        if self._num_threads is not None:
            torch.get_num_threads()  # this thread's lazy init first, so it keeps the count below
            torch.set_num_threads(self._num_threads)
        while True:
            block = not self._rows and not self._waiting
            try:
                cmd, arg = self._commands.get(timeout=0.5 if block else None) if block \
                    else self._commands.get_nowait()
                if cmd == "stop":
                    self._fail_all(PolicyError("TorchEngine was closed"))
                    return
                self._apply(cmd, arg)
                continue  # drain every queued command before the next step
            except queue.Empty:
                pass
            working, t = bool(self._rows or self._waiting), time.monotonic()
            try:
                self._admit()
                if self._rows:
                    self._step()
            except Exception as e:  # an engine bug must not hang the callers: fail them as infra
                self._fail_all(PolicyError(f"TorchEngine step failed: {type(e).__name__}: {e}"))
            if working:
                self.stats.busy_s += time.monotonic() - t
            self._answer()

    def _apply(self, cmd: str, arg) -> None:
        if cmd == "generate":
            self._waiting.append(arg)
        elif cmd == "release":
            e = self._entries.get(arg)
            if e is not None:
                e.released = True
                if not e.active:
                    self._free(e)
        elif cmd == "weights":
            state_dict, version, fut, loop = arg
            try:
                self._load_weights(state_dict)
                self.fwd.refresh_weights()
                self._version = version
                self.stats.weight_updates += 1
                loop.call_soon_threadsafe(_resolve, fut, None, None)
            except Exception as e:
                loop.call_soon_threadsafe(_resolve, fut, None, e)

    def _load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        params = self.model.state_dict(keep_vars=True)  # includes tied aliases (lm_head.weight)
        unknown = [k for k in state_dict if k not in params]
        if unknown:
            raise ConfigError(f"update_weights: unknown parameter names {unknown[:5]}; "
                              "keys must match model.state_dict()")
        with torch.no_grad():
            for k, v in state_dict.items():
                if params[k].shape != v.shape:
                    raise ConfigError(f"update_weights: {k} has shape {tuple(v.shape)}, "
                                      f"the model expects {tuple(params[k].shape)}")
                if params[k].data_ptr() != v.data_ptr():
                    params[k].copy_(v)

    # -- slots -----------------------------------------------------------------------------------
    def _free(self, e: _Entry) -> None:
        if self._entries.get(e.key) is e:
            del self._entries[e.key]
        self._owner[e.slot] = None

    def _alloc(self, key: str, keep: set[str]) -> _Entry | None:
        """A slot for a new entry: a free one, else the LRU idle entry's (evicted)."""
        free = [s for s in range(len(self._rows), self.num_slots) if self._owner[s] is None]
        if not free:
            pinned = {id(r.live_entry.prefix) for r in self._rows if r.live_entry.prefix is not None}
            idle = [e for e in self._entries.values()
                    if not e.active and e.key not in keep and id(e) not in pinned]
            if not idle:
                return None
            victim = min(idle, key=lambda e: e.last_used)
            self._free(victim)
            self.stats.evictions += 1
            free = [victim.slot]
        e = _Entry(key, free[0], last_used=time.monotonic())
        self._entries[key] = e
        self._owner[e.slot] = e
        return e

    def _move(self, e: _Entry, dst: int) -> None:
        """Put entry ``e`` in slot ``dst``, swapping with whatever is there."""
        other = self._owner[dst]
        if e.slot == dst:
            return
        self.fwd.swap_slots(e.slot, dst, len(e.tokens), len(other.tokens) if other else 0)
        self._owner[e.slot], self._owner[dst] = other, e
        if other is not None:
            other.slot = e.slot
        e.slot = dst

    # -- admission (prefill) ----------------------------------------------------------------------
    def _admit(self) -> None:
        still = []
        for req in self._waiting:
            if req.future.cancelled():
                continue
            if len(self._rows) >= self.max_batch or not self._start(req):
                still.append(req)
        self._waiting = still

    def _start(self, req: _Request) -> bool:
        e = self._entries.get(req.key)
        if e is not None and e.active:
            return False  # the same session already has a request running: wait for it
        keep = {req.key, req.group_key or ""}
        if e is None:
            e = self._alloc(req.key, keep)
            if e is None:
                return False
        e.released, e.last_used = False, time.monotonic()
        prompt = req.prompt_ids
        n = _lcp(e.tokens, prompt)
        g = self._entries.get(req.group_key) if req.group_key else None
        gn = _lcp(g.tokens, prompt) if g is not None else 0
        if g is not None and gn > n:  # gn > n >= 0 only when g exists
            self.fwd.copy_slot(g.slot, e.slot, gn)
            g.last_used = e.last_used
            self.stats.reused_group_tokens += gn
            n = gn
            e.prefix, e.prefix_len = g, gn
        else:
            self.stats.reused_session_tokens += min(n, len(prompt) - 1)
        n = min(n, len(prompt) - 1)  # always run the last prompt token: its logits start decoding
        e.prefix_len = min(e.prefix_len, n)
        e.tokens = prompt[:n]
        out = self.fwd.prefill(prompt[n:], e.slot, n)
        e.tokens = list(prompt)
        self.stats.prompt_tokens += len(prompt)
        self.stats.prefilled_tokens += len(prompt) - n
        if req.group_key and g is None:
            self._share_group_prompt(req.group_key, e, keep)
        req.entry = e
        e.active = True
        self._move(e, len(self._rows))
        self._rows.append(req)
        self._sample_and_finish(out, [req])
        return True

    def _share_group_prompt(self, group_key: str, e: _Entry, keep: set[str]) -> None:
        g = self._alloc(group_key, keep)
        if g is not None:
            self.fwd.copy_slot(e.slot, g.slot, len(e.tokens))
            g.tokens = list(e.tokens)
            e.prefix, e.prefix_len = g, len(e.tokens) - 1

    def _prefix(self, e: _Entry) -> tuple[int, int] | None:
        g = e.prefix
        if g is None or e.prefix_len <= 0 or self._entries.get(g.key) is not g:
            e.prefix = None
            return None
        return (g.slot, e.prefix_len)

    # -- decoding ------------------------------------------------------------------------------
    def _step(self) -> None:
        rows = list(self._rows)  # finished rows leave self._rows during the step
        B = len(rows)
        k = self.spec.draft_len(B)
        if k and max(len(r.live_entry.tokens) for r in rows) + k + 2 > self.max_len:
            k = 0  # a row is near the end of its context: the draft would not fit
        prefix_B = [self._prefix(r.live_entry) for r in rows] if self.cascade else None
        pos_B = [len(r.live_entry.tokens) for r in rows]
        t0 = time.perf_counter()
        before = self.stats.generated_tokens
        # k is the most a row drafts; the verify forward is as long as the longest draft
        looked_B, n = None, 0
        if k:
            assert self.drafter is not None, "without a drafter SpecController drafts nothing"
            looked_B = [self._looked_up(r, k) for r in rows] if self.drafter.lookup else None
            n = max(min(k, self.drafter.num_heads), *map(len, looked_B or [[]]))
        if n:
            accepted = self._speculate(rows, n, pos_B, prefix_B, looked_B)
        else:
            fed_B_T = [[r.out_ids[-1]] for r in rows]
            self._sample_and_finish(self.fwd.decode(fed_B_T, pos_B, prefix_B), rows, fed_B_T)
            accepted = 0
        self.stats.decode_steps += 1
        self.stats.threads = torch.get_num_threads()
        self.spec.record(B, k, self.stats.generated_tokens - before, time.perf_counter() - t0,
                         accepted=accepted, verified=n, looked_up=sum(map(len, looked_B or [])))

    def _sample_and_finish(self, out: ForwardOut, reqs: list[_Request],
                           fed_B_T: list[list[int]] | None = None) -> None:
        """Sample each row's next token from a forward's last position and emit it."""
        tokens, lps = sample_B(out.logits_B_T_V[:, -1], [r.params.temperature for r in reqs],
                               [r.params.top_p for r in reqs], [r.generator for r in reqs], self._gen)
        routes = out.routes_B_T_L_K[:, -1:] if out.routes_B_T_L_K is not None else None
        self._emit(reqs, [[t] for t in tokens], [[lp] for lp in lps], out.hidden_B_T_H[:, -1:], fed_B_T,
                   routes)

    def _speculate(self, rows: list[_Request], k: int, pos_B: list[int],
                   prefix_B: list[tuple[int, int] | None] | None,
                   looked_B: list[list[int]] | None) -> int:
        """Draft ``k`` tokens per row (``looked_B``'s first), verify them in one forward, emit
        what is accepted; returns the number of accepted drafts."""
        dev = self.fwd.device
        temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32, device=dev)
        top_ps = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32, device=dev)
        # CPU generators, as in sample_B: a seeded request draws the same uniforms on any device
        u_B = torch.stack([torch.rand(2 * k + 1, generator=r.generator or self._gen) for r in rows]).to(dev)
        last_B = [r.out_ids[-1] for r in rows]
        assert self.drafter is not None, "_step speculates only with a drafter"
        hidden_B: list[torch.Tensor] = []
        for r in rows:
            assert r.hidden is not None, "_emit sets hidden from a request's first sampled token on"
            hidden_B.append(r.hidden)
        draft = self.drafter.draft(torch.stack(hidden_B), last_B, temps, top_ps, u_B[:, :k], looked_B)
        ids_B_T = [[t, *d] for t, d in zip(last_B, draft.tokens_B_K.tolist(), strict=True)]
        out = self.fwd.decode(ids_B_T, pos_B, prefix_B)
        acc = accept(out.logits_B_T_V, draft, temps, top_ps, u_B[:, k:2 * k], u_B[:, 2 * k])
        self._emit(rows, acc.tokens_B_T, acc.logprobs_B_T, out.hidden_B_T_H, ids_B_T, out.routes_B_T_L_K)
        return sum(acc.accepted_B)

    def _looked_up(self, r: _Request, k: int) -> list[int]:
        """Up to ``min(k, lookup)`` tokens that followed the last earlier occurrence of the end
        of the row's context (its prompt, then what it generated)."""
        if r.index is None:
            r.index = NgramIndex(r.prompt_ids)
        seen = len(r.index) - len(r.prompt_ids)
        r.index.extend(r.out_ids[seen:])
        assert self.drafter is not None, "_step looks up only when it drafts, which needs a drafter"
        return r.index.propose(min(k, self.drafter.lookup))

    def _emit(self, reqs: list[_Request], tokens_B_T: list[list[int]], lps_B_T: list[list[float]],
              hidden_B_T_H: torch.Tensor, fed_B_T: list[list[int]] | None,
              routes_B_T_L_K: torch.Tensor | None = None) -> None:
        """Append each row's new tokens one by one, stopping at its first finishing token.

        Token j of row b was sampled from the output at the position of ``fed_B_T[b][j]`` (the
        row's last token, then its accepted drafts), whose KV thereby joins the row's context
        (``None``: a prefill, whose tokens are in the context already); on a MoE model
        ``routes_B_T_L_K[b, j]`` is where that position was routed."""
        for b, r in enumerate(reqs):
            j = 0
            for j, (t, lp) in enumerate(zip(tokens_B_T[b], lps_B_T[b], strict=True)):
                if fed_B_T is not None:
                    r.live_entry.tokens.append(fed_B_T[b][j])
                r.out_ids.append(t)
                r.logprobs.append(lp)
                r.versions.append(self._version)
                if routes_B_T_L_K is not None:
                    r.routes.append(routes_B_T_L_K[b, j])
                self.stats.generated_tokens += 1
                r.finish = self._finish_reason(r)
                if r.finish:
                    break
            r.hidden = hidden_B_T_H[b, j]
        for r in [r for r in reqs if r.finish or r.future.cancelled()]:
            self._retire(r)

    def _finish_reason(self, r: _Request) -> Literal["stop", "length"] | None:
        if r.out_ids[-1] in self.eos_ids:
            return "stop"
        if r.params.stop and self._hit_stop_string(r):
            return "stop"
        if len(r.out_ids) >= r.params.max_new_tokens or len(r.live_entry.tokens) + 1 >= self.max_len:
            return "length"
        return None

    def _hit_stop_string(self, r: _Request) -> bool:
        longest = max(len(s.encode()) for s in r.params.stop)
        tail = self.tokenizer.decode(r.out_ids[-(longest + 1):])
        return any(s in tail for s in r.params.stop)

    def _retire(self, r: _Request) -> None:
        """Take a finished request out of the batch (its KV stays cached) and answer it."""
        i = self._rows.index(r)
        last = len(self._rows) - 1
        e = r.live_entry
        self._move(e, last)  # keep running rows packed in slots 0..B-1
        self._rows[i], self._rows[last] = self._rows[last], self._rows[i]
        self._rows.pop()
        e.active = False
        e.last_used = time.monotonic()
        if e.released or e.key.startswith("r:"):
            self._free(e)
        if r.future.cancelled():
            return
        routes = Routes.of(torch.stack(r.routes).numpy()) if r.routes else None
        gen = Generation(tuple(r.out_ids), tuple(r.logprobs), tuple(r.versions), r.finish or "abort",
                         self.tokenizer.decode(r.out_ids, skip_special_tokens=False), routes)
        self._answers.append((r, gen))

    def _answer(self) -> None:
        """Resolve the requests this step finished, after its busy time is counted: a caller
        that reads ``busy_s`` once its answer came sees every step that produced it."""
        for r, gen in self._answers:
            r.loop.call_soon_threadsafe(_resolve, r.future, gen, None)
        self._answers.clear()

    def _fail_all(self, err: Exception) -> None:
        for r in self._rows + self._waiting:
            r.loop.call_soon_threadsafe(_resolve, r.future, None, err)
            if r.entry is not None:
                self._free(r.entry)
        self._rows, self._waiting = [], []
        for e in list(self._entries.values()):
            self._free(e)


def _resolve(fut: asyncio.Future, value, err: Exception | None) -> None:
    if fut.done():
        return
    if err is not None:
        fut.set_exception(err)
    else:
        fut.set_result(value)
