"""What the dashboard shows, read from disk and the network into plain records — never raising.

    run = load_run(Path("runs/quickstart"))      # metrics rows + problems found + report + evals
    fleet = fetch_fleet("http://10.0.0.5:8377", token="s3cret")   # env server pool metrics
    fb = load_feedback(Path("feedback.db"))      # A/B report + cycles of a FeedbackStore

Every loader turns a missing or malformed input into a human message on the record (``problems``
or ``error``) so the page can say what is wrong and how to fix it; a page never fails because a
run is still starting, a line is half-written or a server is down.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from looprl.feedback.ab import ABReport
from looprl.feedback.store import CycleRecord

EVAL_FILES = (("SFT", "eval_sft.json"), ("RL", "eval_rl.json"))


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
    evals: dict[str, dict[str, Any]] = field(default_factory=dict)
    """label (SFT / RL) -> parsed eval JSON."""
    mtime: float = 0.0
    """Newest modification time of the files read (a cache key for charts)."""

    @property
    def last(self) -> dict[str, Any]:
        return self.rows[-1] if self.rows else {}


def numeric_keys(rows: tuple[dict[str, Any], ...]) -> list[str]:
    """Keys holding a number in some row, in first-seen order."""
    keys: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                keys.setdefault(k, None)
    return list(keys)


def parse_metrics(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows and problems from the text of a ``metrics.jsonl``.

    >>> rows, probs = parse_metrics('{"step": 1}\\nnot json\\n[1]\\n{"step": 2')
    >>> [r["step"] for r in rows], len(probs)
    ([1], 3)
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
                problems.append(f"metrics.jsonl line {i} is incomplete (a running job may be "
                                f"writing it); skipped until it is finished: {e.msg}")
            else:
                problems.append(f"metrics.jsonl line {i} is not valid JSON ({e.msg} at column "
                                f"{e.colno}); skipped — fix or delete that line")
            continue
        if not isinstance(row, dict):
            problems.append(f"metrics.jsonl line {i} is a JSON {type(row).__name__}, not an object "
                            "of metric -> value; skipped")
            continue
        if not isinstance(row.get("step"), (int, float)):
            problems.append(f"metrics.jsonl line {i} has no numeric 'step'; skipped")
            continue
        rows.append(row)
    return rows, problems


def _read_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append(f"{path.name} could not be read ({e}); regenerate it with the evaluation")
        return None
    if not isinstance(obj, dict):
        problems.append(f"{path.name} is not a JSON object; regenerate it with the evaluation")
        return None
    return obj


def load_run(path: Path, name: str | None = None) -> RunData:
    """Read a run directory (``metrics.jsonl``, ``report.md``, ``eval_*.json``), never raising."""
    path = Path(path)
    name = name or path.name or str(path)
    problems: list[str] = []
    if not path.is_dir():
        return RunData(name, path, (), (f"run directory {path} does not exist; pass --run with a "
                                         "directory written by `looprl quickstart` or GRPOLoop",))
    rows: list[dict[str, Any]] = []
    mtimes = [path.stat().st_mtime]
    metrics = path / "metrics.jsonl"
    if metrics.is_file():
        mtimes.append(metrics.stat().st_mtime)
        try:
            rows, bad = parse_metrics(metrics.read_text(errors="replace"))
            problems += bad
        except OSError as e:
            problems.append(f"cannot read {metrics}: {e}")
        if not rows and not problems:
            problems.append("metrics.jsonl is empty: no training step has finished yet")
    else:
        problems.append(f"no metrics.jsonl in {path} yet: the first training step has not "
                        "finished (this page refreshes by itself)")
    report = None
    if (path / "report.md").is_file():
        try:
            report = (path / "report.md").read_text(errors="replace")
        except OSError as e:
            problems.append(f"cannot read report.md: {e}")
    evals = {}
    for label, fname in EVAL_FILES:
        if (path / fname).is_file():
            obj = _read_json(path / fname, problems)
            if obj is not None:
                evals[label] = obj
    return RunData(name, path, tuple(rows), tuple(problems), report, evals, max(mtimes))


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
        rep = ab_report(store, min_sessions=min_sessions, experiment=experiment)
        n = len(store.sessions(experiment=experiment))
        return FeedbackData(path, rep, tuple(store.cycles()), n)
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
