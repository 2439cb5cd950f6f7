"""What the dashboard shows, read from disk and the network into plain records — never raising.

    run = load_run(Path("runs/quickstart"))      # metrics rows, config, evals, report, problems
    ys = metric_values(run.rows, "train/loss")   # one value per step; None = not measured
    index = TrajectoryIndex(RunDir(run.path).train_trajectories)   # incremental listing
    traj = index.read(3)                         # the 4th trajectory of the file, as a record
    fleet = fetch_fleet("http://10.0.0.5:8377", token="s3cret")   # env server pool metrics
    fb = load_feedback(Path("feedback.db"))      # A/B report + cycles of a FeedbackStore
    loop = load_run(Path("runs/rt32b"))          # a real-time loop run: loop.cycles, .result, ...

Every loader turns a missing or malformed input into a human message on the record (``problems``
or ``error``) so the page can say what is wrong and how to fix it; a page never fails because a
run is still starting, a line is half-written or a server is down.

Skipped steps: a GRPO step whose batch had nothing to learn from (every group without reward
variance, ``train/zero_variance_groups``) trains on no token (``train/tokens == 0``); its loss,
IS ratio, KL, grad norm, ... are not measurements (``trainer.loggers.TRAINED_ONLY``), so
``metric_values`` gives None there (a gap in a chart), never the 0 the trainer writes.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from looprl.feedback.ab import ABReport
from looprl.feedback.store import CycleRecord
from looprl.rundir import RunDir
from looprl.runstate import RunState
from looprl.runstate import read as read_state
from looprl.trainer.loggers import TRAINED_ONLY, groups_without_pass, step_skipped
from looprl.types import Trajectory

EVALUATIONS: tuple[tuple[str, str, bool], ...] = (
    ("held-out functions", "start", False),
    ("held-out functions", "RL", False),
    ("held-out packages", "start", True),
    ("held-out packages", "RL", True),
)
"""(evaluation, policy, packages) written by ``looprl train`` (``looprl.train.run``): the file is
``RunDir.evaluation(policy.lower(), packages)``."""

IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif"}
"""Files of a run directory the report may show (no SVG: it can carry script)."""


@dataclass(frozen=True)
class RunData:
    """One run directory as the dashboard sees it."""

    name: str
    path: Path
    rows: tuple[dict[str, Any], ...]
    """``metrics.jsonl`` rows that parsed, in file order (one per trainer step)."""
    problems: tuple[str, ...] = ()
    """Human messages: missing files, lines that are not JSON, ..."""
    report_md: str | None = None
    evals: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """evaluation (held-out functions / packages) -> policy (start / RL) -> parsed eval JSON."""
    config: dict[str, Any] | None = None
    """The resolved config (``config.json``)."""
    trajectory_files: tuple[str, ...] = ()
    """Names (without ``.jsonl``) of the files under ``trajectories/``: train, eval_start, ..."""
    mtime: float = 0.0
    """Newest modification time of the files read."""
    is_loop: bool = False
    """A real-time loop run (``looprl feedback loop``): ``cycles.jsonl`` or ``feedback.db``."""
    cycles: tuple[dict[str, Any], ...] = ()
    """``cycles.jsonl`` rows (``dataclasses.asdict(CycleRow)``) that parsed, in file order."""
    final_ab: dict[str, Any] | None = None
    """``final_ab.json``: the final A/B (start vs last promoted policy), when one ran."""
    result: dict[str, float | None] | None = None
    """``result.txt`` (``parse_result``): None until the loop has ended."""
    fault_books: dict[str, Any] | None = None
    """The fault injector's books at its last row (``faults.jsonl``), when it injected faults."""
    state: RunState = RunState("unknown")
    """Where a train run stands (``state.json``): training, finished, stopped, failed, killed."""

    @property
    def last(self) -> dict[str, Any]:
        return self.rows[-1] if self.rows else {}

    @property
    def skipped_steps(self) -> list[int]:
        return [int(r["step"]) for r in self.rows if step_skipped(r)]

    def latest(self, key: str) -> tuple[float | None, int | None]:
        """The newest measured value of ``key`` and its step (skipped steps do not count)."""
        for r in reversed(self.rows):
            v = metric_value(r, key)
            if v is not None:
                return v, int(r["step"])
        return None, None


