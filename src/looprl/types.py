"""Core records: the contract every part of looprl reads and writes.

Glossary (the vocabulary is fixed here, once):
- *Sandbox*: where commands run — an isolated copy-on-write workspace over a task's repository.
- *Task*: one problem — a repository snapshot, a terse prompt and its hidden grader.
- *Trajectory*: one run of the agent on a task, token-exact.
- *Segment*: one generation context inside a trajectory; a self-summarization chain has several.
- *Group*: the G trajectories of one task; advantages are computed over a group.
- *RewardBreakdown*: a reward's named components and their total, so every reward is explainable.

Tensors and per-token lists carry their shape as a suffix: ``token_ids_T`` is one entry per token
of a segment, ``rewards_G`` one per trajectory of a group.

Every record round-trips through JSON: ``Record.from_dict(json.loads(json.dumps(r.to_dict())))``.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypedDict, TypeVar

JSONScalar = str | int | float | bool | None
Metadata = dict[str, JSONScalar]

R = TypeVar("R")


class StopReason(str, enum.Enum):
    """Why a trajectory ended. Only ``INFRA_ERROR`` is not the model's doing."""

    FINISHED = "finished"  # the model called `finish`
    ANSWERED = "answered"  # the model replied with text and no tool call (ends the turn, as in chat)
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"  # the trajectory's total generated-token budget ran out
    CONTEXT_FULL = "context_full"  # the context window filled and summarization was off or failed
    WALL_TIME = "wall_time"
    INFRA_ERROR = "infra_error"  # sandbox / engine / grader failure: dropped, never scored


