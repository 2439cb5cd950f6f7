"""SWE-bench-family rows: the flavours map onto looprl tasks graded by the real pytest grader
(SWE-bench's JSON-string test lists read from parquet as SWE-bench ships them; SWE-smith's
bug-introducing patch reversed, and a test absent from the run counted failed, not passed as
SWE-smith's own grader counts it); rows that cannot be realised offline or are malformed give
one line each; looprl tasks export to rows and import back."""

import asyncio
import doctest
import json
import random
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from looprl.diffs import unified_diff
from looprl.errors import TaskError
from looprl.rewards.tests import grade
from looprl.tasks import swebench
from looprl.tasks.swebench import export_swebench, import_swebench, parse_row
from tests.bwrap_support import skip_without_sandbox
from tests.example_package import write_example_package
from tests.rewards.minicalc import CLAMP_TESTS, CORE, MEAN

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": "/tmp"}
HIDDEN = "tests/test_hidden.py::test_clamp_above"


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def clones(tmp_path_factory):
    """A directory of clones: example/minicalc with a clean commit and a buggy one."""
    root = tmp_path_factory.mktemp("clones")
    repo = write_example_package(root / "example__minicalc")
    (repo / "tests" / "test_later.py").write_text(
        "import pytest\n\n\n@pytest.mark.skip(reason='later')\ndef test_clamp_later():\n"
        "    pass\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "clean")
    clean = _git(repo, "rev-parse", "HEAD")
    core = repo / CORE
    original = core.read_text()
    core.write_text(original.replace("if x > hi:", "if x < hi:"))
    _git(repo, "commit", "-qam", "bug")
    buggy = _git(repo, "rev-parse", "HEAD")
    fix = unified_diff(CORE, core.read_text(), original)
    bug = unified_diff(CORE, original, core.read_text())
    hidden = unified_diff("tests/test_hidden.py", None,
                          "from minicalc.core import clamp\n\n\ndef test_clamp_above():\n"
                          "    assert clamp(99, 0, 10) == 10\n")
    return {"dir": root, "clean": clean, "buggy": buggy, "fix": fix, "bug": bug, "hidden": hidden}


def swebench_row(c, **over):
    row = {"instance_id": "example__minicalc-1", "repo": "example/minicalc",
           "base_commit": c["buggy"], "environment_setup_commit": c["buggy"], "patch": c["fix"],
           "test_patch": c["hidden"], "problem_statement": "clamp ignores the upper bound",
           "hints_text": "", "version": "0.1",
           "FAIL_TO_PASS": json.dumps([*CLAMP_TESTS[1:], HIDDEN]),
           "PASS_TO_PASS": json.dumps([CLAMP_TESTS[0], *MEAN])}
    return {**row, **over}


def swesmith_row(c, **over):
    row = {"instance_id": "example__minicalc.clean.func_pm_flip__x1", "repo":
           f"swesmith/example__minicalc.{c['clean'][:8]}", "patch": c["bug"],
           "problem_statement": "clamp is broken", "image_name": "swesmith/example:latest",
           "FAIL_TO_PASS": list(CLAMP_TESTS[1:]), "PASS_TO_PASS": [CLAMP_TESTS[0], *MEAN]}
    return {**row, **over}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_swebench_json_string_lists_and_plain_lists_read_alike(clones):
    a = parse_row(swebench_row(clones), "r:1")
    b = parse_row({**swebench_row(clones), "FAIL_TO_PASS": json.loads(
        swebench_row(clones)["FAIL_TO_PASS"])}, "r:2")
    assert a.fail_to_pass == b.fail_to_pass == (*CLAMP_TESTS[1:], HIDDEN)
    assert (a.flavour, parse_row(swesmith_row(clones), "r:3").flavour) == ("swebench", "swesmith")
    gym = {k: v for k, v in swebench_row(clones, FAIL_TO_PASS=list(CLAMP_TESTS)).items()
           if k != "environment_setup_commit"}
    assert parse_row(gym, "r:4").flavour == "swegym"


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_each_flavour_imports_from_parquet_and_jsonl_and_grades(looprl_home, clones, tmp_path):
    rows = [swebench_row(clones),
            {k: v for k, v in swebench_row(clones, instance_id="gym-1",
                                           FAIL_TO_PASS=[*CLAMP_TESTS[1:], HIDDEN],
                                           PASS_TO_PASS=[CLAMP_TESTS[0]]).items()
             if k != "environment_setup_commit"},
            swesmith_row(clones)]
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "bench.parquet")
    for path in (tmp_path / "bench.parquet", _write(tmp_path / "rows.jsonl", rows[1:])):
        report = asyncio.run(import_swebench(path, tmp_path / "store", repos=clones["dir"]))
        assert report.skipped == [], report.skipped
        for t in report.tasks:
            assert asyncio.run(grade(t, t.gold_patch, cache=False)).score == 1.0
            assert asyncio.run(grade(t, "", cache=False)).score == 0.0
        kinds = {t.metadata["source_kind"] for t in report.tasks}
        assert kinds <= {"swebench", "swegym", "swesmith"}
        for t in report.tasks:
            if t.metadata["source_kind"] == "swesmith":
                # the row's patch made the bug: the task starts buggy, the gold is its reverse
                assert "if x < hi:" in (tmp_path / "store" / t.id / "repo" / CORE).read_text()
                assert t.gold_patch.strip() == clones["fix"].strip()
                assert t.grader.test_patch == ""
            else:
                assert HIDDEN in t.grader.fail_to_pass and t.grader.test_patch == clones["hidden"]


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_a_test_absent_from_the_run_counts_failed_not_passed(looprl_home, clones, tmp_path):
    """SWE-smith's grader counts a FAIL_TO_PASS test missing from the log as passed (and, like
    SWE-bench's, leaves a skipped one out of the count): such a row would be 'resolved' by its
    gold patch. Here every graded test must be reported passed: the row is not imported."""
    ghost, skipped = "tests/test_core.py::test_clamp_ghost", "tests/test_later.py::test_clamp_later"
    rows = [swesmith_row(clones, instance_id="absent", FAIL_TO_PASS=[*CLAMP_TESTS[1:], ghost]),
            swesmith_row(clones, instance_id="skipped", FAIL_TO_PASS=[*CLAMP_TESTS[1:], skipped])]
    report = asyncio.run(import_swebench(_write(tmp_path / "r.jsonl", rows), tmp_path / "s",
                                         repos=clones["dir"]))
    assert report.tasks == []
    why = dict(report.skipped)
    assert "could not be graded" in why["absent"] and "test_clamp_ghost" in why["absent"]
    assert "its gold solution scores 0, not 1" in why["skipped"]
    assert list((tmp_path / "s").iterdir()) == []  # a row not imported leaves no files
    ok = asyncio.run(import_swebench(_write(tmp_path / "ok.jsonl", [swesmith_row(clones)]),
                                     tmp_path / "s2", repos=clones["dir"])).tasks[0]
    g = asyncio.run(grade(replace(ok, grader=replace(ok.grader, fail_to_pass=(
        *ok.grader.fail_to_pass, skipped))), ok.gold_patch, cache=False))
    assert g.score == 0.0 and g.tests[skipped] == "skipped"


