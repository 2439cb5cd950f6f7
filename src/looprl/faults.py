"""Fault injection at every boundary, and the run's ledger of infrastructure failures by class.

    [faults]                          # a section of `looprl train`'s config (off by default)
    rates = {all = 0.05}              # every class at 5% of its boundary's crossings
    # or, in any looprl process:  LOOPRL_FAULTS="sandbox_create=0.1,engine_error=0.05,seed=1"

The injector makes a boundary fail as one class of the taxonomy (``looprl.errors.InfraKind``),
where a real failure of that class would start, so the injected error takes the real one's way
through retries and classification. One place per boundary, the rate per crossing of it:

| class | where | one crossing |
|---|---|---|
| sandbox_create | ``SandboxPool.acquire`` | a lease |
| exec_timeout | ``BwrapSandbox.exec`` / ``ContainerSandbox.exec`` (the agent's commands and the grader's) | a command |
| grader_crash | the scorers (``rollout/score.py``) | a grading |
| engine_error | ``TorchEngine.generate``; a fleet node's ``ReplicaClient.generate`` | a request |
| weight_read / weight_write | ``FsspecWeightStore.load`` / ``.publish`` | a load / publish |
| env_server_5xx | ``RemoteSandbox``'s requests: answered 503 | a request |
| connection_dropped | ``RemoteSandbox``'s requests: the connection drops | a request |
| node_lost | ``RayFleet.attempt``: the node's actors are killed | an attempt |
| process_killed | the trainer, at a step's row (``InfraLedger.step_row``): SIGKILL | a step |

A run counts what it observed in an ``InfraLedger``: every rollout attempt the runner gets back
(an ``INFRA_ERROR`` trajectory counts under its ``infra_kind``), every failed publish or load
the store's retries absorbed, every node the fleet lost, every life of the trainer that ended
before the run (on ``--resume``). ``step_row`` gives a metrics row the cumulative count of each
class (``infra/<class>``) and the step's rate per rollout attempt (``infra_rate/<class>``), and
writes ``infra.json`` in the run directory.

The injector keeps books of its own (``faults.jsonl`` in the run directory, a line at each step
row, when the ledger writes its own): what it *injected*; what is still *open* (in an attempt
that has not come back, ``scope``); what was *cut off* (in an attempt cancelled at the end of the
run, or killed with the process: no outcome ever came back, so nothing observed it); and
``settled = injected - open - cut_off``. At every row, the ledger's count of each class equals
the injector's ``settled`` (``reconcile``): no injected failure was lost, scored, counted twice
or put in another class. Injections in another process (a fleet node's actors, a remote env
server) are counted there and reported back with the call's result (``absorb``), so the
trainer's books hold them too; an injector without a directory keeps no file.

Not covered: failures no boundary here raises (a kernel OOM kill of a sandboxed command is the
model's, a full host disk fails wherever it lands); engines other than the torch engine
(vLLM, OpenAI servers) are not injected; an env server in another process answers with the
class its own injector chose, which that process counts. The injector is for tests and
drills: it never runs unless configured.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import signal
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprl.config import FieldError, Seed, Share
from looprl.errors import (
    InfraKind,
    LooprlError,
    PolicyError,
    RewardError,
    SandboxError,
    WeightStoreError,
)
from looprl.rundir import RunDir
from looprl.types import Trajectory

INJECTABLE: tuple[InfraKind, ...] = (
    InfraKind.SANDBOX_CREATE, InfraKind.EXEC_TIMEOUT, InfraKind.GRADER_CRASH,
    InfraKind.ENGINE_ERROR, InfraKind.WEIGHT_READ, InfraKind.WEIGHT_WRITE,
    InfraKind.ENV_SERVER_5XX, InfraKind.CONNECTION_DROPPED, InfraKind.NODE_LOST,
    InfraKind.PROCESS_KILLED)
"""The classes the injector can inject (the table in the module docstring)."""

ENV_VAR = "LOOPRL_FAULTS"
MARK = "[injected fault]"
"""Starts every injected error's message: a saved trajectory that contains it was scored with an
injected failure inside, which must never happen."""
SCOPE_HEADER = "X-Looprl-Fault-Scope"
log = logging.getLogger(__name__)
"""The attempt a request to an environment server belongs to (``RemoteSandbox`` sends it)."""

_ERRORS: dict[InfraKind, type[LooprlError]] = {
    InfraKind.SANDBOX_CREATE: SandboxError, InfraKind.EXEC_TIMEOUT: SandboxError,
    InfraKind.GRADER_CRASH: RewardError, InfraKind.ENGINE_ERROR: PolicyError,
    InfraKind.WEIGHT_READ: WeightStoreError, InfraKind.WEIGHT_WRITE: WeightStoreError}
"""The error a boundary raises for the classes injected by raising."""


@dataclass(frozen=True)
class FaultsConfig:
    """The fault injector (``looprl.faults``): off unless a rate is set. For drills and tests
    of the failure handling, never for a run whose result matters."""

    rates: dict[str, Share] = field(default_factory=dict)
    """Probability that one crossing of a boundary fails, by class (``INJECTABLE`` names);
    ``all`` sets every class not named."""
    seed: Seed = 0
    """Seeds the injector's draws: one stream per class, process role and life of the trainer,
    so a class's draws do not depend on how often the others were asked."""

    def __post_init__(self) -> None:
        names = {k.value for k in INJECTABLE} | {"all"}
        for name, rate in self.rates.items():
            if name not in names:
                raise FieldError("rates", f"has unknown class {name!r}; use all or one of "
                                 f"{', '.join(sorted(names - {'all'}))}")
            if not (isinstance(rate, (int, float)) and math.isfinite(rate) and 0 <= rate <= 1):
                raise FieldError("rates", f"{name} must be a probability in [0, 1], got {rate!r}")

    def rate(self, kind: InfraKind) -> float:
        return float(self.rates.get(kind.value, self.rates.get("all", 0.0)))

    @property
    def active(self) -> bool:
        return any(self.rate(k) > 0 for k in INJECTABLE)

    def only(self, kinds: Iterable[InfraKind]) -> FaultsConfig:
        """The same rates for ``kinds`` alone (what one role of a fleet injects)."""
        keep = set(kinds)
        return FaultsConfig({k.value: self.rate(k) for k in INJECTABLE if k in keep}, self.seed)

    @classmethod
    def parse(cls, text: str) -> FaultsConfig:
        """``LOOPRL_FAULTS``'s form: ``all=0.05,node_lost=0.01,seed=3``.

        >>> FaultsConfig.parse("all=0.05, seed=3").rate(InfraKind.NODE_LOST)
        0.05
        """
        rates: dict[str, float] = {}
        seed = 0
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, eq, value = part.partition("=")
            try:
                if not eq:
                    raise ValueError(part)
                if name.strip() == "seed":
                    seed = int(value)
                else:
                    rates[name.strip()] = float(value)
            except ValueError:
                raise FieldError("rates", f"{ENV_VAR}: {part!r} is not NAME=NUMBER; write e.g. "
                                 f"{ENV_VAR}='all=0.05,seed=1'") from None
        return cls(rates, seed)

    @classmethod
    def from_env(cls) -> FaultsConfig:
        return cls.parse(os.environ.get(ENV_VAR, ""))


