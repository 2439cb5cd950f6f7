"""Test logs of the SWE-bench family read as per-test statuses: ``{test name: status}``.

    statuses = parse_log("pytest", eval_output(log))     # {'t.py::a': 'PASSED', ...}

The statuses are SWE-bench's vocabulary (``PASSED FAILED SKIPPED ERROR XFAIL``); what a test
name looks like is the parser's (pytest node ids, Django's ``test_x (module.Class)``, SymPy's
bare ``test_x``, R2E-Gym's ``Class.test_x``): rows name their tests the way their parser does.
The parsers, by the names rows use (SWE-bench v5's ``log_parser`` column; ``REPO_PARSERS`` for
rows that have none), written from SWE-bench's harness (``harness/log_parsers/python.py``) and
R2E-Gym's (``repo_analysis/execution_log_parser.py``), tested against logs of their shape in
``tests/rewards/test_logparse.py``:

- ``pytest``: ``-rA`` summary lines (``PASSED t.py::a``, ``FAILED t.py::b - msg``) and ``-v``
  lines (``t.py::a PASSED [ 50%]``); ``SKIPPED [2] t.py:4: reason`` summaries are no test.
- ``pytest_v2``: the same after colour codes and control characters are removed (astropy,
  scikit-learn, sphinx).
- ``pytest_options``: the same, a parameter that is an absolute path cut to its last part.
- ``django``: ``test_x (module.Class) ... ok|skipped|FAIL|ERROR`` and ``FAIL: test_x ...``.
- ``sympy``: ``test_x ok|F|E`` and ``___ path.py:test_x ___`` failure headers.
- ``r2egym``: the ``short test summary info`` section only, a test named by its parts after the
  file (``t.py::C::test_x`` -> ``C.test_x``).

``eval_output`` cuts a SWE-bench eval log to the part between its ``>>>>> Start Test Output``
and ``>>>>> End Test Output`` markers and raises ``LogError`` (one line) for a log that says the
patch did not apply, the reset failed, the tests errored or timed out.
"""

from __future__ import annotations

import re
from collections.abc import Callable

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
STATUSES = (FAILED, PASSED, SKIPPED, ERROR, XFAIL)

START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
BAD_MARKERS = {">>>>> Patch Apply Failed": "the patch did not apply",
               ">>>>> Reset Failed": "resetting the test files failed",
               ">>>>> Tests Errored": "the tests errored",
               ">>>>> Tests Timed Out": "the tests timed out"}
"""SWE-bench's eval-log markers (``harness/constants``): a log holding one grades nothing."""

Statuses = dict[str, str]

_ALT = "|".join(STATUSES)
_STATUS_FIRST = re.compile(rf"^({_ALT})\s+(\S+)")
_NAME_FIRST = re.compile(rf"^(\S+)\s+({_ALT})(?:\s|$)")
_SKIP_SUMMARY = re.compile(r"\[\d+\]")
_ANSI = re.compile(r"\x1b?\[[0-9;]*m")
_CONTROL = str.maketrans("", "", "".join(map(chr, range(1, 32))))


class LogError(ValueError):
    """The eval log grades nothing (the patch did not apply, no test output); one line."""


def eval_output(log: str, markers: bool = False) -> str:
    """The test part of an eval log (between SWE-bench's markers; the whole log when it has
    none, unless ``markers`` requires them). ``LogError`` for a log that says it graded nothing.

    >>> log = "PASSED t.py::old\\n>>>>> Start Test Output\\nPASSED t.py::a\\n>>>>> End Test Output\\n"
    >>> parse_pytest(eval_output(log))
    {'t.py::a': 'PASSED'}
    """
    for marker, why in BAD_MARKERS.items():
        if marker in log:
            raise LogError(f"the eval log says {why} ({marker!r})")
    start = log.find(START)
    end = log.find(END, start + 1 if start >= 0 else 0)
    if start < 0 and end < 0 and not markers:
        return log
    if start < 0 or end < 0:
        raise LogError(f"the eval log has no {START if start < 0 else END!r} marker: the test "
                       "command did not run (to its end)")
    return log[start + len(START):end]


def _line(line: str) -> tuple[str, str] | None:
    """(name, status) of one pytest result line, None for any other line."""
    m = _STATUS_FIRST.match(line)
    if m:
        status, name = m.groups()
        if status in (FAILED, ERROR):  # ``FAILED t.py::b - assert 1 == 2``: the name ends at " - "
            name = line[len(status):].strip().split(" - ", 1)[0].split()[0]
        if status == SKIPPED and _SKIP_SUMMARY.fullmatch(name):  # ``SKIPPED [2] t.py:4: why``
            return None
        return name, status
    m = _NAME_FIRST.match(line)
    return (m.group(1), m.group(2)) if m else None


def parse_pytest(log: str) -> Statuses:
    """pytest ``-rA`` / ``-v`` lines; a test reported twice keeps its last status.

    >>> parse_pytest("t.py::a PASSED [ 50%]\\nFAILED t.py::b - assert 1 == 2\\nSKIPPED [1] t.py:9: no")
    {'t.py::a': 'PASSED', 't.py::b': 'FAILED'}
    """
    out: Statuses = {}
    for line in log.splitlines():
        got = _line(line)
        if got:
            out[got[0]] = got[1]
    return out


def parse_pytest_v2(log: str) -> Statuses:
    """``parse_pytest`` after colour codes and control characters are removed.

    >>> parse_pytest_v2("\\x1b[32mPASSED\\x1b[0m t.py::a")
    {'t.py::a': 'PASSED'}
    """
    return parse_pytest("\n".join(_ANSI.sub("", ln).translate(_CONTROL) for ln in log.split("\n")))