class Message(TypedDict, total=False):
    """One chat message in OpenAI shape. ``tool_calls`` only on assistant messages."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[dict[str, Any]]
    tool_call_id: str
    name: str


def _to_json(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


class _Record:
    """JSON helpers shared by the records (no behaviour beyond (de)serialisation)."""

    def to_dict(self) -> dict[str, Any]:
        return _to_json(self)

    def to_json(self) -> str:
        """One line of JSON, always valid UTF-8: a record holding text that is not (a lone
        surrogate, e.g. from a file name that is not UTF-8) is written with ASCII escapes, which
        read back to the same record."""
        d = self.to_dict()
        text = json.dumps(d, ensure_ascii=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(d)
        return text

    @classmethod
    def from_json(cls: type[R], text: str) -> R:
        return cls.from_dict(json.loads(text))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Verifier(_Record):
    """A verifier script that grades the final workspace by writing a reward file (Harbor's
    ``tests/test.sh``, writing ``/logs/verifier/reward.json`` or ``reward.txt``): the grader kind
    of ``looprl.rewards.verifier``. Paths are the host's (relative ones: to the task file)."""

    tests_dir: str
    """The pristine verifier files (``test.sh`` and its fixtures), mounted read-only at /tests."""
    workdir: str = ""
    """Where the workspace sits in the grading sandbox (the environment's WORKDIR, e.g. /app);
    empty: at the task repo's own path."""
    venv: str | None = None
    """The verifier's own environment (Harbor's ``tests/Dockerfile``); None: the task's venv."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of the verifier's run (``[verifier].env``, the Dockerfile's ENV)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verifier:
        return cls(tests_dir=str(d["tests_dir"]), workdir=str(d.get("workdir", "")),
                   venv=d.get("venv"), env={str(k): str(v) for k, v in (d.get("env") or {}).items()})


@dataclass(frozen=True)
class EvalScript(_Record):
    """A script whose log grades the final workspace (SWE-bench v5's ``eval_script``): it runs
    in a fresh sandbox over the graded diff, its log is read by ``log_parser`` into per-test
    statuses and judged by ``contract`` (``looprl.rewards.graded``)."""

    script: str
    """The bash script (it applies hidden tests and runs them between SWE-bench's markers)."""
    log_parser: str = "pytest"
    """A name of ``looprl.rewards.logparse.PARSERS``."""
    contract: str = "swebench"
    """A name of ``looprl.rewards.graded.CONTRACTS``."""
    workdir: str = ""
    """Where the workspace sits for the script (``/testbed``); empty: the repo's own path."""
    expected: dict[str, str] = field(default_factory=dict)
    """The ``r2egym`` contract's expected statuses (``expected_output_json``)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalScript:
        return cls(script=str(d["script"]), log_parser=str(d.get("log_parser", "pytest")),
                   contract=str(d.get("contract", "swebench")), workdir=str(d.get("workdir", "")),
                   expected={str(k): str(v) for k, v in (d.get("expected") or {}).items()})


@dataclass(frozen=True)
class Image(_Record):
    """A container image a task runs in whole, agent and grading alike, on the container
    backend (``looprl.sandbox.container``): an image in the engine's local store (never pulled),
    the workspace bind-mounted at ``workdir`` over the task's repo (the image's WORKDIR, copied
    out at import)."""

    name: str
    """The image reference, e.g. ``localhost/acme:1`` or ``python:3.12-slim``."""
    workdir: str
    """Where the workspace sits in the container (absolute)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Image:
        return cls(name=str(d["name"]), workdir=str(d["workdir"]))


@dataclass(frozen=True)
class Grader(_Record):
    """How a task is graded: its own test suite, run in a fresh sandbox over the agent's diff."""

    test_command: str
    """Shell command run in the workspace root; test ids are appended (pytest node ids)."""
    fail_to_pass: tuple[str, ...] = ()
    """Tests that fail on the untouched task and must pass after a correct fix."""
    pass_to_pass: tuple[str, ...] = ()
    """Tests that pass on the untouched task and must still pass."""
    test_files: tuple[str, ...] = ()
    """Test files and test config restored from the pristine base before grading."""
    timeout_s: float = 120.0
    """Wall-clock limit for one grading run."""
    test_patch: str = ""
    """Hidden tests applied (unified diff) after the test files are restored, e.g. the tests a
    newer release added; the agent never sees them."""
    verifier: Verifier | None = None
    """Set: the task is graded by this verifier's reward file instead of the node ids above
    (``test_command`` is then the verifier's own command line, for people reading the task)."""
    eval: EvalScript | None = None
    """Set: the task is graded by this script's log, read per test and judged by its family's
    rule (the tests above are the ones the rule grades)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Grader:
        return cls(
            test_command=d["test_command"],
            fail_to_pass=tuple(d.get("fail_to_pass", ())),
            pass_to_pass=tuple(d.get("pass_to_pass", ())),
            test_files=tuple(d.get("test_files", ())),
            timeout_s=float(d.get("timeout_s", 120.0)),
            test_patch=str(d.get("test_patch", "")),
            verifier=Verifier.from_dict(d["verifier"]) if d.get("verifier") else None,
            eval=EvalScript.from_dict(d["eval"]) if d.get("eval") else None,
        )


@dataclass(frozen=True)
class Task(_Record):
    """One problem: an immutable repository snapshot, a terse prompt, and a hidden grader."""

    id: str
    repo: str
    """Path (or store URL) of the immutable base snapshot of the repository."""
    prompt: str
    grader: Grader
    venv: str | None = None
    """The task's Python environment (a venv directory), made visible inside sandboxes."""
    gold_patch: str | None = None
    """A unified diff that solves the task (proves it solvable; source of SFT data)."""
    metadata: Metadata = field(default_factory=dict)
    """package, version, source kind, mutation kind, lines changed, split, prompt style, ..."""
    image: Image | None = None
    """Set: the task's environment is this container image (no ``venv``): its sandboxes, the
    agent's and the grader's, are containers of it; None: bubblewrap over the host."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Task:
        return cls(
            id=str(d["id"]),
            repo=str(d["repo"]),
            prompt=str(d["prompt"]),
            grader=Grader.from_dict(d["grader"]),
            venv=d.get("venv"),
            gold_patch=d.get("gold_patch"),
            metadata=dict(d.get("metadata") or {}),
            image=Image.from_dict(d["image"]) if d.get("image") else None,
        )


@dataclass(frozen=True)
class ToolCall(_Record):
    """A call as the model wrote it, OpenAI function-calling shape. ``arguments`` is raw JSON text."""

    id: str
    name: str
    arguments: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(id=str(d["id"]), name=str(d["name"]), arguments=str(d["arguments"]))

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


ToolStatus = Literal["ok", "error", "broken", "infra_error"]
"""ok: ran; error: ran and failed (e.g. 0 matches) — the model sees it; broken: the call itself was
malformed (bad JSON, unknown tool, bad arguments) — counted against the model; infra_error: the
sandbox failed — not the model's fault."""


@dataclass(frozen=True)
class ToolResult(_Record):
    """What a tool call returned; ``content`` is exactly what the model sees."""

    call_id: str
    name: str
    content: str
    status: ToolStatus = "ok"
    wall_s: float = 0.0
    infra_kind: str = ""
    """For ``infra_error``: the failure's class (``looprl.errors.InfraKind`` value)."""

    @property
    def broken(self) -> bool:
        return self.status == "broken"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolResult:
        return cls(call_id=str(d["call_id"]), name=str(d["name"]), content=str(d["content"]),
                   status=d.get("status", "ok"), wall_s=float(d.get("wall_s", 0.0)),
                   infra_kind=str(d.get("infra_kind", "")))


@dataclass(frozen=True)
class Routes(_Record):
    """The experts a MoE model routed tokens to: per token, per MoE layer, the top-k expert ids,
    uint8 (255 = no record: prompt and tool tokens), as ``[T, L, K]`` bytes (base64 in JSON, so a
    6,000-token trajectory of a 4-layer top-2 model adds ~64 KB). For a sampled token they are the
    routes of the forward position it was sampled from (``looprl.models.moe``: router replay).

    >>> r = Routes.of([[[1, 2]], [[255, 255]]]); (r.tokens, r.layers, r.top_k, r.rows()[0])
    (2, 1, 2, [[1, 2]])
    """

    layers: int
    top_k: int
    data: str
    """base64 of the ``T * layers * top_k`` uint8 expert ids, token-major."""

    @classmethod
    def of(cls, routes_T_L_K: Any) -> Routes:
        """From anything shaped ``[T, L, K]`` of ints in 0..255 (a numpy array, nested lists)."""
        import numpy as np

        a = np.asarray(routes_T_L_K)
        if a.ndim != 3 or (a.size and (a.min() < 0 or a.max() > 255)):
            raise ValueError(f"routes must be [tokens, layers, top_k] ids in 0..255, not shape {a.shape}")
        return cls(int(a.shape[1]), int(a.shape[2]), base64.b64encode(a.astype(np.uint8).tobytes()).decode())

    @property
    def raw(self) -> bytes:
        return base64.b64decode(self.data)

    @property
    def tokens(self) -> int:
        return len(self.raw) // max(self.layers * self.top_k, 1)

    def array(self) -> Any:
        """The ``[T, L, K]`` uint8 numpy array."""
        import numpy as np

        return np.frombuffer(self.raw, dtype=np.uint8).reshape(-1, self.layers, self.top_k)

    def rows(self) -> list[list[list[int]]]:
        return self.array().tolist()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Routes:
        return cls(int(d["layers"]), int(d["top_k"]), str(d["data"]))


@dataclass(frozen=True)
class Segment(_Record):
    """One generation context, token-exact: what the policy saw and what it emitted.

    ``loss_mask_T`` is 1 on tokens the model sampled, 0 on prompt and tool-output tokens.
    ``logprobs_T`` holds the sampling engine's logprob for model tokens and 0.0 elsewhere.
    ``policy_version_T`` is the weight version that sampled each model token (-1 elsewhere), so a
    trajectory that crosses a weight update mid-rollout is corrected token by token.
    ``routes`` (MoE models) holds the engine's expert choice for every model token, none elsewhere.
    """

    token_ids_T: tuple[int, ...]
    logprobs_T: tuple[float, ...]
    loss_mask_T: tuple[int, ...]
    policy_version_T: tuple[int, ...]
    routes: Routes | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids_T)
        assert len(self.logprobs_T) == n and len(self.loss_mask_T) == n and len(
            self.policy_version_T) == n, "Segment fields must all have one entry per token"
        assert self.routes is None or self.routes.tokens == n, "Segment.routes has one entry per token"

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask_T)

    def model_turns(self) -> list[tuple[int, int]]:
        """[start, end) of every maximal run of model tokens: the model's turns, in order.

        >>> Segment((1, 2, 3, 4, 5, 6), (0.0,) * 6, (0, 1, 1, 0, 1, 0), (-1, 0, 0, -1, 0, -1)).model_turns()
        [(1, 3), (4, 5)]
        """
        out, start = [], None
        for i, m in enumerate(self.loss_mask_T):
            if m and start is None:
                start = i
            elif not m and start is not None:
                out.append((start, i))
                start = None
        if start is not None:
            out.append((start, len(self.loss_mask_T)))
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        return cls(tuple(d["token_ids_T"]), tuple(float(x) for x in d["logprobs_T"]),
                   tuple(d["loss_mask_T"]), tuple(d["policy_version_T"]),
                   Routes.from_dict(d["routes"]) if d.get("routes") else None)