# ------------------------------------------------------------------------------------- the books

def _plain(c: Mapping[str, int]) -> dict[str, int]:
    return {k: int(v) for k, v in sorted(c.items()) if v}


_SCOPE: ContextVar[str | None] = ContextVar("looprl_fault_scope", default=None)


class FaultInjector:
    """Decides each crossing of an injection point (``fires``) and keeps books of what it
    injected; one per process (``install``). Thread-safe: stores and graders call it from
    worker threads."""

    def __init__(self, cfg: FaultsConfig, *, books: Path | None = None, role: str = "trainer"):
        self.cfg, self.books_path = cfg, books
        self.injected: Counter[str] = Counter()
        self.cut_off: Counter[str] = Counter()
        self.life = 0
        """Lives of this role before this one (a trainer resumed after a kill is its next)."""
        self._open: dict[str, Counter[str]] = {}
        self._lock = threading.Lock()
        self._restore()
        self._rngs = {k: random.Random(f"{cfg.seed}:{role}:{self.life}:{k.value}")
                      for k in INJECTABLE}

    def _restore(self) -> None:
        """Continue the books of the last row an earlier life of this trainer wrote: what was
        open then is cut off (it died with that process)."""
        if self.books_path is None or not self.books_path.is_file():
            return
        last = None
        for line in self.books_path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                last = json.loads(line)
        if last is None:
            return
        self.injected.update(last["injected"])
        self.cut_off.update(last["cut_off"])
        self.cut_off.update(last["open"])
        self.life = int(last["life"]) + 1

    # -- deciding ------------------------------------------------------------------------------
    def fires(self, kind: InfraKind) -> bool:
        """Whether this crossing fails as ``kind`` (counted in the current scope if it does)."""
        rate = self.cfg.rate(kind)
        if rate <= 0:
            return False
        with self._lock:
            if self._rngs[kind].random() >= rate:
                return False
            self._count(kind.value, 1, _SCOPE.get())
        return True

    def _count(self, kind: str, n: int, scope_id: str | None) -> None:
        self.injected[kind] += n
        if scope_id in self._open:
            self._open[scope_id][kind] += n

    def count_in(self, kind: InfraKind, scope_ids: Iterable[str]) -> None:
        """An injected failure that also fails the attempts ``scope_ids`` (a killed node takes
        every rollout in flight on it)."""
        with self._lock:
            for sid in scope_ids:
                self._count(kind.value, 1, sid)

    def absorb(self, counts: Mapping[str, int]) -> None:
        """Failures another process injected into the call that returned here (counted in the
        current scope)."""
        with self._lock:
            for kind, n in counts.items():
                self._count(kind, int(n), _SCOPE.get())

    # -- scopes ----------------------------------------------------------------------------------
    def _open_scope(self, scope_id: str) -> Counter[str]:
        with self._lock:
            return self._open.setdefault(scope_id, Counter())

    def _close_scope(self, scope_id: str, settled: bool) -> None:
        with self._lock:
            counts = self._open.pop(scope_id, Counter())
            if not settled:
                self.cut_off.update(counts)

    # -- the books -------------------------------------------------------------------------------
    def books(self) -> dict[str, Any]:
        """What was injected, is open, was cut off and settled, by class."""
        with self._lock:
            open_: Counter[str] = Counter()
            for c in self._open.values():
                open_.update(c)
            settled = self.injected - open_ - self.cut_off
            return {"life": self.life, "injected": _plain(self.injected), "open": _plain(open_),
                    "cut_off": _plain(self.cut_off), "settled": _plain(settled)}

    def write_books(self, step: int | None = None) -> None:
        """Append the books (at step row ``step``) to the books file, if there is one."""
        if self.books_path is None:
            return
        line = json.dumps({"step": step, **self.books()})
        self.books_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.books_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())  # the line must outlive a SIGKILL that follows at once


