import json
from pathlib import Path

import datasets
import pytest

from looprl.errors import TaskError
from looprl.tasks.taskset import (
    load_tasks,
    split_by_function,
    split_by_package,
    summarize,
    table_markdown,
    write_tasks,
)
from looprl.types import Grader, Task


def task(i, package="p", kind="mutation", fn="f"):
    return Task(id=f"t{i}", repo=f"/r/{i}", prompt="fix " + "x" * i, venv="/v",
                grader=Grader("pytest", (f"t.py::a{i}",), ("t.py::b",), ("t.py",)),
                gold_patch="--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n",
                metadata={"package": package, "source_kind": kind, "functions": fn,
                          "lines_changed": 2, "prompt_style": "terse"})


def test_roundtrip_and_datasets_reads_it(tmp_path):
    ts = [task(1), task(2, "q", "release"), task(3, kind="feature_deletion")]
    path = write_tasks(ts, tmp_path / "t.jsonl")
    back = load_tasks(path)
    assert [t.id for t in back] == ["t1", "t2", "t3"]
    assert back[1].grader == ts[1].grader and back[1].metadata["source_kind"] == "release"
    ds = datasets.load_dataset("json", data_files=str(path), cache_dir=str(tmp_path / "c"))["train"]
    assert ds.num_rows == 3
    assert ds[1]["metadata"]["package"] == "q"
    assert Task.from_dict(ds[0]).grader.fail_to_pass == ("t.py::a1",)


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("prompt"), "missing field 'prompt'"),
    (lambda d: d["grader"].update(fail_to_pass="t.py::a"), "'grader.fail_to_pass' must be a list"),
    (lambda d: d["grader"].update(fail_to_pass=[], pass_to_pass=[]), "'grader.fail_to_pass' is empty"),
    (lambda d: d.update(repo=3), "field 'repo' must be str"),
])
def test_malformed_lines_name_line_and_field(tmp_path, mutate, needle):
    good = task(1).to_dict()
    bad = task(2).to_dict()
    mutate(bad)
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TaskError, match=f"bad.jsonl:2: .*{needle}"):
        load_tasks(p)


def test_bad_json_and_duplicates(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps(task(1).to_dict()) + "\n{oops\n")
    with pytest.raises(TaskError, match="x.jsonl:2: not valid JSON"):
        load_tasks(p)
    p.write_text((json.dumps(task(1).to_dict()) + "\n") * 2)
    with pytest.raises(TaskError, match="x.jsonl:2: field 'id': duplicate"):
        load_tasks(p)
    with pytest.raises(TaskError, match="not found"):
        load_tasks(tmp_path / "missing.jsonl")


def test_splits_hold_out_packages_and_functions():
    ts = [task(i, package="a" if i % 2 else "b", fn=f"f{i % 7}") for i in range(60)]
    by_pkg = split_by_package(ts, {"b"})
    assert {t.metadata["package"] for t in by_pkg["test"]} == {"b"}
    assert all(t.metadata["split"] == "train" for t in by_pkg["train"])
    by_fn = split_by_function(ts, 0.3)
    train_fns = {(t.metadata["package"], t.metadata["functions"]) for t in by_fn["train"]}
    test_fns = {(t.metadata["package"], t.metadata["functions"]) for t in by_fn["test"]}
    assert by_fn["test"] and by_fn["train"] and not train_fns & test_fns


def test_summary_table():
    rows = summarize([task(1), task(3), task(2, "q", "release")])
    assert [(r.package, r.tasks) for r in rows] == [("p", 2), ("q", 1), ("all", 3)]
    assert rows[0].median_prompt_chars == 6 and rows[0].median_lines_changed == 2
    md = table_markdown(rows)
    assert "| package | tasks | mutation | release |" in md and "| all | 3 | 2 | 1 |" in md


def test_show_cli_checks_the_file(tmp_path):
    from typer.testing import CliRunner

    from looprl.commands.tasks import app

    path = write_tasks([task(1), task(2, "q")], tmp_path / "t.jsonl")
    r = CliRunner().invoke(app, ["show", str(path)])
    assert r.exit_code == 0 and "2 tasks" in r.output
    path.write_text(path.read_text() + '{"id": "x"}\n')
    r = CliRunner().invoke(app, ["show", str(path)])
    assert r.exit_code != 0 and "t.jsonl:3: missing field 'repo'" in str(r.exception)


def test_task_files_store_paths_relative_to_the_looprl_home(tmp_path, monkeypatch):
    import dataclasses
    import sys

    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path / "home"))
    built = dataclasses.replace(task(1), repo=str(tmp_path / "home" / "tasks" / "p" / "repo"),
                                venv=str(tmp_path / "home" / "packages" / "p" / "venv"))
    outside = dataclasses.replace(task(2), repo=str(tmp_path / "mine"))
    path = write_tasks([built, outside], tmp_path / "t.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0]["repo"] == "${LOOPRL_HOME}/tasks/p/repo"
    assert rows[0]["venv"] == "${LOOPRL_HOME}/packages/p/venv"
    assert rows[1]["repo"] == str(tmp_path / "mine")  # not under the home: kept as it was
    monkeypatch.setenv("LOOPRL_HOME", str(tmp_path / "other"))  # another user's home
    back = load_tasks(path)
    assert back[0].repo == str(tmp_path / "other" / "tasks" / "p" / "repo")
    assert back[1].repo == str(tmp_path / "mine")
    (tmp_path / "env.jsonl").write_text(json.dumps({**rows[1], "venv": "${LOOPRL_ENV}"}) + "\n")
    assert load_tasks(tmp_path / "env.jsonl")[0].venv == str(Path(sys.prefix).absolute())