@dataclass(frozen=True)
class Counters(_Record):
    """Effort counters of a trajectory (inputs of the length/effort penalty)."""

    turns: int = 0
    tool_calls: int = 0
    broken_tool_calls: int = 0
    thinking_tokens: int = 0  # model tokens inside <think>...</think>
    output_tokens: int = 0  # all model-sampled tokens (thinking included)
    tool_call_tokens: int = 0  # model tokens inside <tool_call> blocks
    tool_output_tokens: int = 0  # tokens of tool results fed back to the model
    summaries: int = 0
    summary_tokens: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Counters:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in d.items() if k in names})


@dataclass(frozen=True)
class RewardBreakdown(_Record):
    """A reward's named components and their total, plus the monitors' flags.

    >>> r = RewardBreakdown.of({"tests": 1.0, "length": -0.25})
    >>> r.total
    0.75
    """

    components: dict[str, float]
    total: float
    flags: tuple[str, ...] = ()
    """Reward-hacking and behaviour monitors that fired (e.g. "edited_tests")."""
    details: Metadata = field(default_factory=dict)
    """Per-test outcomes, grading wall time, ... for people reading the record."""

    @classmethod
    def of(cls, components: dict[str, float], flags: tuple[str, ...] = (),
           details: Metadata | None = None) -> RewardBreakdown:
        return cls(dict(components), float(sum(components.values())), tuple(flags),
                   dict(details or {}))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RewardBreakdown:
        return cls({k: float(v) for k, v in d["components"].items()}, float(d["total"]),
                   tuple(d.get("flags", ())), dict(d.get("details") or {}))


