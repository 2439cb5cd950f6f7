"""SWE-bench-family rows (SWE-bench, SWE-Gym, SWE-smith) imported as looprl tasks, and looprl
tasks exported as SWE-bench rows.

    report = await import_swebench(Path("rows.parquet"), store, repos=Path("clones"))
    n, skipped, repos_dir = export_swebench(tasks, Path("rows.jsonl"))

A row: ``instance_id, repo, base_commit, patch, test_patch, problem_statement, hints_text,
version, FAIL_TO_PASS, PASS_TO_PASS`` (+ ``environment_setup_commit``). The test lists are
JSON-encoded strings in SWE-bench's parquet and lists elsewhere; both are read. Flavours
(detected, or named with ``flavour``):
- ``swebench``: the task repo is ``repo`` at ``base_commit``, ``patch`` the gold fix,
  ``test_patch`` the hidden tests. Resolved = every FAIL_TO_PASS and PASS_TO_PASS test passes.
- ``swegym``: the same fields with plain lists and no ``environment_setup_commit``.
- ``swesmith``: ``patch`` *introduces* the bug (the task repo is the clean repo with it applied,
  the gold patch its reverse) and there is no test patch; its own grader counts a test absent
  from the log as passed. Here every graded test must be reported passed: absent is failed.
- ``r2egym``: rows are checked and refused in one line naming their image (their tests and
  runner are files of the image only); their rule is ``rewards.graded.r2egym``.
A row with an ``eval_script`` (SWE-bench v5, with ``log_parser`` and ``eval_type``) is graded by
that script's log (``Grader.eval``, ``rewards.evalscript``) unless it carries the ``looprl``
column (``grade_by`` chooses); exported rows carry both. A SWE-bench task repo (``sweb.yaml`` +
``tasks/<id>/``) reads as rows (``read_task_repo``).

Offline, a repository comes from a directory of git clones (``repos``); a row whose repository
or commit is not there is skipped with one line, unless it is graded by its ``eval_script`` and
names an ``image`` an engine here runs: then its ``/testbed`` is copied out of the image and the
task runs whole in containers of it (``Task.image``, ``sandbox.container``). The
environment: the row's ``looprl`` column when it has one (rows this module exported: Python
version, pinned requirements, test command), else the repository's own metadata
(``sources.infer_dependencies``, pytest, the package importable from the workspace through
``PYTHONPATH``), built as a cached venv from the package registry. Test ids must be pytest node
ids (``path::name``): repositories with their own runners (Django's ``runtests.py``, SymPy's
``bin/test``) are refused. Every task is written only once its gold patch scores 1 and the
untouched repo less (``imported.validated``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.diffs import blob_diff, touched_paths
from looprl.errors import SandboxError, TaskError
from looprl.rewards.evalscript import write_eval_script
from looprl.rewards.logparse import LogError, parser_name
from looprl.sandbox.beneath import Root
from looprl.tasks.envs import cached_venv, frozen_requirements, venv_python_version
from looprl.tasks.imported import (
    ImportReport,
    one_line,
    patch_metadata,
    safe_id,
    validated,
)
from looprl.tasks.sources import find_layout, infer_dependencies
from looprl.types import EvalScript, Grader, Image, JSONScalar, Task

FLAVOURS = ("swebench", "swegym", "swesmith", "r2egym")
GRADE_BY = ("auto", "eval_script", "tests")
"""``auto``: a row's ``eval_script`` grades it unless it carries a ``looprl`` column (rows looprl
exported, graded by its own pytest grader); ``eval_script``: always the script; ``tests``: never."""
EVAL_WORKDIR = "/testbed"
"""Where SWE-bench's eval scripts find the repository."""
_COMMIT = re.compile(r"[0-9a-f]{7,40}")
LOOPRL_COLUMN = "looprl"
"""The extra column of exported rows: the environment and grader looprl needs (a JSON string)."""


@dataclass(frozen=True)
class Row:
    """One row, checked (``parse_row``)."""

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    flavour: str
    version: str = ""
    image: str = ""
    env: dict[str, Any] | None = None
    """The ``looprl`` column, parsed."""
    eval_script: str = ""
    log_parser: str = ""
    """SWE-bench v5's columns: the script whose log grades the row, the parser of that log."""
    eval_type: str = ""
    """``pass_and_fail`` (or empty) or ``fail_only``: which SWE-bench rule judges the log."""


