"""Harbor task directories: the tasks written for these tests (``harbor_tasks/``) import, their
oracle scores 1 and the null policy 0 through the bench; refused features and malformed
task.toml files give one line each; looprl's own tasks export to Harbor directories and import
back with gold 1, untouched 0."""

import asyncio
import doctest
import random
import shutil
from pathlib import Path

import pytest

from looprl.bench.report import summarize
from looprl.bench.run import BenchSettings, run_bench
from looprl.errors import TaskError
from looprl.rewards.tests import grade
from looprl.tasks import harbor
from looprl.tasks.dockerfile import Unsupported
from looprl.tasks.harbor import export_harbor, import_harbor, read_harbor_dir
from tests.bwrap_support import skip_without_sandbox

TASKS = Path(__file__).parent / "harbor_tasks"
RUNNABLE = ("cli-csv-columns", "py-attrs-config", "py-inventory-feature", "py-median-bugfix",
            "py-slugify-metrics", "shell-word-counts")


@pytest.fixture(scope="module")
def imported(looprl_home, tmp_path_factory):
    store = tmp_path_factory.mktemp("harbor-store")
    return asyncio.run(import_harbor([TASKS], store, jobs=2))


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_the_test_tasks_import_and_the_oracle_scores_1_the_null_policy_0(imported):
    assert sorted(t.id for t in imported.tasks) == sorted(f"looprl-tests-{n}" for n in RUNNABLE)
    (refused,) = imported.skipped
    assert refused[0] == "multi-step-refused" and "[[steps]]: a multi-step task (2 steps)" in refused[1]
    by_id = {t.id: t for t in imported.tasks}
    attrs = by_id["looprl-tests-py-attrs-config"]
    assert attrs.grader.verifier.venv not in (None, attrs.venv)  # tests/Dockerfile: its own venv
    assert attrs.grader.verifier.env == {"CONFIG_STRICT": "1", "PYTHONUNBUFFERED": "1"}
    assert attrs.grader.verifier.workdir == "/app"
    assert any("ENV CONFIG_STRICT" in what for tid, what in imported.notes if tid == attrs.id)
    settings = BenchSettings(concurrency=2, max_turns=10)
    for policy, want in (("oracle", 1.0), ("null", 0.0)):
        samples = run_bench(imported.tasks, policy, 1, settings)
        rep = summarize(samples, 1, policy=policy, tasks_file="harbor")
        assert rep["infra_errors"] == 0
        assert {tid: r["pass@1"] for tid, r in rep["per_task"].items()} == dict.fromkeys(by_id, want)
    metrics = asyncio.run(grade(by_id["looprl-tests-py-slugify-metrics"],
                                by_id["looprl-tests-py-slugify-metrics"].gold_patch))
    assert metrics.metrics == {"cases_passed": 6.0, "cases_total": 6.0}


