"""Log parsers and grading contracts of the SWE-bench family, against logs of the shape their
harnesses write (an eval script run under ``set -x``, pytest ``-rA`` with colour, Django's
verbose runner, SymPy's ``bin/test``, R2E-Gym's ``run_tests.sh``)."""

from __future__ import annotations

import json

import pytest

from looprl.rewards.graded import verdict
from looprl.rewards.logparse import LogError, eval_output, parse_log, parser_name

# An eval script's log as SWE-bench's harness keeps it: `set -uxo pipefail` echoes each command
# (so the markers appear as `+ : '>>>>> Start Test Output'`), tests run with `pytest -rA`.
SWEBENCH_LOG = """\
+ source /opt/miniconda3/bin/activate
+ cd /testbed
+ git checkout 0a1b2c3 tests/test_core.py
Updated 1 path from 5d6e7f8
+ git apply -v -
Checking patch tests/test_core.py...
Applied patch tests/test_core.py cleanly.
+ : '>>>>> Start Test Output'
+ pytest -rA tests/test_core.py
============================= test session starts ==============================
collected 5 items

tests/test_core.py ..FsF                                                 [100%]

=================================== FAILURES ===================================
________________________________ test_plural ___________________________________
    def test_plural():
>       assert plural("ox") == "oxen"
E       AssertionError: assert 'oxs' == 'oxen'
=========================== short test summary info ============================
PASSED tests/test_core.py::test_singular
PASSED tests/test_core.py::test_camelize[hello_world-HelloWorld]
SKIPPED [1] tests/test_core.py:40: needs network
FAILED tests/test_core.py::test_plural - AssertionError: assert 'oxs' == 'oxen'
FAILED tests/test_core.py::test_ordinal[11] - assert '11st' == '11th'
XFAIL tests/test_core.py::test_known_bug - reason: upstream
==================== 2 failed, 2 passed, 1 skipped in 0.12s ====================
+ : '>>>>> End Test Output'
+ git checkout 0a1b2c3 tests/test_core.py
"""


def test_swebench_eval_log_reads_between_markers_and_grades_by_its_rule():
    st = parse_log("pytest", eval_output(SWEBENCH_LOG))
    assert st == {"tests/test_core.py::test_singular": "PASSED",
                  "tests/test_core.py::test_camelize[hello_world-HelloWorld]": "PASSED",
                  "tests/test_core.py::test_plural": "FAILED",
                  "tests/test_core.py::test_ordinal[11]": "FAILED",
                  "tests/test_core.py::test_known_bug": "XFAIL"}
    p2p = ["tests/test_core.py::test_singular", "tests/test_core.py::test_known_bug"]
    assert verdict("swebench", st, ["tests/test_core.py::test_camelize[hello_world-HelloWorld]"],
                   p2p).resolved
    v = verdict("swebench", st, ["tests/test_core.py::test_plural"], p2p)
    assert not v.resolved and v.failed == ("tests/test_core.py::test_plural",)


@pytest.mark.parametrize("marker", [">>>>> Patch Apply Failed", ">>>>> Tests Timed Out"])
def test_a_log_that_graded_nothing_is_an_error_not_a_status_map(marker):
    with pytest.raises(LogError, match="eval log says"):
        eval_output(SWEBENCH_LOG.replace("+ : '>>>>> End Test Output'", marker))
    with pytest.raises(LogError, match="no '>>>>> End Test Output'"):
        eval_output(SWEBENCH_LOG.split("+ : '>>>>> End")[0])


def test_pytest_v2_removes_colour_and_options_cut_absolute_paths():
    coloured = ("\x1b[32mPASSED\x1b[0m astropy/io/tests/test_fits.py::test_read\n"
                "\x1b[31mFAILED\x1b[0m astropy/io/tests/test_fits.py::test_write - OSError\n")
    assert parse_log("parse_log_pytest_v2", coloured) == {
        "astropy/io/tests/test_fits.py::test_read": "PASSED",
        "astropy/io/tests/test_fits.py::test_write": "FAILED"}
    assert parse_log("pytest", coloured) == {}  # the colour code hides the status word
    assert parse_log("pytest_options", "PASSED t.py::test_load[/testbed/data/a.dcm]") == {
        "t.py::test_load[/a.dcm]": "PASSED"}
    verbose = "tests/t.py::test_a PASSED                                 [ 50%]\n"
    assert parse_log("pytest", verbose) == {"tests/t.py::test_a": "PASSED"}