def _tests(value: object, name: str, where: str) -> tuple[str, ...]:
    """A test list: a list of strings, or a JSON string of one (SWE-bench's parquet)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise TaskError(f"{where}: field {name} is a string but not JSON "
                            f"({str(value)[:60]!r})") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise TaskError(f"{where}: field {name} must be a list of test ids (or a JSON string of "
                        f"one), got {type(value).__name__}")
    return tuple(value)


def _str(row: dict[str, Any], name: str, where: str, required: bool = True) -> str:
    v = row.get(name)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or (required and not v.strip()):
        raise TaskError(f"{where}: field {name} must be a non-empty string, got "
                        f"{type(v).__name__ if v is not None else 'nothing'}")
    return v


def detect_flavour(row: dict[str, Any]) -> str:
    """'swesmith' (an ``image_name``, a ``swesmith/`` repo), 'swegym' (plain lists, no
    environment commit) or 'swebench'.

    >>> detect_flavour({"repo": "swesmith/x__y.abc123", "FAIL_TO_PASS": []})
    'swesmith'
    >>> detect_flavour({"repo": "a/b", "FAIL_TO_PASS": '["t.py::x"]', "environment_setup_commit": "1"})
    'swebench'
    """
    if "expected_output_json" in row or ("repo_name" in row and "docker_image" in row):
        return "r2egym"
    if "image_name" in row or str(row.get("repo", "")).startswith("swesmith/"):
        return "swesmith"
    if isinstance(row.get("FAIL_TO_PASS"), list) and "environment_setup_commit" not in row:
        return "swegym"
    return "swebench"


def parse_row(row: object, where: str, flavour: str = "auto") -> Row:
    """One row, field by field; ``TaskError`` naming the row and field of what is wrong."""
    if not isinstance(row, dict):
        raise TaskError(f"{where}: a row must be an object, got {type(row).__name__}")
    kind = detect_flavour(row) if flavour == "auto" else flavour
    if kind not in FLAVOURS:
        raise TaskError(f"flavour {flavour!r}: choose auto or one of {', '.join(FLAVOURS)}")
    if kind == "r2egym":
        _r2egym_row(row, where)
    iid = _str(row, "instance_id", where)
    repo = _str(row, "repo", where)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise TaskError(f"{where}: field repo must be OWNER/NAME, got {repo[:80]!r}")
    commit = _str(row, "base_commit", where, required=kind != "swesmith")
    if kind == "swesmith" and not commit:  # swesmith/OWNER__NAME.COMMIT8 names its commit
        commit = repo.rsplit(".", 1)[-1] if "." in repo else ""
    if not _COMMIT.fullmatch(commit):
        raise TaskError(f"{where}: field base_commit must be a commit hash, got {commit[:60]!r}")
    env = row.get(LOOPRL_COLUMN)
    if isinstance(env, str) and env:
        try:
            env = json.loads(env)
        except json.JSONDecodeError:
            raise TaskError(f"{where}: field {LOOPRL_COLUMN} is not JSON") from None
    if env is not None and not isinstance(env, dict):
        raise TaskError(f"{where}: field {LOOPRL_COLUMN} must be an object")
    f2p = _tests(row.get("FAIL_TO_PASS"), "FAIL_TO_PASS", where)
    p2p = _tests(row.get("PASS_TO_PASS", []), "PASS_TO_PASS", where)
    if not f2p:
        raise TaskError(f"{where}: field FAIL_TO_PASS is empty: a task needs a failing test")
    script, parser, eval_type = _eval_columns(row, where)
    return Row(iid, repo, commit.lower(), _str(row, "patch", where),
               _str(row, "test_patch", where, required=False),
               _str(row, "problem_statement", where), f2p, p2p, kind,
               str(row.get("version") or ""), str(row.get("image_name") or row.get("image") or ""),
               env or None, script, parser, eval_type)


def _eval_columns(row: dict[str, Any], where: str) -> tuple[str, str, str]:
    """(eval_script, log_parser, eval_type) of a SWE-bench v5 row, checked ('' when absent)."""
    script = row.get("eval_script")
    if script is not None and not isinstance(script, str):
        raise TaskError(f"{where}: field eval_script must be a string (a bash script), got "
                        f"{type(script).__name__}")
    parser = _str(row, "log_parser", where, required=False)
    try:
        parser_name(parser, str(row.get("repo", "")))
    except LogError as e:
        raise TaskError(f"{where}: field log_parser: {e}") from None
    eval_type = _str(row, "eval_type", where, required=False)
    if eval_type not in ("", "pass_and_fail", "fail_only"):
        raise TaskError(f"{where}: field eval_type must be pass_and_fail or fail_only, got "
                        f"{eval_type[:40]!r}")
    return script or "", parser, eval_type


def _r2egym_row(row: dict[str, Any], where: str) -> None:
    """An R2E-Gym row, checked, then refused in one line: its tests and test runner are files
    of its Docker image only (``/run_tests.sh``, ``r2e_tests/``), not columns of the row."""
    raw = row.get("expected_output_json")
    try:
        expected = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        raise TaskError(f"{where}: field expected_output_json is not JSON") from None
    if not isinstance(expected, dict) or not all(isinstance(v, str) for v in expected.values()):
        raise TaskError(f"{where}: field expected_output_json must be an object of test -> "
                        "status (a JSON string of one)")
    image = row.get("docker_image") or row.get("image_name") or "its image"
    raise TaskError(f"{where}: an R2E-Gym row ({str(row.get('repo_name', '?'))[:60]}@"
                    f"{str(row.get('commit_hash', '?'))[:12]}): its tests and runner "
                    f"(/run_tests.sh, r2e_tests/) ship only inside {image}, so it cannot be "
                    f"realised offline (its {len(expected)} expected statuses are graded by "
                    "rewards.graded.r2egym where a container backend runs the image)")


TASK_REPO_FILES = {"patch": "gold.patch", "test_patch": "test.patch", "eval_script": "eval.sh",
                   "problem_statement": "problem_statement.md"}
"""SWE-bench's task-repo layout (``sweb.yaml`` + ``tasks/<id>/``): columns kept as files."""