def metric_value(row: dict[str, Any], key: str) -> float | None:
    """A metric of one step, or None where it was not measured: absent, not a finite number, or
    a trainer-side metric of a skipped step.

    >>> row = {"step": 2, "train/tokens": 0.0, "train/loss": 0.0, "reward/total_mean": -0.1}
    >>> metric_value(row, "train/loss"), metric_value(row, "reward/total_mean")
    (None, -0.1)
    """
    v = row.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return None
    if key in TRAINED_ONLY and step_skipped(row):
        return None
    return float(v)


def metric_values(rows: Sequence[dict[str, Any]], key: str) -> list[float | None]:
    """``metric_value`` of every row (one entry per step)."""
    return [metric_value(r, key) for r in rows]


def numeric_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Keys holding a number in some row, in first-seen order."""
    keys: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                keys.setdefault(k, None)
    return list(keys)


def parse_jsonl(text: str, name: str, key: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows and problems from the text of a JSON-lines file the run appends to (``name``, for
    the messages); a row needs a number under ``key``. A last line without its newline is being
    written: it is skipped with a note, never an error.

    >>> rows, probs = parse_jsonl('{"step": 1}\\nnot json\\n[1]\\n{"step": 2', "metrics.jsonl", "step")
    >>> [r["step"] for r in rows], len(probs), probs[-1][:35]
    ([1], 3, 'metrics.jsonl line 4 is incomplete ')
    """
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    lines = text.split("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):  # no trailing newline: the writer may be mid-line
                problems.append(f"{name} line {i} is incomplete (a running job may be "
                                f"writing it); skipped until it is finished: {e.msg}")
            else:
                problems.append(f"{name} line {i} is not valid JSON ({e.msg} at column "
                                f"{e.colno}); skipped — fix or delete that line")
            continue
        if not isinstance(row, dict):
            problems.append(f"{name} line {i} is a JSON {type(row).__name__}, not an object; "
                            "skipped")
            continue
        if not isinstance(row.get(key), (int, float)):
            problems.append(f"{name} line {i} has no numeric {key!r}; skipped")
            continue
        rows.append(row)
    return rows, problems


def parse_metrics(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows and problems from the text of a ``metrics.jsonl`` (one row per step)."""
    return parse_jsonl(text, "metrics.jsonl", "step")


def parse_result(text: str) -> tuple[dict[str, float | None], list[str]]:
    """The figures of a loop's ``result.txt`` (``key=value ...`` on one line); ``nan`` (no
    value: an arm without that signal, no injected candidate) becomes None.

    >>> parse_result("cycles=2 kept_delta=nan rollback_ok=1 lost=x\\n")
    ({'cycles': 2.0, 'kept_delta': None, 'rollback_ok': 1.0}, ["result.txt: 'lost=x' is not key=number; skipped"])
    """
    out: dict[str, float | None] = {}
    problems: list[str] = []
    for token in text.split():
        k, eq, v = token.partition("=")
        try:
            x = float(v) if eq and k else None
        except ValueError:
            x = None
        if x is None:
            problems.append(f"result.txt: {token!r} is not key=number; skipped")
            continue
        out[k] = None if math.isnan(x) else x
    return out, problems


def _read_json(path: Path, problems: list[str], fix: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append(f"{path.name} could not be read ({e}); {fix}")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path.name} is not a JSON object; {fix}")
        return None
    return obj


def is_loop_dir(path: Path) -> bool:
    """``path`` holds a real-time loop run: its cycles, or the store the loop opens at its start
    (so a loop still in its first cycle is one too)."""
    rd = RunDir(path)
    return rd.cycles.is_file() or rd.feedback_db.is_file()


def is_run_dir(path: Path) -> bool:
    """``path`` holds a run (its config or its metrics), not a folder of runs."""
    rd = RunDir(path)
    return rd.config.is_file() or rd.metrics.is_file()


def expand_runs(paths: Sequence[Path]) -> list[Path]:
    """Run directories: each path that is a run, and the runs one level inside a path that is not
    (``--run runs/`` lists every run there, new ones included on the next page load)."""
    out: list[Path] = []
    for p in paths:
        inner = [] if is_run_dir(p) or not p.is_dir() else sorted(
            (c for c in p.iterdir() if c.is_dir() and is_run_dir(c)),
            key=lambda c: c.stat().st_mtime, reverse=True)
        out += inner or [p]
    return out


def load_run(path: Path, name: str | None = None) -> RunData:
    """Read a run directory (metrics, config, report, evaluations), never raising."""
    path = Path(path)
    name = name or path.name or str(path)
    problems: list[str] = []
    if not path.is_dir():
        return RunData(name, path, (), (f"run directory {path} does not exist; pass --run with a "
                                         "directory written by `looprl train`",))
    rows: list[dict[str, Any]] = []
    mtimes = [path.stat().st_mtime]
    rd = RunDir(path)
    metrics = rd.metrics
    loop = is_loop_dir(path)
    state = read_state(path)
    if metrics.is_file():
        mtimes.append(metrics.stat().st_mtime)
        try:
            rows, bad = parse_metrics(metrics.read_text(errors="replace"))
            problems += bad
        except OSError as e:
            problems.append(f"cannot read {metrics}: {e}")
        if not rows and not problems:
            problems.append("metrics.jsonl is empty: no training step has finished yet")
        groups, no_pass = groups_without_pass(rows)
        if groups and no_pass >= groups:
            problems.append(f"RL had no test signal: no rollout passed the tests in any of the "
                            f"{groups} groups trained{' so far' * (not rd.report.is_file())} "
                            "(train/no_pass_groups), so only the shaping terms moved the policy")
    elif not loop and state.status in ("training", "unknown"):  # a loop trains in cycles and logs them to cycles.jsonl
        problems.append(f"no metrics.jsonl in {path} yet: the first training step has not "
                        f"finished (stage {state.stage or '?'}; this page refreshes by itself)")
    elif not loop and state.status in ("stopped", "failed", "killed"):
        problems.append(f"the run was {state.status} in its {state.stage or '?'} stage, before "
                        "its first training step" + (f": {state.error}" if state.error else "")
                        + "; what finished is kept: continue it with looprl train ... --resume")
    if rows and state.status in ("stopped", "failed", "killed"):
        problems.append(f"the run was {state.status} in its {state.stage or '?'} stage"
                        + (f": {state.error}" if state.error else "")
                        + "; what finished is kept: continue it with looprl train ... --resume")
    report = None
    if rd.report.is_file():
        try:
            report = rd.report.read_text(errors="replace")
        except OSError as e:
            problems.append(f"cannot read report.md: {e}")
    evals: dict[str, dict[str, dict[str, Any]]] = {}
    for group, policy, packages in EVALUATIONS:
        if (f := rd.evaluation(policy.lower(), packages)).is_file():
            obj = _read_json(f, problems, "rerun the evaluation (looprl train --resume)")
            if obj is not None:
                evals.setdefault(group, {})[policy] = obj
    config = None
    if rd.config.is_file():
        config = _read_json(rd.config, problems,
                            "it is the run's resolved config, written when the run starts")
    trajs = rd.trajectories
    files = tuple(sorted(p.stem for p in trajs.glob("*.jsonl"))) if trajs.is_dir() else ()
    cycles, final_ab, result = _read_loop(path, problems, mtimes) if loop else ((), None, None)
    books = None
    if rd.fault_books.is_file():
        try:
            lines, bad = parse_jsonl(rd.fault_books.read_text(errors="replace"),
                                     rd.fault_books.name, "life")
            books = lines[-1] if lines else None
            problems += bad
        except OSError as e:
            problems.append(f"cannot read {rd.fault_books.name}: {e}")
    return RunData(name, path, tuple(rows), tuple(problems), report, evals, config, files,
                   max(mtimes), loop, cycles, final_ab, result, books, state)


def _read_loop(path: Path, problems: list[str], mtimes: list[float]
               ) -> tuple[tuple[dict[str, Any], ...], dict[str, Any] | None,
                          dict[str, float | None] | None]:
    """cycles.jsonl, final_ab.json and result.txt of a loop run; each may be absent yet."""
    rd = RunDir(path)
    db = rd.feedback_db
    for store in (db, db.with_name(db.name + "-wal")):  # sessions arrive: the loop is alive
        try:
            mtimes.append(store.stat().st_mtime)
        except OSError:
            pass
    texts: dict[Path, str] = {}
    for f in (rd.cycles, rd.result):
        if f.is_file():
            try:
                mtimes.append(f.stat().st_mtime)
                texts[f] = f.read_text(errors="replace")
            except OSError as e:
                problems.append(f"cannot read {f}: {e}")
    cycles: list[dict[str, Any]] = []
    if rd.cycles in texts:
        cycles, bad = parse_jsonl(texts[rd.cycles], rd.cycles.name, "cycle")
        problems += bad
    final_ab = None
    if rd.final_ab.is_file():
        final_ab = _read_json(rd.final_ab, problems, "it is written once, when the "
                              "loop's final A/B ends (report.md has its tables too)")
    result = None
    if rd.result in texts:
        result, bad = parse_result(texts[rd.result])
        problems += bad
    return tuple(cycles), final_ab, result


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> dotted keys (the ``-o a.b=c`` names).

    >>> flatten({"grpo": {"lr": 1e-4, "loss": "dr_grpo"}, "name": "x"})
    {'grpo.lr': 0.0001, 'grpo.loss': 'dr_grpo', 'name': 'x'}
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# -- trajectories ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrajSummary:
    """One line of a trajectory file, as the list shows it."""

    n: int
    """Line number in the file (0-based): the trajectory's address."""
    offset: int
    task_id: str
    id: str
    step: int | None
    """``metadata.train_step`` (trained trajectories)."""
    reward: float | None
    passed: bool
    stop_reason: str
    turns: int
    tool_calls: int
    broken_tool_calls: int
    output_tokens: int
    flags: tuple[str, ...]
    versions: tuple[int, ...]
    """The distinct policy versions that sampled its tokens."""


class TrajectoryIndex:
    """Byte offsets and summaries of a growing trajectory file, read incrementally.

    Files are append-only while a run trains; a resume may rewrite ``train.jsonl`` shorter
    (``GRPOLoop`` drops the lost steps' lines), which is noticed by its size or inode and the
    index is rebuilt. A line not yet ended by a newline is left for the next refresh.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.items: list[TrajSummary] = []
        self.problems: list[str] = []
        self._end = 0
        self._ino: int | None = None
        self._lock = threading.Lock()

    def refresh(self) -> list[TrajSummary]:
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError as e:
                self.problems = [f"cannot read {self.path}: {e}"]
                return self.items
            if st.st_ino != self._ino or st.st_size < self._end:
                self.items, self.problems, self._end, self._ino = [], [], 0, st.st_ino
            if st.st_size > self._end:
                self._scan()
            return self.items

    def _scan(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self._end)
            offset = self._end
            for raw in f:
                if not raw.endswith(b"\n"):
                    break  # being written
                n = len(self.items) + len(self.problems)
                try:
                    self.items.append(_summary(n, offset, json.loads(raw)))
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    self.problems.append(f"{self.path.name} line {n + 1} is not a trajectory "
                                         f"({type(e).__name__}: {e}); skipped")
                offset += len(raw)
            self._end = offset

    def find(self, n: int) -> TrajSummary | None:
        items = self.refresh()
        lo, hi = 0, len(items)
        while lo < hi:  # items are sorted by n (bad lines leave holes)
            mid = (lo + hi) // 2
            if items[mid].n < n:
                lo = mid + 1
            else:
                hi = mid
        return items[lo] if lo < len(items) and items[lo].n == n else None

    def read(self, n: int) -> Trajectory | None:
        """The trajectory on line ``n``, or None when there is none."""
        s = self.find(n)
        if s is None:
            return None
        with open(self.path, "rb") as f:
            f.seek(s.offset)
            return Trajectory.from_dict(json.loads(f.readline()))


def _summary(n: int, offset: int, d: dict[str, Any]) -> TrajSummary:
    t = Trajectory.from_dict(d)
    versions = sorted({v for s in t.segments for v, m in zip(s.policy_version_T, s.loss_mask_T,
                                                             strict=True) if m})
    step = t.metadata.get("train_step")
    return TrajSummary(
        n, offset, t.task_id, t.id, int(step) if isinstance(step, (int, float)) else None,
        t.reward.total if t.reward else None, t.passed, t.stop_reason.value,
        t.counters.turns, t.counters.tool_calls, t.counters.broken_tool_calls,
        t.counters.output_tokens, t.reward.flags if t.reward else (), tuple(versions))


def load_tokenizer(run: RunData) -> Any:
    """The run's tokenizer (``tokenizers.Tokenizer``) for showing token ids as text, or None.

    Looked for in the models the run saved (``model_rl``, ``model_start``, ...), then at the
    configured model: a training run's ``model.path``, a real-time loop's ``model`` (its start
    policy, whose tokenizer every version keeps)."""
    from tokenizers import Tokenizer

    dirs = list(RunDir(run.path).saved_models)
    model = (run.config or {}).get("model")
    model_path = model.get("path") if isinstance(model, dict) else model
    if isinstance(model_path, str) and model_path:
        dirs.append(Path(model_path))
    for d in dirs:
        if (d / "tokenizer.json").is_file():
            try:
                return Tokenizer.from_file(str(d / "tokenizer.json"))
            except Exception:  # noqa: BLE001 — a damaged file: try the next, else show ids
                continue
    return None


@dataclass(frozen=True)
class FleetData:
    """An environment server's pool metrics (``GET /v1/metrics``), or why they are missing."""

    url: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def fetch_fleet(url: str, token: str | None, timeout_s: float = 3.0) -> FleetData:
    """Pool metrics of the env server at ``url`` (``looprl sandbox serve``), never raising."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"{base}/v1/metrics", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as e:
        return FleetData(url, error=f"env server {url} is unreachable ({type(e).__name__}: {e}); "
                                    "check --env-server and that `looprl sandbox serve` runs there")
    if r.status_code == 401:
        return FleetData(url, error=f"env server {url} refused the bearer token; pass --env-token "
                                    "with the --token given to `looprl sandbox serve`")
    if r.status_code != 200:
        return FleetData(url, error=f"env server {url} answered HTTP {r.status_code} on "
                                    f"/v1/metrics: {r.text[:200]}")
    try:
        body = r.json()
    except ValueError:
        return FleetData(url, error=f"env server {url} sent non-JSON metrics; is --env-server the "
                                    "URL of a looprl env server?")
    if not isinstance(body, dict):
        return FleetData(url, error=f"env server {url} sent metrics that are not a JSON object")
    return FleetData(url, metrics=body)


@dataclass(frozen=True)
class FeedbackData:
    """A/B report and cycle records of a feedback store, or why they are missing."""

    path: Path
    report: ABReport | None = None
    cycles: tuple[CycleRecord, ...] = ()
    sessions: int = 0
    error: str | None = None
    experiment: str | None = None
    """The A/B experiment the report covers (None: every session in the store)."""


def load_feedback(path: Path, min_sessions: int = 100, experiment: str | None = None) -> FeedbackData:
    """Open the store read-mostly (never creating one) and compute the A/B report."""
    from looprl.errors import LooprlError
    from looprl.feedback.ab import ab_report
    from looprl.feedback.store import FeedbackStore

    path = Path(path)
    if not path.is_file():  # FeedbackStore would create an empty store: say so instead
        return FeedbackData(path, error=f"no feedback store at {path}; pass --store with the file "
                                        "given to `looprl serve --store`")
    try:
        store = FeedbackStore(path)
    except LooprlError as e:
        return FeedbackData(path, error=str(e))
    try:
        n = len(store.sessions(experiment=experiment))
        if experiment is not None and n == 0:
            known = sorted({s.experiment for s in store.sessions()} - {""})
            return FeedbackData(path, error=f"no sessions of experiment {experiment!r} in {path}; "
                                            f"it holds: {', '.join(known) or 'none named'}",
                                experiment=experiment)
        rep = ab_report(store, min_sessions=min_sessions, experiment=experiment)
        return FeedbackData(path, rep, tuple(store.cycles()), n, experiment=experiment)
    except Exception as e:  # noqa: BLE001 — a corrupt row must not take the page down
        return FeedbackData(path, error=f"cannot read feedback store {path}: "
                                        f"{type(e).__name__}: {e}")
    finally:
        store.close()


def fmt(v: Any) -> str:
    """A compact display of a metric value.

    >>> fmt(0.123456), fmt(12345.6), fmt(3), fmt(None), fmt(float("nan"))
    ('0.1235', '1.235e+04', '3', '—', 'nan')
    """
    if v is None:
        return "—"
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return str(v)