_ACTIVE: FaultInjector | None = None


def install(injector: FaultInjector | None) -> FaultInjector | None:
    """Make ``injector`` this process's (None: no injection); returns the one it replaces."""
    global _ACTIVE
    before, _ACTIVE = _ACTIVE, injector
    return before


def active() -> FaultInjector | None:
    return _ACTIVE


def install_from_env(role: str = "process") -> FaultInjector | None:
    """Install an injector from ``LOOPRL_FAULTS`` when it sets a rate (no books file)."""
    cfg = FaultsConfig.from_env()
    if cfg.active and _ACTIVE is None:
        log.warning("%s=%s: this process fails on purpose (%s)", ENV_VAR, os.environ[ENV_VAR],
                    role)
        install(FaultInjector(cfg, role=role))
    return _ACTIVE


def fires(kind: InfraKind) -> bool:
    """Whether this crossing of ``kind``'s boundary fails (always False without an injector)."""
    return _ACTIVE is not None and _ACTIVE.fires(kind)


def maybe_raise(kind: InfraKind, where: str) -> None:
    """Raise ``kind``'s boundary error at ``where`` when the injector says so."""
    if fires(kind):
        raise _ERRORS[kind](f"{MARK} {kind.value} at {where}", kind=kind)


def absorb(counts: Mapping[str, int]) -> None:
    if _ACTIVE is not None and counts:
        _ACTIVE.absorb(counts)


@contextlib.contextmanager
def scope(scope_id: str) -> Iterator[Counter[str]]:
    """One rollout attempt: failures injected inside (in this task, its threads, an env server
    of this process serving it) are counted in it; it settles when the block ends normally and is
    cut off when it raises or is cancelled. Yields the attempt's injections so far (a node's
    environment server sends them back with the attempt)."""
    inj = _ACTIVE
    counts: Counter[str] = inj._open_scope(scope_id) if inj is not None else Counter()
    token = _SCOPE.set(scope_id)
    settled = False
    try:
        yield counts
        settled = True
    finally:
        _SCOPE.reset(token)
        if inj is not None:
            inj._close_scope(scope_id, settled)