def read_task_repo(path: Path) -> list[tuple[str, object]]:
    """(where, row) of each ``tasks/<id>/`` of a SWE-bench task repo: ``task.yaml`` (metadata),
    the columns kept as files (``TASK_REPO_FILES``), ``tests.json`` (the test lists) when there
    is one. A task directory that cannot be read is returned as its error text (one line)."""
    import yaml

    if not (path / "sweb.yaml").is_file():
        raise TaskError(f"{path}: a directory of rows must be a SWE-bench task repo (sweb.yaml + "
                        "tasks/<id>/task.yaml); it has no sweb.yaml")
    dirs = sorted(d for d in (path / "tasks").glob("*") if d.is_dir()) if (
        path / "tasks").is_dir() else []
    rows: list[tuple[str, object]] = []
    for d in dirs:
        where = f"tasks/{d.name}"
        try:
            row = yaml.safe_load((d / "task.yaml").read_text(encoding="utf-8"))
            if not isinstance(row, dict):
                raise TaskError("task.yaml must hold a mapping of fields")
            for column, name in TASK_REPO_FILES.items():
                if (d / name).is_file():
                    with open(d / name, encoding="utf-8", newline="") as fh:  # keep CRLF in patches
                        row[column] = fh.read()
            if (d / "tests.json").is_file():
                tests = json.loads((d / "tests.json").read_text(encoding="utf-8"))
                if not isinstance(tests, dict):
                    raise TaskError("tests.json must hold an object (FAIL_TO_PASS, PASS_TO_PASS)")
                row.update({k: v for k, v in tests.items() if k in ("FAIL_TO_PASS", "PASS_TO_PASS")})
            rows.append((where, row))
        except (OSError, UnicodeDecodeError, yaml.YAMLError, json.JSONDecodeError, TaskError) as e:
            rows.append((where, f"cannot be read: {one_line(str(e))}"))
    if not rows:
        raise TaskError(f"{path}: no tasks/<id>/ directories")
    return rows