@pytest.mark.parametrize("change, says", [
    ({"FAIL_TO_PASS": "[not json"}, "field FAIL_TO_PASS is a string but not JSON"),
    ({"FAIL_TO_PASS": json.dumps([1, 2])}, "field FAIL_TO_PASS must be a list of test ids"),
    ({"FAIL_TO_PASS": "[]"}, "field FAIL_TO_PASS is empty"),
    ({"PASS_TO_PASS": 3}, "field PASS_TO_PASS must be a list"),
    ({"repo": "just-a-name"}, "field repo must be OWNER/NAME"),
    ({"base_commit": "main"}, "field base_commit must be a commit hash"),
    ({"patch": None}, "field patch must be a non-empty string"),
    ({"instance_id": 7}, "field instance_id must be a non-empty string"),
    ({"looprl": "{"}, "field looprl is not JSON"),
    ({"log_parser": "parse_log_cargo"}, "field log_parser: log parser 'parse_log_cargo' is not known"),
    ({"eval_type": "lenient"}, "field eval_type must be pass_and_fail or fail_only"),
    ({"eval_script": ["cd /testbed"]}, "field eval_script must be a string"),
])
def test_malformed_rows_are_one_line_naming_row_and_field(clones, tmp_path, change, says):
    path = _write(tmp_path / "r.jsonl", [swebench_row(clones, **change)])
    report = asyncio.run(import_swebench(path, tmp_path / "s", repos=clones["dir"]))
    ((where, why),) = report.skipped
    assert where == "r.jsonl:1" and says in why and "\n" not in why