@contextlib.contextmanager
def tagged(scope_id: str | None) -> Iterator[None]:
    """Count injections in the block in the attempt ``scope_id`` opened elsewhere in this process
    (an env server's handler serving that attempt's request); a no-op for None."""
    if not scope_id:
        yield
        return
    token = _SCOPE.set(scope_id)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def current_scope() -> str | None:
    return _SCOPE.get()


# ------------------------------------------------------------------------------------ the ledger

class InfraLedger:
    """What a run observed: rollout attempts and infrastructure failures by class (module
    docstring). ``path`` (``run_dir/infra.json``) keeps it across lives of the trainer: a run
    resumed while the ledger was open (the process died before the run ended) counts a
    ``process_killed``."""

    def __init__(self, path: Path | None = None, *, resumed: bool = False):
        self.path = path
        self.failures: Counter[str] = Counter()
        self.attempts = 0
        self._row_failures: Counter[str] = Counter()
        self._row_attempts = 0
        self._step: int | None = None
        saved = json.loads(path.read_text()) if path is not None and path.is_file() else None
        if saved is not None and resumed:
            self.failures.update(saved["failures"])
            self.attempts, self._step = int(saved["attempts"]), saved.get("step")
            self._row_failures, self._row_attempts = Counter(self.failures), self.attempts
            if not saved.get("finished"):
                self.failures[InfraKind.PROCESS_KILLED.value] += 1
        self._save(finished=False)

    def attempt(self, traj: Trajectory) -> None:
        """A rollout attempt came back: scored, or an infrastructure failure of its class."""
        self.attempts += 1
        if traj.is_infra_error:
            self.failures[traj.infra_kind or InfraKind.INTERNAL.value] += 1

    def failure(self, kind: InfraKind, n: int = 1) -> None:
        """``n`` failures outside rollout attempts (a publish retried, a load retried)."""
        if n:
            self.failures[kind.value] += n

    def counts(self) -> dict[str, int]:
        return {k.value: self.failures[k.value] for k in InfraKind}

    def step_row(self, step: int) -> dict[str, float]:
        """The metrics of a step's row: each class's cumulative count and its rate per rollout
        attempt since the last row. Saves the ledger and the injector's books at this instant;
        then the injected process kill, if it fires, happens here."""
        attempts = self.attempts - self._row_attempts
        row: dict[str, float] = {"infra/attempts": float(self.attempts)}
        for k in InfraKind:
            n = self.failures[k.value]
            row[f"infra/{k.value}"] = float(n)
            row[f"infra_rate/{k.value}"] = (n - self._row_failures[k.value]) / max(attempts, 1)
        failed = sum(self.failures.values()) - sum(self._row_failures.values())
        row["infra_rate/all"] = failed / max(attempts, 1)
        self._row_failures, self._row_attempts = Counter(self.failures), self.attempts
        self._step = step
        self._save(finished=False)
        inj = _ACTIVE
        kill = inj is not None and inj.fires(InfraKind.PROCESS_KILLED)
        if inj is not None:
            inj.write_books(step)
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
        return row

    def close(self) -> None:
        """The run ended (a later resume is no kill)."""
        self._save(finished=True)

    def _save(self, *, finished: bool) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"step": self._step, "attempts": self.attempts,
                                   "failures": _plain(self.failures), "finished": finished}))
        os.replace(tmp, self.path)


def reconcile(run_dir: Path) -> dict[str, dict[str, int]]:
    """The last metrics row's count of each class beside the injector's books at that row:
    ``{class: {"metrics": n, "injected": n, "settled": n, "cut_off": n}}`` (they agree when
    ``metrics == settled`` for every class)."""
    rd = RunDir(run_dir)
    rows = [json.loads(x) for x in rd.metrics.read_text().splitlines() if x.strip()]
    books = [json.loads(x) for x in rd.fault_books.read_text().splitlines() if x.strip()]
    last = rows[-1]
    mine = [b for b in books if b["step"] == last["step"]][-1]
    return {k.value: {"metrics": int(last.get(f"infra/{k.value}", 0)),
                      "injected": mine["injected"].get(k.value, 0),
                      "settled": mine["settled"].get(k.value, 0),
                      "cut_off": mine["cut_off"].get(k.value, 0)} for k in InfraKind}