def read_rows(path: Path, limit: int = 0) -> list[tuple[str, object]]:
    """(where, row) of a JSONL, JSON (a list) or parquet file or a SWE-bench task repo
    (``read_task_repo``); ``TaskError`` for a file that is none of them (a bad JSONL line is
    returned as its error text, for the report)."""
    if path.is_dir():
        rows: list[tuple[str, object]] = read_task_repo(path)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 — pyarrow raises several kinds for a bad file
            raise TaskError(f"{path}: not a parquet file ({one_line(str(e))})") from None
        rows = [(f"{path.name}:row {i}", r) for i, r in enumerate(table.to_pylist())]
    elif path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TaskError(f"{path}: not JSON ({e})") from None
        if not isinstance(data, list):
            raise TaskError(f"{path}: a .json file of rows must hold a list")
        rows = [(f"{path.name}:row {i}", r) for i, r in enumerate(data)]
    else:
        rows = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path.name}:{i}", json.loads(line)))
            except json.JSONDecodeError as e:
                rows.append((f"{path.name}:{i}", f"not valid JSON ({e.msg} at column {e.colno})"))
    return rows[:limit] if limit else rows


def find_clone(repos: Path, repo: str) -> Path | None:
    """The clone of ``repo`` in ``repos``: OWNER__NAME, OWNER/NAME or NAME, each maybe ``.git``
    (a SWE-smith ``swesmith/OWNER__NAME.COMMIT`` also as OWNER__NAME)."""
    owner, name = repo.split("/", 1)
    names = [f"{owner}__{name}", f"{owner}/{name}", name]
    if owner == "swesmith":
        names += [name.rsplit(".", 1)[0]]
    for n in names:
        for cand in (repos / n, repos / f"{n}.git"):
            if cand.is_dir():
                return cand
    return None


def _git(clone: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", f"--git-dir={_git_dir(clone)}", *args], capture_output=True,
                          timeout=600)


def _git_dir(clone: Path) -> Path:
    return clone / ".git" if (clone / ".git").exists() else clone


def checkout(clone: Path, commit: str, dest: Path) -> None:
    """The tree of ``commit`` in ``clone`` written to ``dest`` (no .git): ``git archive``,
    extracted with tarfile's ``data`` filter (no links out, no devices, no setuid)."""
    r = _git(clone, "archive", "--format=tar", commit)
    if r.returncode != 0:
        raise TaskError(f"commit {commit} is not in {clone}: "
                        f"{one_line(r.stderr.decode(errors='replace'))}")
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        tar.extractall(dest, filter="data")


def _apply(repo: Path, patch: str, reverse: bool = False) -> None:
    r = subprocess.run(["git", "apply", "--whitespace=nowarn", *(["-R"] if reverse else []), "-"],
                       input=patch.encode(), cwd=repo, capture_output=True, timeout=120)
    if r.returncode != 0:
        raise TaskError(f"the row's patch does not apply to its commit: "
                        f"{one_line(r.stderr.decode(errors='replace'))}")


def _diff_between(old: Path, new: Path, paths: tuple[str, ...]) -> str:
    """The git diff that turns ``old`` into ``new`` on ``paths``."""
    with Root(old) as a, Root(new) as b:
        return "".join(blob_diff(p, a.blob(p), b.blob(p)) for p in paths)


def _is_node_id(test: str) -> bool:
    return "::" in test or test.split("[")[0].endswith(".py")


def _environment(row: Row, repo: Path) -> tuple[str, tuple[str, ...], str, tuple[str, ...], str]:
    """(python version, requirements, test command, test files, note) of the task."""
    from looprl.rewards.tests import pytest_command
    from looprl.tasks.dockerfile import host_python_version

    pythonpath, _targets, test_files, _sources = find_layout(repo)
    if row.env:
        e = row.env
        reqs = e.get("requirements", [])
        if not isinstance(reqs, list) or not all(isinstance(x, str) for x in reqs):
            raise TaskError(f"field {LOOPRL_COLUMN}.requirements must be a list of strings")
        return (str(e.get("python") or host_python_version()), tuple(reqs),
                str(e.get("test_command") or pytest_command(pythonpath)),
                tuple(map(str, e.get("test_files") or test_files)), "")
    name = row.repo.rsplit("/", 1)[-1].split("__")[-1].split(".")[0]
    reqs = ("pytest", *infer_dependencies(repo, name))
    return (host_python_version(), reqs, pytest_command(pythonpath), test_files,
            "no environment in the row: its venv is the repository's declared dependencies "
            f"({len(reqs) - 1}) + pytest, the package imported from the workspace")


async def import_row(row: Row, store: Path, repos: Path | None, grade_by: str = "auto"
                     ) -> tuple[Task, list[str]]:
    """Realise one row under ``store/<id>/repo`` and make its task; (task, notes). ``TaskError``
    (one line) when it cannot be (and nothing of it is left in ``store``)."""
    dest = store / safe_id(row.instance_id)
    try:
        return await _import_row(row, dest, repos, grade_by)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