class TokenSpan(NamedTuple):
    """Tokens ``start:end`` of segment ``segment`` of a trajectory (saved as ``[segment, start,
    end]``)."""

    segment: int
    start: int
    end: int


@dataclass(frozen=True)
class SelfSummary(_Record):
    """One self-summarization of a run (``harness.summarize``): the segment it closed and the
    fresh context it opened."""

    segment: int
    """Index of the segment summarized."""
    tokens_before: int
    """That segment's size when the summary was triggered."""
    tokens_after: int
    """The fresh context's size: where the next segment starts."""
    summary_tokens: int
    """Tokens sampled for the summary."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SelfSummary:
        return cls(int(d["segment"]), int(d["tokens_before"]), int(d["tokens_after"]),
                   int(d["summary_tokens"]))


@dataclass(frozen=True)
class HintSpan(_Record):
    """Where a hint was inserted in a hinted continuation (``harness.hinted``, issue 54): tokens
    ``start:end`` of its one segment are the observation of turn ``turn`` with the hint appended
    (context, loss mask 0); the unhinted context has ``student_ids_T`` there instead. Every model
    token after ``end`` is the teacher's continuation."""

    turn: int
    text: str
    start: int
    end: int
    student_ids_T: tuple[int, ...]
    kind: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HintSpan:
        return cls(int(d["turn"]), str(d["text"]), int(d["start"]), int(d["end"]),
                   tuple(int(x) for x in d["student_ids_T"]), str(d.get("kind", "")))


