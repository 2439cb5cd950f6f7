"""A SWE-bench v5 row whose repository is only its image's (no clone offline): imported from the
image's /testbed, graded by its eval script in a container of the image, gold 1 and untouched 0,
and refused in one line where no engine runs it. The image is built here from a busybox root
filesystem (``tests.container_support``); skipped, with the reason, where no engine runs it."""

import asyncio

import pytest

from looprl.rewards.tests import grade
from looprl.sandbox import container
from looprl.tasks.swebench import import_swebench
from looprl.types import Image
from tests.container_support import BUGGY_CALC, SWEBENCH_FILES, SWEBENCH_IMAGE, engine_for

FIX = """\
--- a/calc.sh
+++ b/calc.sh
@@ -3,4 +3,4 @@
 case "$1" in
   min) if [ "$2" -lt "$3" ]; then echo "$2"; else echo "$3"; fi ;;
-  max) if [ "$2" -lt "$3" ]; then echo "$2"; else echo "$3"; fi ;;
+  max) if [ "$2" -gt "$3" ]; then echo "$2"; else echo "$3"; fi ;;
 esac
"""
EVAL = """#!/bin/bash
cd /testbed
echo '>>>>> Start Test Output'
check() {  # NAME OP A B WANT
  if [ "$(sh calc.sh "$2" "$3" "$4")" = "$5" ]; then echo "PASSED $1"; else echo "FAILED $1"; fi
}
check tests/test_calc.py::test_max max 3 5 5
check tests/test_calc.py::test_min min 3 5 3
echo '>>>>> End Test Output'
"""


def _row(**over):
    row = {"instance_id": "example__shcalc-1", "repo": "example/shcalc", "base_commit": "a" * 40,
           "patch": FIX, "test_patch": "", "problem_statement": "calc.sh max returns the minimum",
           "version": "0.1", "FAIL_TO_PASS": ["tests/test_calc.py::test_max"],
           "PASS_TO_PASS": ["tests/test_calc.py::test_min"], "eval_script": EVAL,
           "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail", "image": SWEBENCH_IMAGE}
    return {**row, **over}


def _import(tmp_path, row):
    import json

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return asyncio.run(import_swebench(path, tmp_path / "store"))


@pytest.mark.slow
def test_an_image_only_v5_row_runs_in_its_image(looprl_home, tmp_path):
    engine_for(SWEBENCH_IMAGE, SWEBENCH_FILES, "/testbed")
    report = _import(tmp_path, _row())
    assert report.skipped == []
    (t,) = report.tasks
    assert t.image == Image(SWEBENCH_IMAGE, "/testbed") and t.venv is None
    assert (tmp_path / "store" / t.id / "repo" / "calc.sh").read_text() == BUGGY_CALC
    assert t.grader.eval is not None and t.metadata["grading"] == "eval_script/pytest/swebench"
    g = asyncio.run(grade(t, t.gold_patch, cache=False))
    assert g.score == 1.0 and g.tests == {"tests/test_calc.py::test_max": "passed",
                                          "tests/test_calc.py::test_min": "passed"}
    assert asyncio.run(grade(t, "", cache=False)).score == 0.0


def test_where_no_engine_is_installed_the_row_is_skipped_in_one_line(looprl_home, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setattr(container, "_engines", lambda: [])
    container._probe.cache_clear()
    report = _import(tmp_path, _row())
    assert report.tasks == []
    ((where, why),) = report.skipped
    assert where == "example__shcalc-1" and why == (
        f"repository example/shcalc is only in image {SWEBENCH_IMAGE}, which cannot run here: "
        f"cannot run containers of {SWEBENCH_IMAGE}: no container engine installed (docker or "
        "podman)")