async def _import_row(row: Row, dest: Path, repos: Path | None, grade_by: str
                      ) -> tuple[Task, list[str]]:
    by_script = bool(row.eval_script) and (grade_by == "eval_script"
                                           or (grade_by == "auto" and not row.env))
    if grade_by == "eval_script" and not row.eval_script:
        raise TaskError("the row has no eval_script (--grade-by eval_script)")
    bad = [t for t in (*row.fail_to_pass, *row.pass_to_pass) if not _is_node_id(t)]
    if bad and not by_script:
        raise TaskError(f"test ids are not pytest node ids (e.g. {bad[0][:80]!r}): the "
                        "repository has its own test runner; looprl's grader runs pytest")
    where = f"{row.repo}@{row.base_commit[:12]}"
    clone = find_clone(repos, row.repo) if repos else None
    if dest.exists():
        shutil.rmtree(dest)
    if clone is None and row.image and by_script:
        return await _import_image_row(row, dest)
    if clone is None:
        owner, name = row.repo.split("/", 1)
        hint = f"pass --repos DIR holding a clone at DIR/{owner}__{name}"
        raise TaskError(f"repository {where} is not available offline ({hint}"
                        + (f"; or run its image {row.image} with a container engine, graded by "
                           "an eval_script" if row.image else "") + ")")
    tid = dest.name
    await asyncio.to_thread(checkout, clone, row.base_commit, dest / "repo")
    gold = row.patch
    if row.flavour == "swesmith":  # the row's patch makes the bug: the clean tree is the gold
        await asyncio.to_thread(checkout, clone, row.base_commit, dest / "clean")
        await asyncio.to_thread(_apply, dest / "repo", row.patch)
        gold = _diff_between(dest / "repo", dest / "clean", touched_paths(row.patch))
        shutil.rmtree(dest / "clean")
    python, reqs, command, test_files, note = _environment(row, dest / "repo")
    venv = await asyncio.to_thread(cached_venv, python, reqs)
    meta_in = (row.env or {}).get("metadata") or {}
    metadata: dict[str, JSONScalar] = {
        str(k): v for k, v in meta_in.items() if isinstance(v, (str, int, float, bool))
    } if isinstance(meta_in, dict) else {}
    metadata.update({**patch_metadata(gold), "source_kind": row.flavour,
                     "instance_id": row.instance_id,
                     "package": metadata.get("package") or row.repo.split("/", 1)[-1],
                     "version": metadata.get("version") or row.version,
                     "base_commit": row.base_commit})
    timeout = float((row.env or {}).get("timeout_s") or 300.0)
    f2p, p2p = row.fail_to_pass, row.pass_to_pass
    if not by_script and row.env and row.env.get("fail_to_pass"):
        # looprl's rows: node ids in full (the row's lists are named as the log parser reads them)
        f2p = _tests(row.env["fail_to_pass"], f"{LOOPRL_COLUMN}.fail_to_pass", row.instance_id)
        p2p = _tests(row.env.get("pass_to_pass", []), f"{LOOPRL_COLUMN}.pass_to_pass",
                     row.instance_id)
    grader = Grader(command, f2p, p2p, test_files, timeout,
                    row.test_patch if row.flavour != "swesmith" else "")
    if by_script:  # the script applies the hidden tests itself
        ev = _eval(row)
        grader = dataclasses.replace(grader, test_patch="", eval=ev)
        metadata["grading"] = f"eval_script/{ev.log_parser}/{ev.contract}"
    task = Task(id=tid, repo=str(dest / "repo"), prompt=row.problem_statement, grader=grader,
                venv=str(venv), gold_patch=gold, metadata=metadata)
    task = await validated(task)
    return task, [note] if note else []


def _eval(row: Row) -> EvalScript:
    contract = ("swesmith" if row.flavour == "swesmith" else
                "swebench_fail_only" if row.eval_type == "fail_only" else "swebench")
    return EvalScript(row.eval_script, parser_name(row.log_parser, row.repo), contract,
                      EVAL_WORKDIR)