def _task_dir(tmp_path: Path, toml: str, **files: str) -> Path:
    d = tmp_path / "t"
    shutil.copytree(TASKS / "py-median-bugfix", d)
    (d / "task.toml").write_text(toml)
    for rel, text in files.items():
        p = d / rel.replace("__", "/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return d


@pytest.mark.parametrize("toml, says", [
    ("schema_version = 1.4", "schema_version must be a string"),
    ('schema_version = "2.0"', "schema_version 2.0 is not 1.x"),
    ("[verifier]\ntimeout_sec = 'ten'", "verifier.timeout_sec must be a number"),
    ("[verifier]\ntimeout_sec = -5", "verifier.timeout_sec must be positive"),
    ("[verifier]\nenv = { A = 1 }", "verifier.env must be a table of strings"),
    ("verifier = 3", "[verifier] must be a table"),
    ("[environment]\nmemory_mb = 1.5", "environment.memory_mb must be an integer"),
    ("[task]\nname = ['x']", "task.name must be a string"),
    ("[task\nname = 'x'", "not valid TOML"),
    ("x = \"\\q\"", "not valid TOML"),
])
def test_a_malformed_task_toml_is_one_line_naming_the_field(tmp_path, toml, says):
    d = _task_dir(tmp_path, toml)
    with pytest.raises(TaskError) as e:
        read_harbor_dir(d)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert not isinstance(e.value, Unsupported)


@pytest.mark.parametrize("toml, files, says", [
    ('[[steps]]\nname = "a"', {}, "[[steps]]: a multi-step task (1 steps)"),
    ('[environment]\ndocker_image = "ghcr.io/x/y:1"', {}, "docker_image = 'ghcr.io/x/y:1'"),
    ("[environment]\ngpus = 1", {}, "[environment].gpus = 1: the sandbox has no accelerators"),
    ('[environment]\nos = "windows"', {}, "os = 'windows'"),
    ('[[environment.mcp_servers]]\nname = "search"\nurl = "http://x"', {},
     "mcp_servers (search): MCP servers are services"),
    ('[environment.healthcheck]\ncommand = "curl localhost"', {}, "healthcheck"),
    ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]', {},
     "network allowlist (pypi.org)"),
    ('[verifier.env]\nOPENAI_API_KEY = "${OPENAI_API_KEY}"', {},
     "[verifier].env.OPENAI_API_KEY = '${OPENAI_API_KEY}' takes a variable from the host"),
    ('[verifier.environment]\ndocker_image = "judge:1"', {}, "a separate verifier container"),
    ("", {"environment__docker-compose.yaml": "services: {}\n"},
     "environment/docker-compose.yaml: a multi-container environment"),
    ("", {"environment__Dockerfile": "FROM python:3.11\nWORKDIR /app\nEXPOSE 80\n"},
     "Dockerfile:3: EXPOSE 80: EXPOSE is not realised"),
])
def test_each_refused_feature_is_one_line_naming_it(tmp_path, looprl_home, toml, files, says):
    d = _task_dir(tmp_path, toml, **files)
    report = asyncio.run(import_harbor([d], tmp_path / "store"))
    assert report.tasks == []
    ((source, why),) = report.skipped
    assert source == "t" and why.startswith("refused: ") and says in why, why
    assert "\n" not in why


def test_without_a_solution_or_tests_the_task_is_refused_or_invalid(tmp_path):
    d = _task_dir(tmp_path, "")
    (d / "solution" / "solve.sh").unlink()
    with pytest.raises(Unsupported, match="no solution/solve.sh"):
        read_harbor_dir(d)
    (d / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match="no tests/test.sh"):
        read_harbor_dir(d)


def test_fuzzed_task_tomls_give_one_line_errors_or_read(tmp_path):
    """Random byte edits of a real task.toml: each reads, or fails with one TaskError line."""
    base = (TASKS / "py-attrs-config" / "task.toml").read_bytes()
    d = _task_dir(tmp_path, "")
    rng = random.Random(50)
    outcomes = {"read": 0, "error": 0}
    for _ in range(300):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            data[i:i + rng.randint(0, 3)] = bytes(rng.choice(b"=[]\"'{},.\n 0x#\\-") for _ in
                                                  range(rng.randint(0, 2)))
        (d / "task.toml").write_bytes(bytes(data))
        try:
            read_harbor_dir(d)
            outcomes["read"] += 1
        except TaskError as e:
            assert "\n" not in str(e), str(e)
            outcomes["error"] += 1
    assert outcomes["error"] > 50 and outcomes["read"] > 5, outcomes


def test_canary_lines_are_stripped_from_the_instruction():
    h = read_harbor_dir(TASKS / "py-median-bugfix")
    assert h.instruction.startswith("`median()`") and "canary" not in h.instruction


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_a_looprl_task_exports_to_harbor_and_imports_back(tmp_path, lean_task):
    written, skipped = export_harbor([lean_task], tmp_path / "out")
    assert skipped == [] and [p.name for p in written] == [lean_task.id]
    d = written[0]
    for rel in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh",
                "solution/solve.sh", "solution/gold.patch"):
        assert (d / rel).is_file(), rel
    dockerfile = (d / "environment" / "Dockerfile").read_text()
    assert "pytest==" in dockerfile and "COPY repo/ /app/" in dockerfile
    report = asyncio.run(import_harbor([tmp_path / "out"], tmp_path / "store"))
    assert report.skipped == [], report.skipped
    (back,) = report.tasks
    assert back.prompt.strip() == lean_task.prompt.strip()
    assert back.metadata["package"] == lean_task.metadata["package"]
    assert asyncio.run(grade(back, back.gold_patch, cache=False)).score == 1.0
    assert asyncio.run(grade(back, "", cache=False)).score == 0.0
    assert asyncio.run(grade(back, lean_task.gold_patch, cache=False)).score == 1.0


def test_the_doctests_run():
    assert doctest.testmod(harbor).failed == 0