def test_django_and_sympy_runners():
    django = """\
test_default (forms_tests.tests.test_input.InputTests) ... ok
test_render (forms_tests.tests.test_input.InputTests) ... FAIL
test_slow (forms_tests.tests.test_input.InputTests) ... skipped 'slow'
test_noisy (forms_tests.tests.test_input.InputTests) ... System check identified no issues.
ok
======================================================================
ERROR: test_boom (forms_tests.tests.test_input.InputTests)
----------------------------------------------------------------------
"""
    st = parse_log("django", django)
    name = "test_{} (forms_tests.tests.test_input.InputTests)".format
    assert st == {name("default"): "PASSED", name("render"): "FAILED", name("slow"): "SKIPPED",
                  name("noisy"): "PASSED", name("boom"): "ERROR"}
    assert parser_name("", "django/django") == "django"
    sympy = "test_sqrt ok\ntest_pow F\ntest_exp E\n____ sympy/core/tests/test_power.py:test_pow ____\n"
    assert parse_log("sympy", sympy) == {"sympy/core/tests/test_power.py:test_pow": "FAILED",
                                         "test_sqrt": "PASSED", "test_pow": "FAILED",
                                         "test_exp": "ERROR"}
    with pytest.raises(LogError, match="not known; looprl reads: pytest"):
        parse_log("parse_log_cargo", "")


def test_swesmith_absent_test_trap():
    """SWE-smith's grader reads a test missing from the log as passed: a diff that breaks
    collection, so that nothing runs, would be resolved. looprl reads absent as failed."""
    broken = "ImportError while loading conftest '/testbed/tests/conftest.py'.\n"
    st = parse_log("pytest", eval_output(broken))
    f2p, p2p = ["tests/test_a.py::test_x"], ["tests/test_a.py::test_y"]
    assert st == {}
    assert verdict("swesmith_own", st, f2p, p2p).resolved  # the trap, as SWE-smith grades it
    v = verdict("swesmith", st, f2p, p2p)
    assert not v.resolved and v.missing == (*f2p, *p2p)
    # a skipped fail-to-pass test: left out of SWE-smith's count, failed here
    assert verdict("swesmith_own", {f2p[0]: "SKIPPED", p2p[0]: "PASSED"}, f2p, p2p).resolved
    assert not verdict("swesmith", {f2p[0]: "SKIPPED", p2p[0]: "PASSED"}, f2p, p2p).resolved


R2E_LOG = """\
============================= test session starts ==============================
r2e_tests/test_1.py::TestParse::test_empty PASSED                       [ 33%]
r2e_tests/test_1.py::TestParse::test_unicode FAILED                     [ 66%]
r2e_tests/test_1.py::test_roundtrip PASSED                              [100%]
=========================== short test summary info ============================
PASSED r2e_tests/test_1.py::TestParse::test_empty
PASSED r2e_tests/test_1.py::test_roundtrip
FAILED r2e_tests/test_1.py::TestParse::test_unicode - UnicodeDecodeError: 'ascii'
"""


def test_r2egym_exact_match_of_expected_output_json():
    st = parse_log("r2egym", R2E_LOG)
    assert st == {"TestParse.test_empty": "PASSED", "test_roundtrip": "PASSED",
                  "TestParse.test_unicode": "FAILED"}
    # expected_output_json as R2E-Gym rows hold it: a JSON string, a test expected to fail too
    expected = json.dumps({"TestParse.test_empty": "PASSED", "test_roundtrip": "PASSED",
                           "TestParse.test_unicode": "FAILED"})
    assert verdict("r2egym", st, expected=json.loads(expected)).resolved
    fixed_too_much = {**st, "TestParse.test_unicode": "PASSED"}  # an expected failure passes
    v = verdict("r2egym", fixed_too_much, expected=json.loads(expected))
    assert not v.resolved and v.failed == ("TestParse.test_unicode",)
    fewer = {k: s for k, s in st.items() if k != "test_roundtrip"}
    v = verdict("r2egym", fewer, expected=json.loads(expected))
    assert not v.resolved and v.missing == ("test_roundtrip",)
    with pytest.raises(ValueError, match="expected_output_json"):
        verdict("r2egym", st)
    with pytest.raises(ValueError, match="not known"):
        verdict("swebench-lite", st, ["x"])


def test_an_eval_scripts_log_is_judged_by_its_contract():
    from looprl.rewards.evalscript import judge, write_eval_script
    from looprl.types import EvalScript

    expected = {"TestParse.test_empty": "PASSED", "test_roundtrip": "PASSED",
                "TestParse.test_unicode": "FAILED"}
    v, tests = judge(EvalScript("", "r2egym", "r2egym", expected=expected), R2E_LOG, (), ())
    assert v.resolved and tests["TestParse.test_unicode"] == "failed"  # R2E-Gym logs: no markers
    with pytest.raises(LogError, match="no '>>>>> Start Test Output' marker"):
        judge(EvalScript("", "pytest", "swebench"), R2E_LOG, ["x"], [])
    f2p = ["tests/test_core.py::test_plural"]
    v, tests = judge(EvalScript("", "parse_log_pytest", "swebench"), SWEBENCH_LOG, f2p, [])
    assert not v.resolved and tests == {f2p[0]: "failed"}
    script = write_eval_script("python -m pytest", f2p, "--- a/t\n+++ b/t\n", "/testbed")
    assert "<<'EOF_LOOPRL_TEST_PATCH'\n--- a/t\n+++ b/t\nEOF_LOOPRL_TEST_PATCH\n" in script
