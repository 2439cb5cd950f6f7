import pytest

from looprl.errors import TaskError
from looprl.tasks import sources
from tests.example_package import write_example_package


def test_layout_of_src_package(tmp_path):
    repo = write_example_package(tmp_path / "m")
    (repo / "docs").mkdir()
    (repo / "docs" / "conf.py").write_text("x = 1\n")
    (repo / "setup.py").write_text("")
    pythonpath, targets, test_files, srcs = sources.find_layout(repo)
    assert pythonpath == "src"
    assert targets == ("tests",)
    assert test_files == ("pyproject.toml", "tests/test_core.py")
    assert srcs == ("src/minicalc/__init__.py", "src/minicalc/core.py")


def test_layout_of_flat_package_with_inner_tests(tmp_path):
    (tmp_path / "pkg" / "tests").mkdir(parents=True)
    for f in ("pkg/__init__.py", "pkg/a.py", "pkg/tests/__init__.py", "pkg/tests/test_a.py",
              "single.py", "test_single.py", "conftest.py"):
        (tmp_path / f).write_text("")
    pythonpath, targets, test_files, srcs = sources.find_layout(tmp_path)
    assert pythonpath == "."
    assert set(targets) == {"pkg/tests", "test_single.py"}
    assert "conftest.py" in test_files and "pkg/tests/test_a.py" in test_files
    assert srcs == ("pkg/__init__.py", "pkg/a.py", "single.py")


def test_dependencies_from_metadata_extras_and_groups(tmp_path):
    (tmp_path / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: demo\nVersion: 1\n"
        "Requires-Dist: six>=1.0\n"
        "Requires-Dist: hypothesis; extra == \"tests\"\n"
        "Requires-Dist: sphinx; extra == \"docs\"\n"
        "Requires-Dist: pytest-cov; extra == \"tests\"\n"
        "Requires-Dist: demo[tests]; extra == \"dev\"\n"
        "Requires-Dist: tomli; python_version < \"3.0\"\n")
    (tmp_path / "pyproject.toml").write_text(
        '[dependency-groups]\ntest = ["freezegun>=1"]\ndev = ["mypy"]\n')
    deps = sources.infer_dependencies(tmp_path, "demo")
    assert deps == ["six>=1.0", "hypothesis", "freezegun>=1"]


def test_record_snapshot_records_stable_passing_tests(example_snapshot):
    s = example_snapshot
    assert len(s.passing_tests) == 14
    assert "tests/test_core.py::test_is_sorted[xs1]" in s.passing_tests
    assert s.test_command.startswith("COLUMNS=240") and "PYTHONPATH=src" in s.test_command


def test_rejects_a_package_whose_tests_fail(tmp_path, looprl_home):
    import asyncio
    import sys
    from pathlib import Path

    repo = write_example_package(tmp_path / "broken")
    core = repo / "src" / "minicalc" / "core.py"
    core.write_text(core.read_text().replace("return total / len(values)", "return 0"))
    core.write_text(core.read_text().replace("return sep.join(parts)", "return 1/0"))
    core.write_text(core.read_text().replace("out.append(acc)", "pass"))
    with pytest.raises(TaskError, match="only 9 of 14 tests pass offline"):
        asyncio.run(sources.record_snapshot("broken", "0", "x", repo, Path(sys.prefix), runs=1))


@pytest.mark.slow
def test_fetch_real_package_from_pypi(looprl_home):
    snap = sources.fetch_package("inflection==0.5.1")
    assert snap.source_files == ("inflection/__init__.py",)
    assert len(snap.passing_tests) > 400
    again = sources.fetch_package("inflection==0.5.1")  # cached: same record
    assert again == snap