def test_rows_that_cannot_be_realised_offline_say_why_in_one_line(clones, tmp_path):
    rows = [swebench_row(clones, instance_id="no-clone", repo="django/django"),
            swebench_row(clones, instance_id="django-ids", FAIL_TO_PASS=json.dumps(
                ["test_foo (admin_views.tests.AdminViewTests)"])),
            swesmith_row(clones, instance_id="image-only", repo="swesmith/a__b.1234abcd")]
    path = _write(tmp_path / "r.jsonl", [*rows, "not json"])
    path.write_text(path.read_text().replace('"not json"', "{not json"))
    report = asyncio.run(import_swebench(path, tmp_path / "s", repos=clones["dir"]))
    why = dict(report.skipped)
    assert "repository django/django@" in why["no-clone"] and "DIR/django__django" in why["no-clone"]
    assert "not pytest node ids" in why["django-ids"]
    assert "run its image swesmith/example:latest" in why["image-only"]
    assert "not valid JSON" in why["r.jsonl:4"]
    assert all("\n" not in w for w in why.values())


def test_fuzzed_rows_give_one_line_errors(clones):
    rng = random.Random(50)
    base = swebench_row(clones)
    values = [None, 0, -1.5, True, "", "x", [], {}, [1], ["a::b"], "[\"a\"]", "a/b", "deadbeef"]
    for _ in range(400):
        row = dict(base)
        for key in rng.sample(sorted(row), rng.randint(1, 3)):
            if rng.random() < 0.3:
                row.pop(key)
            else:
                row[key] = rng.choice(values)
        try:
            parse_row(row, "f:1")
        except TaskError as e:
            assert "\n" not in str(e) and str(e).startswith("f:1: field "), str(e)