async def _import_image_row(row: Row, dest: Path) -> tuple[Task, list[str]]:
    """A v5 row whose repository is its image's alone: the image's ``/testbed`` copied out as
    the task repo, the agent and the eval script in containers of the image (``Task.image``);
    ``TaskError`` (one line) where no engine here runs it."""
    from looprl.rewards.tests import pytest_command
    from looprl.sandbox.container import check_engine, copy_out

    try:
        engine = await asyncio.to_thread(check_engine, row.image)
        await asyncio.to_thread(copy_out, engine, row.image, EVAL_WORKDIR, dest / "repo")
        if row.flavour == "swesmith":  # the row's patch makes the bug in the image's clean tree
            await asyncio.to_thread(copy_out, engine, row.image, EVAL_WORKDIR, dest / "clean")
    except SandboxError as e:
        raise TaskError(f"repository {row.repo} is only in image {row.image}, which cannot run "
                        f"here: {e}") from None
    gold = row.patch
    if row.flavour == "swesmith":
        await asyncio.to_thread(_apply, dest / "repo", row.patch)
        gold = _diff_between(dest / "repo", dest / "clean", touched_paths(row.patch))
        shutil.rmtree(dest / "clean")
    pythonpath, _targets, test_files, _sources = find_layout(dest / "repo")
    ev = _eval(row)
    metadata: dict[str, JSONScalar] = {
        **patch_metadata(gold), "source_kind": row.flavour, "instance_id": row.instance_id,
        "package": row.repo.split("/", 1)[-1], "version": row.version,
        "base_commit": row.base_commit, "grading": f"eval_script/{ev.log_parser}/{ev.contract}"}
    grader = Grader(pytest_command(pythonpath), row.fail_to_pass, row.pass_to_pass, test_files,
                    300.0, "", eval=ev)
    task = Task(id=dest.name, repo=str(dest / "repo"), prompt=row.problem_statement,
                grader=grader, gold_patch=gold, metadata=metadata,
                image=Image(row.image, EVAL_WORKDIR))
    task = await validated(task)
    return task, [f"runs in image {row.image}: the agent and the eval script in its containers"]


async def import_swebench(path: Path, store: Path, *, repos: Path | None = None,
                          flavour: str = "auto", jobs: int = 2, limit: int = 0,
                          grade_by: str = "auto") -> ImportReport:
    """Import the rows of ``path`` (``read_rows``) into ``store``; one line per row skipped."""
    if flavour not in ("auto", *FLAVOURS):
        raise TaskError(f"--flavour {flavour!r}: choose auto or one of {', '.join(FLAVOURS)}")
    if grade_by not in GRADE_BY:
        raise TaskError(f"--grade-by {grade_by!r}: choose one of {', '.join(GRADE_BY)}")
    if repos is not None and not repos.is_dir():
        raise TaskError(f"--repos {repos}: not a directory of git clones")
    report = ImportReport()
    parsed: list[tuple[str, Row | str]] = []
    for where, raw in read_rows(path, limit):
        try:
            parsed.append((where, raw if isinstance(raw, str) else parse_row(raw, where, flavour)))
        except TaskError as e:
            parsed.append((where, str(e).removeprefix(f"{where}: ")))
    gate = asyncio.Semaphore(jobs)

    async def one(row: Row) -> tuple[Task, list[str]] | str:
        async with gate:
            try:
                return await import_row(row, store, repos, grade_by)
            except TaskError as e:
                return str(e)

    rows = [r for _, r in parsed if isinstance(r, Row)]
    results = iter(await asyncio.gather(*(one(r) for r in rows)))
    ids: set[str] = set()
    for where, r in parsed:
        if isinstance(r, str):
            report.skip(where, r)
            continue
        got = next(results)
        if isinstance(got, str):
            report.skip(r.instance_id, got)
        elif got[0].id in ids:
            report.skip(r.instance_id, f"duplicate instance_id (task id {got[0].id})")
        else:
            ids.add(got[0].id)
            report.tasks.append(got[0])
            for n in got[1]:
                report.note(got[0].id, n)
    return report


# ------------------------------------------------------------------ export