def _legacy_list(metadata: dict[str, Any], key: str) -> list[Any]:
    """A list that files written before it was a field hold in ``metadata[key]`` as JSON text;
    taken out of ``metadata`` (it is written back as the field)."""
    raw = metadata.pop(key, None)
    return json.loads(raw) if isinstance(raw, str) and raw else []


@dataclass(frozen=True)
class Trajectory(_Record):
    """One run of the agent on a task. The message list is the readable trajectory; the
    segments are the token-exact one the trainer consumes."""

    task_id: str
    group_id: str
    segments: tuple[Segment, ...]
    messages: tuple[Message, ...]
    counters: Counters
    stop_reason: StopReason
    diff: str = ""
    """The final workspace diff against the task's base (unified)."""
    reward: RewardBreakdown | None = None
    error: str | None = None
    """For infra errors: what failed (the trajectory is dropped, never scored)."""
    wall_s: float = 0.0
    id: str = ""
    metadata: Metadata = field(default_factory=dict)
    summaries: tuple[SelfSummary, ...] = ()
    """Every self-summary of the run, in order: one per segment after the first."""
    broken_spans: tuple[TokenSpan, ...] = ()
    """The tokens of each broken tool call's own block (recorded by the agent loop): what the
    trainer's token-level credit (``trainer.batch``) gives ``broken_call_advantage``."""
    infra_kind: str = ""
    """For infra errors: the failure's class in the taxonomy (an ``looprl.errors.InfraKind``
    value, ``infra_kind(e)`` of what failed); empty otherwise."""
    hint: HintSpan | None = None
    """A hinted continuation's hint (``harness.hinted``); None for every ordinary rollout."""

    @property
    def is_infra_error(self) -> bool:
        return self.stop_reason == StopReason.INFRA_ERROR

    @property
    def passed(self) -> bool:
        """The hidden tests all passed (the ``tests`` reward term is 1) and the trajectory made no
        attempt on the grader (which cancels that term: ``grader_attack``)."""
        return (self.reward is not None and self.reward.components.get("tests", 0.0) >= 1.0
                and "grader_attack" not in self.reward.components)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """Also reads files from before ``summaries`` and ``broken_spans`` were fields (JSON text in
        ``metadata``), once: the record holds them as fields, and writes them so.

        >>> old = {"task_id": "t", "group_id": "g", "segments": [], "messages": [],
        ...        "stop_reason": "finished", "metadata": {"broken_spans": "[[0, 5, 9]]", "x": 1}}
        >>> t = Trajectory.from_dict(old)
        >>> t.broken_spans, t.metadata, t.to_dict()["broken_spans"]
        ((TokenSpan(segment=0, start=5, end=9),), {'x': 1}, [[0, 5, 9]])
        """
        metadata = dict(d.get("metadata") or {})
        legacy = {k: _legacy_list(metadata, k) for k in ("summaries", "broken_spans")}
        return cls(
            task_id=str(d["task_id"]),
            group_id=str(d["group_id"]),
            segments=tuple(Segment.from_dict(s) for s in d["segments"]),
            messages=tuple(d["messages"]),
            counters=Counters.from_dict(d.get("counters", {})),
            stop_reason=StopReason(d["stop_reason"]),
            diff=d.get("diff", ""),
            reward=RewardBreakdown.from_dict(d["reward"]) if d.get("reward") else None,
            error=d.get("error"),
            wall_s=float(d.get("wall_s", 0.0)),
            id=str(d.get("id", "")),
            metadata=metadata,
            summaries=tuple(SelfSummary.from_dict(s)
                            for s in d.get("summaries", legacy["summaries"])),
            broken_spans=tuple(TokenSpan(*map(int, s))
                               for s in d.get("broken_spans", legacy["broken_spans"])),
            infra_kind=str(d.get("infra_kind", "")),
            hint=HintSpan.from_dict(d["hint"]) if d.get("hint") else None,
        )