def test_fuzzed_v5_and_r2egym_rows_give_one_line_errors(clones):
    rng = random.Random(51)
    v5 = swebench_row(clones, eval_script=v5_script(clones), log_parser="parse_log_pytest",
                      eval_type="pass_and_fail", image="swebench/sweb.eval.x86_64.a:latest")
    r2e = {"repo_name": "pandas", "commit_hash": "a" * 40, "docker_image": "r2e/pandas:1",
           "problem_statement": "x", "expected_output_json": '{"test_a": "PASSED"}'}
    values = [None, 0, True, "", "x", [], {}, ["a"], "{}", '{"t": 1}', "fail_only", "django"]
    for base in (v5, r2e):
        for _ in range(300):
            row = dict(base)
            for key in rng.sample(sorted(row), rng.randint(1, 3)):
                row[key] = rng.choice(values)
            try:
                parse_row(row, "f:1")
            except TaskError as e:
                assert "\n" not in str(e) and str(e).startswith("f:1: "), str(e)
    with pytest.raises(TaskError, match="^f:1: an R2E-Gym row"):
        parse_row(r2e, "f:1")


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_a_looprl_task_exports_to_a_row_and_imports_back(lean_task, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path, as on a command line
    n, skipped, repos = export_swebench([lean_task], Path("rows.parquet"))
    assert (n, skipped) == (1, [])
    (row,) = pq.read_table(tmp_path / "rows.parquet").to_pylist()
    assert json.loads(row["FAIL_TO_PASS"]) == list(lean_task.grader.fail_to_pass)
    assert row["repo"] == "looprl/minicalc" and (repos / "looprl__minicalc.git").is_dir()
    report = asyncio.run(import_swebench(tmp_path / "rows.parquet", tmp_path / "store",
                                         repos=repos))
    assert report.skipped == [], report.skipped
    (back,) = report.tasks
    assert back.grader.test_command == lean_task.grader.test_command
    assert asyncio.run(grade(back, lean_task.gold_patch, cache=False)).score == 1.0
    assert asyncio.run(grade(back, "", cache=False)).score == 0.0
    shutil.rmtree(tmp_path / "store")


def v5_script(c):
    """An eval script of SWE-bench v5's shape (conda, ``git checkout`` of the test files, the
    test patch as a heredoc, the markers under ``set -x``): offline the first three lines fail
    harmlessly (no conda, the workspace is no git repository) and the rest runs."""
    return ("#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\n"
            "conda activate testbed\ncd /testbed\ngit checkout " + c["buggy"] +
            " tests/test_core.py\ngit apply -v - <<'EOF_114329324912'\n" + c["hidden"] +
            "EOF_114329324912\n: '>>>>> Start Test Output'\nPYTHONPATH=src python -m pytest -rA "
            "tests/test_core.py tests/test_hidden.py\n: '>>>>> End Test Output'\n"
            "git checkout " + c["buggy"] + " tests/test_core.py\n")


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_a_v5_row_is_graded_by_its_eval_script_log(looprl_home, clones, tmp_path):
    rows = [swebench_row(clones, instance_id="v5-1", eval_script=v5_script(clones),
                         log_parser="parse_log_pytest", eval_type="pass_and_fail",
                         image="swebench/sweb.eval.x86_64.example_1776_minicalc-1:latest"),
            swebench_row(clones, instance_id="v5-nolog", eval_script="cd /testbed\n")]
    report = asyncio.run(import_swebench(_write(tmp_path / "v5.jsonl", rows), tmp_path / "s",
                                         repos=clones["dir"]))
    (t,) = report.tasks
    assert t.grader.eval is not None and t.grader.eval.contract == "swebench"
    assert t.grader.test_patch == "" and t.metadata["grading"] == "eval_script/pytest/swebench"
    g = asyncio.run(grade(t, t.gold_patch, cache=False))
    assert g.score == 1.0 and g.tests[HIDDEN] == "passed"
    g = asyncio.run(grade(t, "", cache=False))
    assert g.score == 0.0 and g.tests[HIDDEN] == "failed"
    # a diff that prints a graded test's status into the log scores 0, whatever the log says
    forge = clones["fix"] + unified_diff("src/minicalc/extra.py", None,
                                         f"print('PASSED {HIDDEN}')\n")
    assert asyncio.run(grade(t, forge, cache=False)).flags.count("runner_tampering") == 1
    ((_, why),) = report.skipped  # a script whose log has no test output is skipped, one line
    assert "could not be graded" in why or "graded nothing" in why, why
    assert "\n" not in why


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_a_looprl_task_round_trips_graded_by_its_exported_eval_script(lean_task, tmp_path):
    n, _, repos = export_swebench([lean_task], tmp_path / "rows.jsonl")
    (row,) = [json.loads(ln) for ln in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert row["log_parser"] == "parse_log_pytest" and ">>>>> Start Test Output" in row["eval_script"]
    report = asyncio.run(import_swebench(tmp_path / "rows.jsonl", tmp_path / "store",
                                         repos=repos, grade_by="eval_script"))
    (back,) = report.tasks
    assert back.grader.eval is not None
    assert asyncio.run(grade(back, lean_task.gold_patch, cache=False)).score == 1.0
    assert asyncio.run(grade(back, "", cache=False)).score == 0.0
    auto = asyncio.run(import_swebench(tmp_path / "rows.jsonl", tmp_path / "store2", repos=repos))
    assert auto.tasks[0].grader.eval is None  # a row with looprl's column: its pytest grader


def test_an_r2egym_row_is_refused_in_one_line_naming_its_image(tmp_path):
    row = {"repo_name": "pandas", "commit_hash": "a" * 40,
           "docker_image": "namanjain12/pandas_final:a1b2", "problem_statement": "x",
           "expected_output_json": json.dumps({"TestA.test_x": "PASSED", "test_y": "FAILED"})}
    bad = {**row, "expected_output_json": "{nope"}
    report = asyncio.run(import_swebench(_write(tmp_path / "r2e.jsonl", [row, bad]),
                                         tmp_path / "s"))
    why = dict(report.skipped)
    assert "ship only inside namanjain12/pandas_final:a1b2" in why["r2e.jsonl:1"]
    assert "2 expected statuses" in why["r2e.jsonl:1"]
    assert "field expected_output_json is not JSON" in why["r2e.jsonl:2"]
    assert all("\n" not in w for w in why.values())


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_a_file_with_bad_rows_imports_the_rest_and_names_the_bad(looprl_home, clones, tmp_path):
    rows = [swebench_row(clones, instance_id=f"ok-{i}") for i in range(12)]
    rows[3] = swebench_row(clones, instance_id="bad-lists", FAIL_TO_PASS="[oops")
    rows[7] = swebench_row(clones, instance_id="bad-commit", base_commit="f" * 40)
    rows[10] = swebench_row(clones, instance_id="bad-parser", log_parser="nope")
    report = asyncio.run(import_swebench(_write(tmp_path / "many.jsonl", rows), tmp_path / "s",
                                         repos=clones["dir"]))
    assert len(report.tasks) == 9
    why = dict(report.skipped)
    assert sorted(why) == ["bad-commit", "many.jsonl:11", "many.jsonl:4"]
    assert "not in" in why["bad-commit"] and "log_parser" in why["many.jsonl:11"]


def test_the_doctests_run():
    assert doctest.testmod(swebench).failed == 0