_GIT_ENV = {"GIT_AUTHOR_NAME": "looprl", "GIT_AUTHOR_EMAIL": "looprl@localhost",
            "GIT_COMMITTER_NAME": "looprl", "GIT_COMMITTER_EMAIL": "looprl@localhost",
            "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
"""Fixed identity and dates: the same task base is the same commit on every export."""


def commit_tree(git_dir: Path, tree: Path, message: str) -> str:
    """Commit the files of ``tree`` (caches and bytecode left out) into the bare repository
    ``git_dir`` as a parentless commit; its sha."""
    git_dir = git_dir.resolve()  # (git runs in the tree: a relative path would not reach it)
    if not (git_dir / "HEAD").exists():
        subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True,
                       capture_output=True)
    index = git_dir / f"index-{os.getpid()}"
    env = {**os.environ, **_GIT_ENV, "GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(tree),
           "GIT_INDEX_FILE": str(index)}
    try:
        def git(*args: str) -> str:
            r = subprocess.run(["git", *args], env=env, capture_output=True, text=True, cwd=tree)
            if r.returncode != 0:
                raise TaskError(f"git {args[0]} of {tree} failed: {one_line(r.stderr)}")
            return r.stdout.strip()

        git("add", "-A", "-f", "--", ".", ":(exclude,glob)**/__pycache__/**",
            ":(exclude,glob)**/*.pyc", ":(exclude,glob)**/.pytest_cache/**")
        sha = git("commit-tree", git("write-tree"), "-m", message)
        git("update-ref", f"refs/heads/{message.split()[0]}", sha)
        return sha
    finally:
        index.unlink(missing_ok=True)


def _parsed_name(test: str) -> str:
    """A test's name as SWE-bench's pytest log parser reads it: up to its first whitespace
    (``t.py::f[a b]`` -> ``t.py::f[a``; SWE-bench's own rows name such tests so).

    >>> _parsed_name("t.py::test_titleize[active_record-Active Record]")
    't.py::test_titleize[active_record-Active'
    """
    return test.split()[0] if test.strip() else test


def task_row(task: Task, repo: str, commit: str) -> dict[str, Any]:
    """``task`` as a SWE-bench row (test lists JSON-encoded, as in SWE-bench's parquet) with the
    ``looprl`` column that lets ``import_swebench`` rebuild its environment offline."""
    assert task.venv is not None
    g = task.grader
    env = {"python": venv_python_version(task.venv), "requirements": list(
        frozen_requirements(task.venv)), "test_command": g.test_command,
        "test_files": list(g.test_files), "timeout_s": g.timeout_s,
        "metadata": {k: v for k, v in task.metadata.items() if isinstance(v, (str, int, float, bool))}}
    targets = list(dict.fromkeys((*g.fail_to_pass, *g.pass_to_pass)))
    env["fail_to_pass"], env["pass_to_pass"] = list(g.fail_to_pass), list(g.pass_to_pass)
    f2p = list(dict.fromkeys(map(_parsed_name, g.fail_to_pass)))
    p2p = [t for t in dict.fromkeys(map(_parsed_name, g.pass_to_pass)) if t not in f2p]
    return {"instance_id": task.id, "repo": repo, "base_commit": commit,
            "environment_setup_commit": commit, "patch": task.gold_patch or "",
            "test_patch": g.test_patch, "problem_statement": task.prompt, "hints_text": "",
            "created_at": "", "version": str(task.metadata.get("version", "")),
            "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p),
            LOOPRL_COLUMN: json.dumps(env),
            "eval_script": write_eval_script(g.test_command, targets, g.test_patch, EVAL_WORKDIR),
            "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}


def export_swebench(tasks: list[Task], out: Path) -> tuple[int, list[tuple[str, str]], Path]:
    """Write ``tasks`` as rows to ``out`` (.jsonl, or .parquet) and each task's base as a commit
    of a bare git repository per package under ``<out stem>.repos/`` (``looprl__PACKAGE.git``);
    (rows written, (task id, why) of tasks not exported, the repos directory)."""
    repos = out.with_name(out.stem + ".repos")
    rows, skipped = [], []
    for t in tasks:
        if t.grader.verifier is not None or not t.venv or not t.gold_patch or not t.grader.fail_to_pass:
            skipped.append((t.id, "only pytest-graded tasks with a venv, a gold patch and "
                                  "fail-to-pass tests become SWE-bench rows"))
            continue
        package = safe_id(str(t.metadata.get("package") or "tasks"))
        sha = commit_tree(repos / f"looprl__{package}.git", Path(t.repo), f"{safe_id(t.id)} base")
        rows.append(task_row(t, f"looprl/{package}", sha))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), out)
    else:
        out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                       encoding="utf-8")
    return len(rows), skipped, repos