@dataclass(frozen=True)
class Group(_Record):
    """The G trajectories of one task (infra-failed ones already dropped)."""

    task_id: str
    group_id: str
    trajectories: tuple[Trajectory, ...]
    metadata: Metadata = field(default_factory=dict)
    hinted: tuple[Trajectory, ...] = ()
    """Hinted continuations of some failed trajectories (``harness.hinted``): distilled by the
    step, never in the group's advantages."""

    @property
    def rewards_G(self) -> list[float]:
        out = []
        for t in self.trajectories:
            assert t.reward is not None, f"trajectory {t.id} of group {self.group_id} has no reward"
            out.append(t.reward.total)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Group:
        return cls(str(d["task_id"]), str(d["group_id"]),
                   tuple(Trajectory.from_dict(t) for t in d["trajectories"]),
                   dict(d.get("metadata") or {}),
                   tuple(Trajectory.from_dict(t) for t in d.get("hinted", ())))


@dataclass(frozen=True)
class GroupResult:
    """One task's group after rollout and scoring: what a ``GroupSource`` hands the trainer."""

    task: Task
    group: Group | None
    """None when the group was dropped (see ``dropped``)."""
    infra_errors: int = 0
    """Trajectory attempts lost to infrastructure failures (retried or dropped)."""
    dropped: str | None = None
    wall_s: float = 0.0
    screened_out: tuple[Trajectory, ...] = ()
    """The screen's scored trajectories when none passed and the group stopped there
    (``RolloutConfig.screen``; ``group`` is then None)."""
    lost: tuple[Trajectory, ...] = ()
    """The trajectories that still failed as infrastructure after their retries (never scored;
    each carries its ``infra_kind``): a benchmark's samples lost to the infrastructure."""


@dataclass(frozen=True)
class ExecResult(_Record):
    """The outcome of one command in a sandbox. Output is already capped (head + tail)."""

    exit_code: int | None
    """None when the command was killed (timeout or resource limit)."""
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecResult:
        return cls(d["exit_code"], d["stdout"], d["stderr"], bool(d.get("timed_out")),
                   bool(d.get("truncated")), float(d.get("wall_s", 0.0)))


@dataclass(frozen=True)
class FileEntry(_Record):
    """One entry of a workspace listing; ``path`` is workspace-relative with '/' separators."""

    path: str
    kind: Literal["file", "dir", "link"]
    size: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FileEntry:
        return cls(d["path"], d["kind"], int(d.get("size", 0)))


@dataclass(frozen=True)
class Generation(_Record):
    """What an engine returns for one request: sampled tokens with their logprobs."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """Logprob of each sampled token under exactly the distribution it was sampled from."""
    policy_versions: tuple[int, ...]
    finish_reason: Literal["stop", "length", "abort"]
    """stop: an end-of-turn token or stop string; length: the token budget ran out."""
    text: str = ""
    routes: Routes | None = None
    """MoE models, engines that record them: the experts each sampled token's forward used."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Generation:
        return cls(tuple(d["token_ids"]), tuple(d["logprobs"]), tuple(d["policy_versions"]),
                   d["finish_reason"], d.get("text", ""),
                   Routes.from_dict(d["routes"]) if d.get("routes") else None)


@dataclass(frozen=True)
class SamplingParams(_Record):
    """How to sample one generation."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    """Stop strings (checked on decoded text); the engine's end-of-turn tokens always stop."""
    seed: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        return cls(int(d.get("max_new_tokens", 256)), float(d.get("temperature", 1.0)),
                   float(d.get("top_p", 1.0)), tuple(d.get("stop", ())), d.get("seed"))