def _option(name: str) -> str:
    m = re.fullmatch(r"(.*?)\[(.*)\]", name)
    if not m:
        return name
    base, opt = m.groups()
    if opt.startswith("/") and not opt.startswith("//") and "*" not in opt:
        opt = "/" + opt.rsplit("/", 1)[-1]  # the container's absolute path is not the test's name
    return f"{base}[{opt}]"


def parse_pytest_options(log: str) -> Statuses:
    """``parse_pytest``, a parameter that is an absolute path cut to its last part.

    >>> parse_pytest_options("PASSED t.py::a[/tmp/x/data.csv]")
    {'t.py::a[/data.csv]': 'PASSED'}
    """
    return {_option(k): v for k, v in parse_pytest(log).items()}


_DJANGO_END = ((" ... ok", PASSED), (" ... OK", PASSED), (" ...  OK", PASSED),
               (" ... FAIL", FAILED), (" ... ERROR", ERROR))


def parse_django(log: str) -> Statuses:
    """Django's verbose runner: ``name ... ok`` (``ok`` maybe on a later line), ``skipped``,
    ``FAIL``, ``ERROR``, and the ``FAIL: name`` / ``ERROR: name`` headers of the failure list.

    >>> parse_django("test_a (m.T) ... ok\\ntest_b (m.T) ... FAIL\\nFAIL: test_c (m.T)")
    {'test_a (m.T)': 'PASSED', 'test_b (m.T)': 'FAILED', 'test_c (m.T)': 'FAILED'}
    """
    out: Statuses = {}
    prev: str | None = None
    for raw in log.splitlines():
        line = raw.strip()
        if " ... " in line:
            prev = line.split(" ... ", 1)[0]
        for suffix, status in _DJANGO_END:
            if line.endswith(suffix):
                out[line[: -len(suffix)]] = status
                break
        else:
            if " ... skipped" in line:
                out[line.split(" ... skipped", 1)[0]] = SKIPPED
            elif line.startswith(("FAIL:", "ERROR:")) and len(line.split()) > 1:
                head, _, rest = line.partition(":")
                out[rest.strip()] = FAILED if head == "FAIL" else ERROR
            elif line == "ok" and prev is not None:  # the test printed between "..." and "ok"
                out[prev] = PASSED
    return out


def parse_sympy(log: str) -> Statuses:
    """SymPy's ``bin/test``: ``test_x ok|F|E`` lines and ``___ path.py:test_x ___`` headers.

    >>> parse_sympy("test_a ok\\ntest_b F\\n___ sympy/t.py:test_c ___")
    {'sympy/t.py:test_c': 'FAILED', 'test_a': 'PASSED', 'test_b': 'FAILED'}
    """
    out: Statuses = {f"{m[0]}.py:{m[1]}": FAILED
                     for m in re.findall(r"_+ (\S+)\.py:(\S+) _+", log)}
    for raw in log.splitlines():
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        for suffix, status in ((" ok", PASSED), (" F", FAILED), (" E", ERROR)):
            if line.endswith(suffix):
                out[line.split()[0]] = status
    return out


def parse_r2egym(log: str) -> Statuses:
    """R2E-Gym's reading of pytest: the ``short test summary info`` section only (nothing when
    the log has none), each test named by its parts after the file.

    >>> parse_r2egym("=== short test summary info ===\\nPASSED t.py::C::test_a\\nFAILED t.py::test_b - x")
    {'C.test_a': 'PASSED', 'test_b': 'FAILED'}
    """
    _, sep, summary = log.partition("short test summary info")
    out: Statuses = {}
    if not sep:
        return out
    for line in summary.strip().splitlines():
        for status in (PASSED, FAILED, ERROR):
            if status in line:
                out[".".join(line.split("::")[1:]).split(" - ")[0]] = status
                break
    return out


PARSERS: dict[str, Callable[[str], Statuses]] = {
    "pytest": parse_pytest, "pytest_v2": parse_pytest_v2, "pytest_options": parse_pytest_options,
    "django": parse_django, "sympy": parse_sympy, "r2egym": parse_r2egym,
}

REPO_PARSERS = {
    "astropy/astropy": "pytest_v2", "scikit-learn/scikit-learn": "pytest_v2",
    "sphinx-doc/sphinx": "pytest_v2", "django/django": "django", "sympy/sympy": "sympy",
    "psf/requests": "pytest_options", "pydicom/pydicom": "pytest_options",
    "pylint-dev/pylint": "pytest_options",
}
"""SWE-bench's Python repositories whose parser is not plain ``pytest`` (matplotlib's and
seaborn's read the same lines as ``pytest``)."""


def parser_name(name: str, repo: str = "") -> str:
    """The parser a row asks for: its ``log_parser`` (``parse_log_pytest`` and ``pytest`` both
    name ``pytest``), else its repository's, else ``pytest``. ``LogError`` for an unknown name.

    >>> parser_name("parse_log_django"), parser_name("", "sympy/sympy"), parser_name("", "a/b")
    ('django', 'sympy', 'pytest')
    """
    if not name:
        return REPO_PARSERS.get(repo, "pytest")
    short = name.removeprefix("parse_log_")
    if short not in PARSERS:
        raise LogError(f"log parser {name!r} is not known; looprl reads: {', '.join(PARSERS)}")
    return short


def parse_log(name: str, log: str) -> Statuses:
    """The statuses ``log`` reports, read by the parser ``name`` (``parser_name``)."""
    return PARSERS[parser_name(name)](log)
