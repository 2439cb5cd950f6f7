"""Run a policy on a task set through the harness, k samples a task, and grade every sample.

    samples = run_bench(load_tasks("tasks.jsonl"), "oracle", k=1)    # -> list[Sample]

Policies are picked by a spec string (``POLICIES``): ``oracle`` (replays the gold patch through
the tools: proves tasks solvable), ``null`` (finishes at once: the floor), ``model:PATH`` (the
in-process torch engine on a local checkpoint), ``openai:URL`` (any OpenAI-compatible server).
Samples run through the ``RolloutRunner`` that training uses (a task's k samples are one group),
each in its own sandbox over the task repo; ``rewards.tests.grade`` grades the final diff in a fresh
one. Infra failures (sandbox, engine, grader) are retried in a fresh sandbox, then recorded with
``score=None`` and their class (``Sample.infra_kind``) and left out of every metric, never counted
as the model's failure; the report counts them beside pass@k, and the gate refuses to judge a
report with too many (``bench.gate``). ``LOOPRL_FAULTS`` injects failures (``looprl.faults``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprl.errors import ConfigError, InfraKind
from looprl.protocols import Engine
from looprl.types import StopReason, Task, Trajectory

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
    """Samples in flight (sandboxes + grading share the 2 cores). A model policy decodes the
    samples in flight as one batch: give it more (e.g. 16)."""
    tools: tuple[str, ...] | None = None
    """Tool names offered to the policy (None = the harness default); a model must be
    evaluated with the tools it was trained with (they are in its prompt)."""
    notes: Path | None = None
    """Notes a training run kept (``harness.notes``, its ``notes.json``) shown read-only at each
    task's start; those written on the evaluated tasks' functions are dropped. None = no notes."""


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
    infra_kind: str = ""
    """For an infra-failed sample: the failure's class (``looprl.errors.InfraKind`` value)."""


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
    from looprl.harness.oracle import OracleAgent

    assert task is not None
    return OracleAgent(task, tok)


def _null(arg: str, task: Task | None, tok: Any) -> Engine:
    from looprl.harness.scripted import ScriptedPolicy

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


def agent_config(factory: PolicyFactory, st: BenchSettings) -> Any:
    from looprl.harness.run_state import AgentConfig, AgentExperimental

    # scripted policies have no context limit (their bytes tokenizer makes files long)
    scripted = factory.kind not in ("model", "openai")
    return AgentConfig(max_turns=st.max_turns,
                       max_new_tokens=1 << 20 if scripted else st.max_new_tokens,
                       max_total_new_tokens=1 << 22 if scripted else st.max_total_new_tokens,
                       context_window=1 << 24 if scripted else st.context_window,
                       experimental=AgentExperimental(wall_time_s=st.wall_time_s,
                                                      temperature=st.temperature))


def to_sample(task: Task, index: int, traj: Trajectory) -> Sample:
    """A graded (or infra-failed) trajectory as a bench sample."""
    c = traj.counters
    common: dict[str, Any] = dict(turns=c.turns, tool_calls=c.tool_calls, broken_tool_calls=c.broken_tool_calls,
                  output_tokens=c.output_tokens,
                  wall_s=traj.wall_s)
    if traj.is_infra_error or traj.reward is None:
        return Sample(task.id, index, None, StopReason.INFRA_ERROR.value,
                      error=(traj.error or "not graded")[:500],
                      infra_kind=traj.infra_kind or InfraKind.INTERNAL.value, **common)
    d = traj.reward.details
    return Sample(task.id, index, traj.reward.components["tests"], traj.stop_reason.value,
                  grade_wall_s=float(d.get("grade_wall_s") or 0.0),
                  edited_tests=bool(d.get("edited_tests", False)),
                  metadata={"source_kind": task.metadata.get("source_kind"),
                            "package": task.metadata.get("package")}, **common)


async def arun_bench(tasks: list[Task], policy: str, k: int = 1,
                     settings: BenchSettings | None = None,
                     progress: Progress | None = None,
                     trajectories: Path | None = None) -> list[Sample]:
    """k samples a task through the same ``RolloutRunner`` training uses (a group of k per task,
    infra failures retried in fresh sandboxes, then recorded with ``score=None``), graded by the
    hidden tests alone. ``trajectories``: a JSONL file that receives every graded trajectory
    (messages, tokens, reward breakdown) as its group finishes."""
    from looprl.chat import ChatFormat
    from looprl.rollout.config import RolloutConfig, RolloutExperimental
    from looprl.rollout.runner import RolloutRunner
    from looprl.rollout.score import make_tests_scorer
    from looprl.sandbox import SandboxPool

    st = settings or BenchSettings()
    factory = PolicyFactory(policy)
    pool = SandboxPool(max_running=st.concurrency)
    cfg = RolloutConfig(group_size=k, max_in_flight=st.concurrency,
                        agent=agent_config(factory, st),
                        experimental=RolloutExperimental(min_group_size=1))
    if st.tools is not None:
        cfg = dataclasses.replace(cfg, tools=tuple(st.tools))
    by_task: dict[str, list[Sample]] = {}
    try:
        runner = RolloutRunner(factory.engine_for, ChatFormat(factory.tokenizer()), pool,
                               make_tests_scorer(), cfg, notebook=_notes(st, tasks))
        async for r in runner.run(tasks):
            kept = r.group.trajectories if r.group is not None else ()
            # the samples infrastructure took (after retries) count with their class
            out = [to_sample(r.task, i, t) for i, t in enumerate((*kept, *r.lost))]
            if kept and trajectories is not None:
                with trajectories.open("a", encoding="utf-8") as f:
                    f.writelines(t.to_json() + "\n" for t in kept)
            out += [Sample(r.task.id, i, None, StopReason.INFRA_ERROR.value,
                           error=(r.dropped or "infrastructure failed after retries")[:500],
                           wall_s=r.wall_s, infra_kind=InfraKind.INTERNAL.value)
                    for i in range(len(out), k)]
            by_task[r.task.id] = out
            if progress:
                progress(k)
    finally:
        await pool.close()
        close = getattr(factory._shared, "close", None)
        if callable(close):  # the torch engine's decode thread
            close()
    return [s for t in tasks for s in by_task.get(t.id, [])]


def _notes(st: BenchSettings, tasks: list[Task]) -> Any:
    """The read-only notebook evaluation reads (``BenchSettings.notes``), or None."""
    if st.notes is None:
        return None
    from looprl.harness.notes import Notebook

    return Notebook.load(st.notes).for_evaluation(tasks)


def run_bench(tasks: list[Task], policy: str, k: int = 1, settings: BenchSettings | None = None,
              progress: Progress | None = None, trajectories: Path | None = None) -> list[Sample]:
    """All samples (k per task) of ``policy`` on ``tasks``; summarize with ``report.summarize``."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    if len({t.id for t in tasks}) != len(tasks):
        raise ConfigError("the task list repeats task ids; each task is sampled k times already")
    return asyncio.run(arun_bench(tasks, policy, k, settings, progress, trajectories))
