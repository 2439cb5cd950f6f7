"""The eval-script grader kind: a script whose log grades the final workspace (SWE-bench v5's
``eval_script``, ``log_parser`` and resolution rule), run offline under the sandbox.

``rewards.tests.grade`` grades a task whose ``grader.eval`` is set with the pieces here:

    with eval_dirs(e.script) as (script_dir, log_dir):       # eval.sh, and a fresh log dir
        sb = await create_sandbox(task.repo, venv=..., workdir=e.workdir, image=task.image,
                                  mounts=eval_mounts(script_dir, log_dir))
        await sb.exec(EVAL_COMMAND, timeout_s=...)            # bash eval.sh > eval.log 2>&1
        v, tests = judge(e, read_log(log_dir), f2p, p2p)       # Verdict; LogError: graded nothing

The script runs over the graded diff (``tests.graded_diff``: test files as the base has them) in
a fresh copy-on-write sandbox, the workspace at ``workdir`` (``/testbed`` for SWE-bench rows);
the script itself applies the hidden tests and runs them between SWE-bench's markers. Its log is
cut to the markers (``logparse.eval_output``), read by the row's parser and judged by its
family's rule (``graded``). A log that says nothing was tested (no markers, the patch did not
apply, a timeout marker) is a ``LogError``: the caller decides whose fault it is, as for a
verifier's missing reward file.

What this does NOT protect against: the code under test writes to the same log as the test
runner, so it can print ``PASSED tests/t.py::test_x`` itself (SWE-bench's harness has the same
hole). ``status_writes`` flags a diff whose added lines name a graded test or a marker (scored 0
as ``runner_tampering``), not one that builds the line at run time.

``write_eval_script`` writes the script of a looprl task exported as a SWE-bench row.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from looprl.diffs import parse_diff
from looprl.rewards.graded import Verdict, verdict
from looprl.rewards.logparse import END, START, eval_output, parse_log
from looprl.sandbox.beneath import Root
from looprl.sandbox.mounts import Mount
from looprl.types import EvalScript

SCRIPT_AT, LOG_AT = "/looprl-eval", "/looprl-log"
EVAL_COMMAND = f"bash {SCRIPT_AT}/eval.sh > {LOG_AT}/eval.log 2>&1"
MAX_LOG_BYTES = 32 << 20
_STATUS_WORD = re.compile(r"\b(PASSED|FAILED|ERROR|XFAIL|SKIPPED|ok)\b")
_OUTCOME = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
            "XFAIL": "xfailed"}


@contextlib.contextmanager
def eval_dirs(script: str) -> Iterator[tuple[Path, Path]]:
    """(a directory holding ``eval.sh``, a fresh log directory the sandbox's user can write),
    under a private temporary parent; removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="looprl-eval-"))
    try:
        sdir, ldir = parent / "script", parent / "log"
        sdir.mkdir()
        (sdir / "eval.sh").write_text(script, encoding="utf-8")
        ldir.mkdir()
        ldir.chmod(0o777)
        yield sdir, ldir
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def eval_mounts(script_dir: Path, log_dir: Path) -> tuple[Mount, ...]:
    """The script read-only at ``SCRIPT_AT``, the log directory writable at ``LOG_AT``."""
    return (Mount(str(script_dir), SCRIPT_AT, readonly=True),
            Mount(str(log_dir), LOG_AT, readonly=False))


def read_log(log_dir: Path) -> str:
    """The script's log (its last ``MAX_LOG_BYTES``; '' when there is none or it is not a
    regular file), read without following links."""
    with Root(log_dir) as root:
        try:
            return root.read("eval.log", last=MAX_LOG_BYTES).decode("utf-8", "replace")
        except OSError:
            return ""


def judge(e: EvalScript, log: str, f2p: Sequence[str], p2p: Sequence[str]
          ) -> tuple[Verdict, dict[str, str]]:
    """(the contract's verdict, graded test -> outcome) of ``log``; ``LogError`` when the log
    says nothing was tested.

    >>> e = EvalScript("", contract="swesmith")
    >>> log = f"{START}\\nPASSED t.py::a\\n{END}\\n"
    >>> v, tests = judge(e, log, ["t.py::a", "t.py::b"], [])
    >>> v.resolved, tests
    (False, {'t.py::a': 'passed', 't.py::b': 'missing'})
    """
    # SWE-bench's scripts print markers around the tests; R2E-Gym's run_tests.sh prints none
    statuses = parse_log(e.log_parser, eval_output(log, markers=e.contract != "r2egym"))
    v = verdict(e.contract, statuses, f2p, p2p, e.expected if e.contract == "r2egym" else None)
    names = list(e.expected) if e.contract == "r2egym" else list(dict.fromkeys((*f2p, *p2p)))
    return v, {t: _OUTCOME.get(statuses[t], statuses[t].lower()) if t in statuses else "missing"
               for t in names}


def status_writes(diff: str, tests: Sequence[str]) -> tuple[str, ...]:
    """Lines the diff adds that hold a marker, or a graded test's name beside a status word:
    code of the workspace writing its own test statuses into the log (``runner_tampering``). A
    line naming a test without a status (``def test_sqrt``, a comment) is not one.

    >>> d = "--- a/m.py\\n+++ b/m.py\\n@@ -1 +1,2 @@\\n-x\\n+print('PASSED t.py::a')\\n+# t.py::a\\n"
    >>> status_writes(d, ["t.py::a"])
    ("print('PASSED t.py::a')",)
    """
    names = [t for t in tests if len(t) > 3]
    return tuple(ln for fp in parse_diff(diff) for ln in fp.added_lines
                 if ">>>>> " in ln or (_STATUS_WORD.search(ln) and any(n in ln for n in names)))


def write_eval_script(test_command: str, tests: Sequence[str], test_patch: str,
                      workdir: str) -> str:
    """The eval script of a looprl task exported as a SWE-bench row: into ``workdir``, apply
    the hidden test patch, run the graded tests with pytest's ``-rA`` summary between
    SWE-bench's markers (under ``set -x``, as SWE-bench's scripts are).

    >>> print(write_eval_script("python -m pytest -q", ["t.py::a"], "", "/testbed"))
    #!/bin/bash
    set -uxo pipefail
    cd /testbed
    : '>>>>> Start Test Output'
    python -m pytest -q -rA t.py::a
    : '>>>>> End Test Output'
    <BLANKLINE>
    """
    lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {shlex.quote(workdir)}"]
    if test_patch.strip():
        eof = "EOF_LOOPRL_TEST_PATCH"
        assert eof not in test_patch, "the test patch holds the heredoc's end marker"
        lines += [f"git apply --whitespace=nowarn - <<'{eof}'",
                  test_patch.rstrip("\n"), eof]
    lines += [f": '{START}'", f"{test_command} -rA {' '.join(map(shlex.quote, tests))}",
              f": '{END}'"]
    return "\n".join(lines) + "\n"
