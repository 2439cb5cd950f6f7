"""Grading by hidden tests: the agent's final diff, applied to a fresh sandbox over the task's base,
must make ``fail_to_pass`` pass and keep ``pass_to_pass`` passing.

    g = await grade(task, trajectory.diff)        # -> GradeResult (score 1.0 only if all pass)
    traj = attach_grade(traj, g)                   # records the score on the trajectory
    tests_reward(task, traj)                       # -> 1.0 / 0.0, or None when ungraded

Every test run in looprl (fetching a package, screening a mutation, grading) goes through
``run_tests``: ``Grader.test_command`` + node ids or files; output goes to a file in the workspace
(never cut by the sandbox's output cap) and is parsed from pytest's ``-rA`` short summary.

Grading (``grade_in``, also what screening a mutation runs) trusts nothing in the workspace but
the package under test, and grades every workspace the agent can leave:
- Pristine tests and runner: the agent's diff is applied (real ``git apply``) without the patches
  of any test file, test path or test config, any file pytest or the interpreter reads besides
  the package (the config names the installed pytest discovers, ``conftest.py``, ``setup.py``
  created or deleted, ``sitecustomize.py``, ``*.pth``, distribution metadata:
  ``isolation.runner_paths``), any module that would shadow pytest, the standard library or
  the venv (``isolation.shadowing_paths``), and anything below or in place of one of those
  (``graded_diff``): those are graded as the base has them, whatever shape (file, directory,
  symlink, deleted) the workspace gave them. Then the hidden ``grader.test_patch`` is applied.
- A clean runner: ``run_isolated`` runs the task's pytest options through ``pytest_runner.py``
  (``python -I`` from the read-only tools dir; see its docstring), and outcomes come from that
  runner's report, not from the console: every graded id must be reported passed (a missing id
  fails), by a session that ended with the process's own exit status. The runner also lists
  the config pytest read (its inifile, the conftest modules it loaded); one the diff changed
  means the run was not clean: flag ``runner_config``, score 0.
- What cannot be neutralised is scored: library code that acts on the test run
  (``hacking.tampering_lines``) or test files changed while the tests ran score 0.
``GradeResult.flags`` names every monitor the diff tripped (``hacking.RUNNER_CHECKS``, and
``hacking.GRADER_FLAGS``); ``edited_tests`` says it touched tests. Only what fails outside the
workspace raises ``RewardError`` (infrastructure, never 0): the sandbox, a diff the sandbox did
not write that does not apply (a task's patches), pytest usage/internal errors on the task's
base, a task command that is not pytest. When pytest cannot run with the agent's diff but runs
on the task's base (e.g. the diff broke an import in a ``conftest.py``, or its code exited the
process early), the diff is at fault and scores 0 (``broke_test_run``).

A task whose ``grader.verifier`` is set (a Harbor task) is graded by its verifier script instead
(``_grade_by_verifier``, pieces in ``verifier.py``): the same graded diff in the same kind of
fresh sandbox, the score read from the reward file the script writes. A missing or malformed
reward file follows the rule above: the diff's fault (0, ``broke_test_run``, the reason in
``GradeResult.error``) when the untouched base gets a reward, else a ``RewardError``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import shlex
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from looprl.diffs import parse_diff, touched_paths
from looprl.errors import RewardError, SandboxError, ToolError
from looprl.protocols import Sandbox
from looprl.rewards.evalscript import (
    EVAL_COMMAND,
    eval_dirs,
    eval_mounts,
    judge,
    read_log,
    status_writes,
)
from looprl.rewards.hacking import edited_test_paths, is_test_path, runner_attempts
from looprl.rewards.isolation import (
    RUNNER,
    PytestCommand,
    RunnerReport,
    new_report_name,
    runner_paths,
    shadowing_paths,
)
from looprl.rewards.logparse import LogError
from looprl.rewards.verifier import (
    RewardFileError,
    links_out,
    output_tail,
    read_reward,
    reward_writes,
    verifier_command,
    verifier_logs,
    verifier_mounts,
)
from looprl.types import Metadata, Task, Trajectory

# ------------------------------------------------------------------ running pytest
OUTPUT_FILE = ".looprl-pytest.out"
"""Where a run's output is written inside the workspace (read back, then left for the throwaway
sandbox; it is not a source file, so diffs of screening sandboxes never matter)."""

# -o addopts= drops a package's own addopts (coverage plugins, doctest collection) so the suite
# runs with pytest alone; classic output keeps the summary lines one-per-test.
PYTEST_FLAGS = ("-p no:cacheprovider -q -rA --tb=short --color=no -o addopts= "
                "-o console_output_style=classic")

_STATUS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "XFAIL": "xfailed",
           "XPASS": "xpassed"}
_LINE_RE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (?P<id>[^\s\[]+(?:\[[^\]]*\])?)"
                      r"(?: - (?P<msg>.*))?$")
_COUNTS_RE = re.compile(r"(\d+) (passed|failed|error|errors)\b")


def pytest_command(pythonpath: str = ".") -> str:
    """The shell command that runs pytest on the workspace copy of a package (not the installed
    one: ``PYTHONPATH`` puts the workspace's source root first).

    It writes no ``.pyc`` into the workspace (the sandbox sets ``PYTHONDONTWRITEBYTECODE=1``):
    Python checks a cached module only by source mtime (whole seconds) and size, so an edit of
    the same size within the second of the last run (``13`` -> ``14``) would otherwise run stale
    bytecode. Modules unchanged since the task was built still load from the base's bytecode.
    Screening (``tasks.build``), which byte-compiles the files it rewrites in one reused
    sandbox, prefixes ``PYTHONDONTWRITEBYTECODE=`` to keep what pytest compiles (~1.5-2x faster).
    """
    return (f"COLUMNS=240 PYTHONPATH={shlex.quote(pythonpath)} "
            f"python -m pytest {PYTEST_FLAGS}")


@dataclass(frozen=True)
class TestRun:
    """Per-test outcomes of one pytest run (node id -> outcome) and the failure messages."""

    __test__ = False  # not a pytest test class

    outcomes: dict[str, str]
    messages: dict[str, str] = field(default_factory=dict)
    exit_code: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    output_tail: str = ""
    details: dict[str, str] = field(default_factory=dict)
    """node id -> the ``E`` lines of its failure (wrong vs expected values)."""
    report: RunnerReport | None = None
    """``run_isolated``: the runner's report, where ``outcomes`` come from (None: not isolated)."""

    def passed(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o == "passed"}

    def failed(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o in ("failed", "error")}


def parse_pytest_output(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(outcomes, failure messages) from pytest ``-rA`` output.

    >>> out = "x\\n=== short test summary info ===\\nPASSED t.py::a\\nFAILED t.py::b[1 2] - assert 1 == 2\\n"
    >>> parse_pytest_output(out)
    ({'t.py::a': 'passed', 't.py::b[1 2]': 'failed'}, {'t.py::b[1 2]': 'assert 1 == 2'})
    """
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    _, sep, summary = text.partition("short test summary info")
    for line in (summary if sep else text).splitlines():
        m = _LINE_RE.match(line.rstrip())
        if not m:
            continue
        node = m.group("id")
        outcomes[node] = _STATUS[m.group(1)]
        if m.group("msg"):
            messages[node] = m.group("msg")
    return outcomes, messages


def failure_details(text: str) -> dict[str, str]:
    """Test name -> the ``E  ...`` lines of its traceback (``--tb=short`` section headers are
    ``___ test_name ___``), for prompts that quote the wrong value."""
    out: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^_{3,} (.+?) _{3,}$", line)
        if m:
            if name and lines:
                out[name] = "\n".join(lines)
            name, lines = m.group(1), []
        elif name and line.startswith("E   "):
            lines.append(line[4:].rstrip())
    if name and lines:
        out[name] = "\n".join(lines)
    return out


async def run_tests(sandbox: Sandbox, command: str, targets: list[str] | tuple[str, ...], *,
                    timeout_s: float = 120.0, report: str | None = None) -> TestRun:
    """Run ``command`` + ``targets`` (node ids or files) in ``sandbox``; parse the outcomes.
    ``report``: the isolated runner's report file (``run_isolated``), where the outcomes come
    from then (with the digest the runner printed), not from the console.

    Raises ``SandboxError`` when the sandbox itself fails (never a test outcome)."""
    args = " ".join(shlex.quote(t) for t in targets)
    t0 = time.monotonic()
    # (removed first: the host reads it back and follows no link, so a link or directory the
    # workspace has there would lose the output)
    res = await sandbox.exec(f"rm -rf -- {OUTPUT_FILE}; {command} {args} > {OUTPUT_FILE} 2>&1",
                             timeout_s=timeout_s)
    wall = time.monotonic() - t0
    try:
        text = (await sandbox.read(OUTPUT_FILE)).decode("utf-8", "replace")
    except ToolError as e:
        raise SandboxError(f"pytest wrote no output file ({e}); sandbox stderr: "
                           f"{res.stderr[-500:]}") from None
    outcomes, messages = parse_pytest_output(text)
    rep = None
    if report is not None:
        try:
            data = await sandbox.read(report)
        except ToolError:  # never started, or removed by the code under test: judged by the caller
            data = b""
        rep = RunnerReport.parse(data, res.stdout)
        outcomes = rep.outcomes
    by_header = failure_details(text)
    details = {t: by_header[h] for t in outcomes
               if (h := t.split("::", 1)[-1].replace("::", ".")) in by_header}
    return TestRun(outcomes, messages, res.exit_code, res.timed_out, wall, text[-4000:], details,
                   rep)


async def run_isolated(sandbox: Sandbox, command: PytestCommand, targets: list[str] | tuple[str, ...],
                       *, timeout_s: float = 120.0) -> TestRun:
    """``run_tests`` through the isolated runner: outcomes from its report (printed lines count
    for nothing; messages and details still come from the console)."""
    report = new_report_name()
    return await run_tests(sandbox, command.isolated(f"{sandbox.tools_dir}/{RUNNER}", report),
                           targets, timeout_s=timeout_s, report=report)


# ------------------------------------------------------------------ grading

_PATCH_FILE = ".looprl-grade.diff"
# pytest exit codes that mean the grader itself could not run: internal error, usage error
# (e.g. a node id not found), no tests collected.
_GRADER_FAILURE_EXIT = {3, 4, 5}


class _DidNotRun(RewardError):
    """The grader got no outcome: pytest exited without running the tests (usage or internal
    error, nothing collected, the session never ended), or a verifier wrote no usable reward
    file. ``grade`` decides whose fault it is."""

    def __init__(self, message: str, output_tail: str, wall_s: float,
                 flags: tuple[str, ...]) -> None:
        super().__init__(message)
        self.output_tail, self.wall_s, self.flags = output_tail, wall_s, flags


@dataclass(frozen=True)
class GradeResult:
    """The outcome of grading one diff."""

    score: float
    """1.0 if every fail_to_pass and pass_to_pass test passed and nothing acted on the test run
    (``runner_tampering`` in ``flags``), else 0.0."""
    tests: dict[str, str] = field(default_factory=dict)
    """node id -> outcome ("passed", "failed", "error", "skipped", "xfailed", "missing", ...) for
    every graded test."""
    edited_tests: bool = False
    """The diff touched tests or test config (those edits were discarded)."""
    wall_s: float = 0.0
    timed_out: bool = False
    output_tail: str = ""
    cached: bool = False
    """Reused from an earlier grading of the same diff on the same task (``grade``)."""
    broke_test_run: bool = False
    """pytest could not run with the diff applied but runs on the task's base: the diff broke the
    test run itself (an import in a conftest.py, say), so every test counts as an error."""
    flags: tuple[str, ...] = ()
    """Monitors the grader raised: ``hacking.RUNNER_CHECKS`` names the diff tripped (their files
    were restored, their code scored 0), ``tests_not_run`` when a graded test never reported."""
    error: str = ""
    """Why there is no outcome to score (a verifier's missing or malformed reward file, with
    the diff applied): the 0 is the diff's doing, and the report says why."""
    metrics: dict[str, float] = field(default_factory=dict)
    """A verifier's reward.json keys besides ``reward``."""

    @property
    def passed(self) -> bool:
        return self.score == 1.0

    def details(self) -> Metadata:
        failed = sorted(t for t, o in self.tests.items() if o != "passed")
        return {"tests_score": self.score, "tests_total": len(self.tests),
                "tests_failed": len(failed), "failed_tests": " ".join(failed[:20]),
                "edited_tests": self.edited_tests, "grade_wall_s": round(self.wall_s, 3),
                "grade_timed_out": self.timed_out, "grade_cached": self.cached,
                "grade_broke_test_run": self.broke_test_run, "grade_flags": " ".join(self.flags),
                "grade_error": self.error, "grade_assertion": assertion_message(self.output_tail),
                **{f"verifier_{k}": v for k, v in sorted(self.metrics.items())}}


def assertion_message(output: str, limit: int = 240) -> str:
    """The first failure message of a pytest run (its ``E   `` lines), for hints.

    >>> assertion_message("x\\nE       assert 3 == 4\\nE        +  where 3 = f(1)\\n")
    'assert 3 == 4 / +  where 3 = f(1)'
    """
    lines = [ln[1:].strip() for ln in output.splitlines() if ln.startswith("E ")]
    return " / ".join(lines[:3])[:limit]


async def apply_diff(sb: Sandbox, diff: str, what: str) -> None:
    await sb.write(_PATCH_FILE, diff.encode())
    # git, else GNU patch, else (an image with busybox's patch: no --version, no --batch) plain -p1
    r = await sb.exec(f"git apply --whitespace=nowarn {_PATCH_FILE} || "
                      f"patch -p1 --batch --forward -s -i {_PATCH_FILE} || "
                      f"{{ ! patch --version >/dev/null 2>&1 && patch -p1 -i {_PATCH_FILE}; }}; "
                      f"s=$?; rm -f {_PATCH_FILE}; exit $s", timeout_s=60)
    if not r.ok:
        raise RewardError(f"the {what} does not apply to the task base (the grader cannot run): "
                          f"{(r.stderr or r.stdout)[-600:]}")


def _within(path: str, roots: set[str]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


@dataclass(frozen=True)
class GradedDiff:
    """What of an agent's diff the grader applies (``graded_diff``)."""

    text: str
    """The diff less every patch that touches a path graded as the base has it."""
    pristine: tuple[str, ...]
    """The paths graded as in the base: tests, test and runner config, shadowing modules."""
    unrecorded: tuple[str, ...]
    """Paths the diff says changed but holds no content for (over ``diffs.MAX_BLOB_BYTES``)."""


def graded_diff(task: Task, diff: str) -> GradedDiff:
    """The agent's diff as the grader applies it over the base: without the patches of any
    test, test config or runner-reachable path (``grader.test_files``, test paths,
    ``isolation.runner_paths``, ``isolation.shadowing_paths``), of anything below one (a test
    file turned into a directory) or of a file or link put in place of a directory holding one
    (``rm -rf tests && ln -s x tests``), so those are graded exactly as the base has them,
    whatever shape the workspace gave them; and without the patches that carry no content.

    Filtering the diff, rather than repairing the workspace after applying it, keeps grading
    to one ``git apply`` of patches the sandbox wrote, whatever the agent left.

    >>> from looprl.diffs import unified_diff
    >>> from looprl.types import Grader
    >>> t = Task("t", "/nonexistent", "p", Grader("pytest", test_files=("tests/test_m.py",)))
    >>> d = unified_diff("m.py", "a\\n", "b\\n") + unified_diff("tests/test_m.py", "x\\n", None)
    >>> g = graded_diff(t, d)
    >>> g.text == unified_diff("m.py", "a\\n", "b\\n"), g.pristine
    (True, ('tests/test_m.py',))
    """
    patches = parse_diff(diff)
    touched = {p for fp in patches for p in fp.paths}
    pristine = {*task.grader.test_files, *edited_test_paths(task, diff), *runner_paths(task, diff),
                *shadowing_paths(task, diff)}
    if task.grader.verifier is None:  # a verifier's tests are at /tests: the workspace's are work
        pristine |= {p for p in touched if is_test_path(p, task.grader.test_files)}
    kept, unrecorded = [], []
    for fp in patches:
        covers = fp.new_path is not None and any(r.startswith(fp.new_path + "/") for r in pristine)
        if covers or any(_within(p, pristine) for p in fp.paths):
            continue
        if fp.carried:
            kept.append(fp.text)
        else:
            unrecorded.append(fp.path)
    return GradedDiff("".join(kept), tuple(sorted(pristine & touched)), tuple(unrecorded))


async def _read_files(sb: Sandbox, paths: list[str]) -> dict[str, bytes]:
    """The bytes of those of ``paths`` that are files in ``sb``."""
    out = {}
    for p in paths:
        try:
            out[p] = await sb.read(p)
        except ToolError:
            continue  # a directory, or not there
    return out


def _targets(task: Task) -> list[str]:
    """The tests a grade runs: ``fail_to_pass`` then ``pass_to_pass``, each once."""
    return list(dict.fromkeys((*task.grader.fail_to_pass, *task.grader.pass_to_pass)))


async def grade_in(sb: Sandbox, task: Task, diff: str) -> GradeResult:
    """Grade ``diff`` in ``sb``, a fresh sandbox over ``task.repo`` (consumed: its files change)."""
    t0 = time.monotonic()
    g = task.grader
    targets = _targets(task)
    if not targets:
        raise RewardError(f"task {task.id} has no fail_to_pass/pass_to_pass tests; rebuild it")
    command = PytestCommand.parse(g.test_command)
    flags = runner_attempts(task, diff)
    graded = graded_diff(task, diff)
    if graded.unrecorded:
        flags += ("unrecorded_file",)
    if graded.text:
        await apply_diff(sb, graded.text, "agent's diff")
    if g.test_patch.strip():
        await apply_diff(sb, g.test_patch, "task's hidden test patch")
    watched = await _read_files(sb, sorted({*g.test_files, *touched_paths(g.test_patch)}))
    run = await run_isolated(sb, command, targets, timeout_s=g.timeout_s)
    assert run.report is not None
    status = run.report.status
    changed = await _read_files(sb, list(watched)) != watched  # test files changed during the run
    forged = status is not None and not run.report.intact  # someone else wrote to the report
    if (changed or forged) and "runner_tampering" not in flags:
        flags += ("runner_tampering",)
    # config pytest read that the agent changed: a name the grader did not know reached the run
    reached = set(run.report.config) & set(touched_paths(graded.text))
    if reached and "runner_config" not in flags:
        flags += ("runner_config",)
    if not run.timed_out and (status != run.exit_code or status in _GRADER_FAILURE_EXIT):
        how = (f"exit {run.exit_code}" if status == run.exit_code else f"exit {run.exit_code}, "
               f"the session {'never ended' if status is None else f'ended with {status}'}")
        raise _DidNotRun(f"pytest could not run the tests of task {task.id} ({how}); "
                               f"output tail:\n{run.output_tail[-1200:]}",
                               run.output_tail[-2000:], time.monotonic() - t0, flags)
    tests = {t: run.outcomes.get(t, "missing") for t in targets}
    if "missing" in tests.values() and not run.timed_out:
        flags += ("tests_not_run",)
    passed = all(o == "passed" for o in tests.values()) and not run.timed_out
    score = 1.0 if passed and "runner_tampering" not in flags and not reached else 0.0
    return GradeResult(score, tests, bool(edited_test_paths(task, diff)),
                       time.monotonic() - t0, run.timed_out, run.output_tail[-2000:], flags=flags)


GRADE_CACHE_SIZE = 4096
_grade_cache: OrderedDict[tuple[str, str, str, str], GradeResult] = OrderedDict()


def _cache_key(task: Task, diff: str) -> tuple[str, str, str, str]:
    grader = hashlib.sha256(task.grader.to_json().encode()).hexdigest()
    return task.id, task.repo, grader, hashlib.sha256(diff.encode()).hexdigest()


async def grade(task: Task, diff: str, *, cache: bool = True) -> GradeResult:
    """Grade ``diff`` against ``task`` in a fresh sandbox. Raises ``RewardError`` (infra).

    The same diff on the same task (repo and grader) is graded once per process: a group's
    rollouts often end with identical diffs (or none), and the tests were recorded passing
    twice, so a second run would say the same. A timed-out grading is never reused."""
    key = _cache_key(task, diff)
    if cache and key in _grade_cache:
        _grade_cache.move_to_end(key)
        return dataclasses.replace(_grade_cache[key], cached=True)
    try:
        g = await (_grade_by_eval(task, diff) if task.grader.eval is not None
                   else _grade_fresh(task, diff) if task.grader.verifier is None
                   else _grade_by_verifier(task, diff))
    except _DidNotRun as e:
        if not diff.strip():
            raise
        await grade(task, "", cache=cache)  # raises (infrastructure) if the base cannot run either
        g = GradeResult(0.0, dict.fromkeys(_targets(task), "error"), bool(edited_test_paths(task, diff)),
                        e.wall_s, output_tail=e.output_tail, broke_test_run=True,
                        flags=(*e.flags, "tests_not_run"), error=str(e).split("\n", 1)[0])
    if cache and not g.timed_out:
        _grade_cache[key] = g
        while len(_grade_cache) > GRADE_CACHE_SIZE:
            _grade_cache.popitem(last=False)
    return g


async def _grade_fresh(task: Task, diff: str) -> GradeResult:
    from looprl.sandbox import create_sandbox

    try:
        sb = await create_sandbox(task.repo, venv=task.venv, image=task.image)
    except SandboxError as e:
        raise RewardError(f"could not start a grading sandbox for {task.id}: {e}") from e
    try:
        return await grade_in(sb, task, diff)
    except (SandboxError, ToolError) as e:
        raise RewardError(f"grading {task.id} failed in the sandbox: {e}") from e
    finally:
        await sb.close()


async def _grade_by_verifier(task: Task, diff: str) -> GradeResult:
    """Grade ``diff`` by the task's verifier script (``rewards.verifier``): the graded diff (and
    the hidden test patch) applied in a fresh sandbox over the base, the workspace at the
    verifier's workdir, the pristine tests at /tests; the score is the reward file's."""
    from looprl.sandbox import create_sandbox

    t0 = time.monotonic()
    g = task.grader
    v = g.verifier
    assert v is not None
    flags = runner_attempts(task, diff)
    if reward_writes(diff) and "runner_tampering" not in flags:
        flags += ("runner_tampering",)
    graded = graded_diff(task, diff)
    if graded.unrecorded:
        flags += ("unrecorded_file",)
    outside = set(links_out(graded.text))
    if outside:
        flags += ("link_out_of_workspace",)
        graded = dataclasses.replace(graded, text="".join(
            fp.text for fp in parse_diff(graded.text) if fp.new_path not in outside))
    with verifier_logs() as logs:
        try:
            sb = await create_sandbox(task.repo, venv=v.venv or task.venv,
                                      workdir=v.workdir or None, mounts=verifier_mounts(v, logs),
                                      image=task.image)
        except SandboxError as e:
            raise RewardError(f"could not start a grading sandbox for {task.id}: {e}") from e
        try:
            if graded.text:
                await apply_diff(sb, graded.text, "agent's diff")
            if g.test_patch.strip():
                await apply_diff(sb, g.test_patch, "task's hidden test patch")
            res = await sb.exec(verifier_command(v), timeout_s=g.timeout_s, env=v.env)
        except (SandboxError, ToolError) as e:
            raise RewardError(f"grading {task.id} failed in the sandbox: {e}") from e
        finally:
            await sb.close()
        tail = output_tail(logs) or (res.stdout + res.stderr)[-2000:]
        try:
            reward = read_reward(logs)
        except RewardFileError as e:
            if res.timed_out:
                return GradeResult(0.0, {}, False, time.monotonic() - t0, True, tail,
                                   flags=flags, error=f"test.sh timed out after {g.timeout_s:g}s "
                                   f"before writing a reward ({e})")
            raise _DidNotRun(f"the verifier of task {task.id} gave no reward: {e} (test.sh "
                             f"exit {res.exit_code}); output tail:\n{tail[-1200:]}", tail,
                             time.monotonic() - t0, flags) from None
    score = 0.0 if "runner_tampering" in flags or res.timed_out else reward.score
    return GradeResult(score, {}, bool(edited_test_paths(task, diff)), time.monotonic() - t0,
                       res.timed_out, tail, flags=flags, metrics=reward.metrics)


async def _grade_by_eval(task: Task, diff: str) -> GradeResult:
    """Grade ``diff`` by the task's eval script (``rewards.evalscript``): the graded diff applied
    in a fresh sandbox over the base, the workspace at the script's workdir; the score is the
    family's rule on the statuses its log reports."""
    from looprl.sandbox import create_sandbox

    t0 = time.monotonic()
    g = task.grader
    e = g.eval
    assert e is not None
    flags = runner_attempts(task, diff)
    graded = graded_diff(task, diff)
    if graded.unrecorded:
        flags += ("unrecorded_file",)
    if status_writes(graded.text, _targets(task)) and "runner_tampering" not in flags:
        flags += ("runner_tampering",)
    with eval_dirs(e.script) as (script_dir, log_dir):
        try:
            sb = await create_sandbox(task.repo, venv=task.venv, workdir=e.workdir or None,
                                      mounts=eval_mounts(script_dir, log_dir), image=task.image)
        except SandboxError as err:
            raise RewardError(f"could not start a grading sandbox for {task.id}: {err}") from err
        try:
            if graded.text:
                await apply_diff(sb, graded.text, "agent's diff")
            res = await sb.exec(EVAL_COMMAND, timeout_s=g.timeout_s)
        except (SandboxError, ToolError) as err:
            raise RewardError(f"grading {task.id} failed in the sandbox: {err}") from err
        finally:
            await sb.close()
        log = read_log(log_dir)
    tail = log[-2000:]
    try:
        v, tests = judge(e, log, g.fail_to_pass, g.pass_to_pass)
    except (LogError, ValueError) as err:
        if res.timed_out:
            return GradeResult(0.0, {}, False, time.monotonic() - t0, True, tail, flags=flags,
                               error=f"the eval script timed out after {g.timeout_s:g}s ({err})")
        raise _DidNotRun(f"the eval script of task {task.id} graded nothing: {err} (exit "
                         f"{res.exit_code}); log tail:\n{tail[-1200:]}", tail,
                         time.monotonic() - t0, flags) from None
    if v.missing and "tests_not_run" not in flags:
        flags += ("tests_not_run",)
    score = 0.0 if "runner_tampering" in flags or res.timed_out else v.score
    return GradeResult(score, tests, bool(edited_test_paths(task, diff)), time.monotonic() - t0,
                       res.timed_out, tail, flags=flags)


def grade_sync(task: Task, diff: str) -> GradeResult:
    """``grade`` for synchronous callers (not from inside a running event loop)."""
    return asyncio.run(grade(task, diff))


def attach_grade(trajectory: Trajectory, g: GradeResult) -> Trajectory:
    """The trajectory with the grade's outcome recorded in its metadata."""
    return dataclasses.replace(trajectory, metadata={**trajectory.metadata, **g.details()})


def tests_reward(task: Task, trajectory: Trajectory) -> float | None:
    """The hidden-test score recorded by ``attach_grade``; None when ungraded or infra-failed.

    >>> from looprl.types import Counters, Grader, StopReason
    >>> t = Task("t", "/r", "fix", Grader("pytest", fail_to_pass=("a::b",)))
    >>> tr = Trajectory("t", "g", (), (), Counters(), StopReason.FINISHED)
    >>> tests_reward(t, tr) is None
    True
    >>> tests_reward(t, attach_grade(tr, GradeResult(1.0, {"a::b": "passed"})))
    1.0
    """
    if trajectory.is_infra_error or "tests_score" not in trajectory.metadata:
        return None
    return float(trajectory.metadata["tests_score"])  # type: ignore[arg-type]


tests_reward.__test__ = False  # type: ignore[attr-defined]  # a reward, not a pytest test
