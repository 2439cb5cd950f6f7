"""Run a policy on a task set through the harness, k samples a task, and grade every sample.

    report = run_bench(load_tasks("tasks.jsonl"), "oracle", k=1)     # -> BenchReport
    sample = await run_sample(task, "oracle", index=0)                # one graded sample

Policies are picked by a spec string (``POLICIES``): ``oracle`` (replays the gold patch through
the tools: proves tasks solvable), ``null`` (finishes at once: the floor), ``model:PATH`` (the
in-process torch engine on a local checkpoint), ``openai:URL`` (any OpenAI-compatible server).
Each sample runs ``run_agent`` in its own sandbox over the task repo, then ``rewards.tests.grade``
grades the final diff in a fresh one. Infra failures (sandbox, engine, grader) are recorded with
``score=None`` and left out of every metric, never counted as the model's failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from looprl.errors import ConfigError, LooprlError, RewardError, SandboxError
from looprl.protocols import Engine
from looprl.rewards.tests import grade
from looprl.types import StopReason, Task

Progress = Callable[[int], None]


@dataclass(frozen=True)
class BenchSettings:
    """How samples run."""

    max_turns: int = 30
    max_new_tokens: int = 1024
    max_total_new_tokens: int = 16_384
    context_window: int = 32_768
    temperature: float = 1.0
    wall_time_s: float = 600.0
    concurrency: int = 2
    """Samples in flight (sandboxes + grading share the 2 cores)."""


@dataclass(frozen=True)
class Sample:
    """One graded run of the policy on a task."""

    task_id: str
    index: int
    score: float | None
    """1.0 / 0.0 from the hidden tests; None when infrastructure failed (excluded)."""
    stop_reason: str
    turns: int = 0
    tool_calls: int = 0
    broken_tool_calls: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    grade_wall_s: float = 0.0
    edited_tests: bool = False
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ policies


class PolicyFactory:
    """Makes the engine for one sample and the tokenizer its chat format uses."""

    def __init__(self, spec: str):
        self.spec = spec
        self.kind, _, self.arg = spec.partition(":")
        if self.kind not in POLICIES:
            raise ConfigError(f"unknown policy {spec!r}: use one of oracle, null, model:PATH, "
                              "openai:URL,tokenizer=PATH")
        if self.kind in ("model", "openai") and not self.arg:
            raise ConfigError(f"policy {self.kind} needs an argument: {self.kind}:PATH_OR_URL")
        self._shared: Engine | None = None
        self._tok: Any = None

    def tokenizer(self) -> Any:
        if self._tok is None:
            if self.kind in ("oracle", "null"):
                from looprl.models.tokenizer import build_tokenizer

                self._tok = build_tokenizer(None)
            else:
                self._tok = getattr(self.engine_for(None), "tokenizer", None)
                if self._tok is None:
                    raise ConfigError(f"engine for {self.spec} exposes no tokenizer")
        return self._tok

    def engine_for(self, task: Task | None) -> Engine:
        if self.kind in ("model", "openai"):
            if self._shared is None:
                self._shared = POLICIES[self.kind](self.arg, task, None)
            return self._shared
        return POLICIES[self.kind](self.arg, task, self.tokenizer())


def _oracle(arg: str, task: Task | None, tok: Any) -> Engine:
    from looprl.harness.policies import OracleAgent

    assert task is not None
    return OracleAgent(task, tok)


def _null(arg: str, task: Task | None, tok: Any) -> Engine:
    from looprl.harness.policies import ScriptedPolicy

    return ScriptedPolicy(tok, ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>'])


def _model(arg: str, task: Task | None, tok: Any) -> Engine:
    from looprl.inference import make_engine

    return make_engine("torch", path=arg)


def _openai(arg: str, task: Task | None, tok: Any) -> Engine:
    """``openai:URL,tokenizer=PATH[,model=NAME]``: the server samples, the local tokenizer
    (the served model's) renders the harness's chat format."""
    from transformers import AutoTokenizer

    from looprl.inference import make_engine

    url, *opts = arg.split(",")
    kv = dict(o.split("=", 1) for o in opts if "=" in o)
    if "tokenizer" not in kv:
        raise ConfigError("openai policy needs the served model's tokenizer: "
                          "openai:URL,tokenizer=PATH[,model=NAME]")
    return make_engine("openai", base_url=url, model=kv.get("model", "looprl"),
                       tokenizer=AutoTokenizer.from_pretrained(kv["tokenizer"]))


POLICIES: dict[str, Callable[[str, Task | None, Any], Engine]] = {
    "oracle": _oracle, "null": _null, "model": _model, "openai": _openai}


# ------------------------------------------------------------------ running


async def run_sample(task: Task, policy: str | PolicyFactory, *, index: int = 0,
                     settings: BenchSettings | None = None) -> Sample:
    """One sample: run the agent on ``task`` in a fresh sandbox, then grade its diff."""
    from looprl.harness.agent import AgentConfig, run_agent
    from looprl.harness.format import ChatFormat
    from looprl.harness.tools import make_tools
    from looprl.sandbox import create_sandbox

    st = settings or BenchSettings()
    factory = policy if isinstance(policy, PolicyFactory) else PolicyFactory(policy)
    # scripted policies have no context limit (their bytes tokenizer makes files long)
    scripted = factory.kind not in ("model", "openai")
    window = 1 << 24 if scripted else st.context_window
    cfg = AgentConfig(max_turns=st.max_turns,
                      max_new_tokens=1 << 20 if scripted else st.max_new_tokens,
                      max_total_new_tokens=1 << 22 if scripted else st.max_total_new_tokens,
                      wall_time_s=st.wall_time_s, context_window=window,
                      temperature=st.temperature)
    t0 = time.monotonic()
    try:
        engine = factory.engine_for(task)
        fmt = ChatFormat(factory.tokenizer())
        tools = make_tools(test_command=task.grader.test_command)
        sb = await create_sandbox(task.repo, venv=task.venv)
    except (SandboxError, LooprlError) as e:
        return Sample(task.id, index, None, StopReason.INFRA_ERROR.value, error=str(e)[:500],
                      wall_s=time.monotonic() - t0)
    try:
        traj = await run_agent(task, sb, engine, fmt, tools, cfg, group_id=task.id,
                               trajectory_id=f"{task.id}/{index}")
    finally:
        await sb.close()
    c = traj.counters
    common = dict(turns=c.turns, tool_calls=c.tool_calls, broken_tool_calls=c.broken_tool_calls,
                  output_tokens=c.output_tokens)
    if traj.is_infra_error:
        return Sample(task.id, index, None, traj.stop_reason.value, error=traj.error,
                      wall_s=time.monotonic() - t0, **common)
    try:
        g = await grade(task, traj.diff)
    except RewardError as e:
        return Sample(task.id, index, None, StopReason.INFRA_ERROR.value, error=str(e)[:500],
                      wall_s=time.monotonic() - t0, **common)
    return Sample(task.id, index, g.score, traj.stop_reason.value, wall_s=time.monotonic() - t0,
                  grade_wall_s=g.wall_s, edited_tests=g.edited_tests,
                  metadata={"source_kind": task.metadata.get("source_kind"),
                            "package": task.metadata.get("package")}, **common)


async def arun_bench(tasks: list[Task], policy: str, k: int = 1,
                     settings: BenchSettings | None = None,
                     progress: Progress | None = None) -> list[Sample]:
    st = settings or BenchSettings()
    factory = PolicyFactory(policy)
    sem = asyncio.Semaphore(st.concurrency)

    async def one(task: Task, i: int) -> Sample:
        async with sem:
            s = await run_sample(task, factory, index=i, settings=st)
        if progress:
            progress(1)
        return s

    try:
        return list(await asyncio.gather(*(one(t, i) for t in tasks for i in range(k))))
    finally:
        close = getattr(factory._shared, "close", None)
        if callable(close):  # the torch engine's decode thread
            close()


def run_bench(tasks: list[Task], policy: str, k: int = 1, settings: BenchSettings | None = None,
              progress: Progress | None = None) -> list[Sample]:
    """All samples (k per task) of ``policy`` on ``tasks``; summarize with ``report.summarize``."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    return asyncio.run(arun_bench(tasks, policy, k, settings, progress))
