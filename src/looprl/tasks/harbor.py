"""Harbor task directories (the Terminal-Bench task format, ``task.toml`` schema 1.x): imported as
looprl tasks that run offline under the sandbox, and looprl tasks exported as them.

    report = await import_harbor([Path("tasks/hello")], store=Path("imported/harbor"))
    write_tasks(report.tasks, "harbor.jsonl"); report.print()
    export_harbor(tasks, Path("exported/harbor"))      # one directory per task

A task directory: ``task.toml``, ``instruction.md`` (leading canary lines stripped, as Harbor
does), ``environment/Dockerfile`` (read by ``dockerfile.read_dockerfile``: the workspace is its
WORKDIR, the venv its ``pip install``s), ``tests/test.sh`` (+ fixtures, the verifier: graded by
``rewards.verifier`` in a fresh sandbox of the final workspace with the pristine tests at
/tests) and ``solution/solve.sh`` (the oracle: run once at import in a sandbox over the
workspace, its diff is the task's gold patch). An imported task is written only once its gold
patch scores 1 and the untouched workspace less (``imported.validated``).

A prebuilt ``[environment].docker_image`` makes an image task (``Task.image``): its WORKDIR
(``[environment].workdir`` or the image's) is copied out as the task's repo, and the oracle, the
agent and the verifier all run in containers of the image (``sandbox.container``); refused in
one line where no engine here runs the image (none installed, the image not in its store).

Refused with one line naming the feature (``Unsupported``): multi-step tasks (``[[steps]]``),
docker-compose environments, GPUs/TPUs, MCP servers, healthchecks,
network allowlists, Windows, environment variables taken from the host (``${VAR}``), a separate
verifier image (``[verifier.environment]`` with an image, ``[[verifier.collect]]``), and every
Dockerfile instruction ``dockerfile`` cannot realise. Kept with a note: artifacts (the verifier
sees the whole workspace instead), ``skills_dir``, Dockerfile notes (ENV, a system base image).
Resource sizes (cpus, memory_mb, storage_mb) are not mapped: the sandbox's limits apply.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from looprl.errors import SandboxError, SandboxUnavailableError, TaskError, ToolError
from looprl.tasks.dockerfile import DockerEnv, Unsupported, materialise, read_dockerfile
from looprl.tasks.envs import cached_venv, frozen_requirements, venv_python_version
from looprl.tasks.imported import (
    ImportReport,
    one_line,
    patch_metadata,
    safe_id,
    validated,
)
from looprl.types import Grader, Image, Task, Verifier

SCHEMA_MAJOR = "1"
_NUM = (int, float)
_STRMAP = "strmap"
_SCHEMA: dict[str, Any] = {
    "schema_version": str, "version": str, "source": str, "multi_step_reward_strategy": str,
    "task": {"name": str, "version": str, "description": str, "authors": list, "keywords": list},
    "metadata": dict,
    "verifier": {"timeout_sec": _NUM, "env": _STRMAP, "user": (str, int), "environment_mode": str,
                 "environment": dict, "network_mode": str, "allowed_hosts": list, "collect": list},
    "agent": {"timeout_sec": _NUM, "user": (str, int), "network_mode": str, "allowed_hosts": list},
    "environment": {"build_timeout_sec": _NUM, "docker_image": str, "os": str, "cpus": _NUM,
                    "memory_mb": int, "storage_mb": int, "gpus": int, "gpu_types": list,
                    "tpu": dict, "mcp_servers": list, "env": _STRMAP, "skills_dir": str,
                    "healthcheck": dict, "workdir": str, "allow_internet": bool,
                    "network_mode": str, "allowed_hosts": list, "memory": str, "storage": str},
    "solution": {"env": _STRMAP},
    "steps": list, "artifacts": list,
}
"""The fields of Harbor's ``TaskConfig`` this importer reads, with their TOML types (Harbor
ignores unknown keys; so does this). Checked before anything is realised."""
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
_HOST_VAR = re.compile(r"\$\{[^}]*\}")


def strip_canary(text: str) -> str:
    """``text`` without its leading canary comment lines and the blank lines after them.

    >>> strip_canary("<!-- harbor-canary GUID 1 -->\\n\\nFix the bug.\\n")
    'Fix the bug.\\n'
    """
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def _type_name(tp: object) -> str:
    names = {str: "a string", bool: "true or false", int: "an integer", list: "an array",
             dict: "a table", _NUM: "a number", _STRMAP: "a table of strings",
             (str, int): "a string or an integer"}
    return names.get(tp, str(tp))


def _check_types(data: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    for key, tp in schema.items():
        if key not in data:
            continue
        v = data[key]
        name = f"{where}.{key}" if where else key
        if isinstance(tp, dict):
            if not isinstance(v, dict):
                raise TaskError(f"task.toml: [{name}] must be a table, got {v!r:.60}")
            _check_types(v, tp, name)
            continue
        if tp == _STRMAP:
            ok = isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
        elif tp == _NUM:
            ok = isinstance(v, _NUM) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
        elif tp is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, tp)
        if not ok:
            raise TaskError(f"task.toml: {name} must be {_type_name(tp)}, got {v!r:.60}")


def read_config(path: Path) -> dict[str, Any]:
    """A ``task.toml``, parsed and type-checked; ``TaskError`` (one line) when malformed."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskError(f"task.toml: not valid TOML ({one_line(str(e))})") from None
    _check_types(data, _SCHEMA, "")
    for section in ("verifier", "agent"):
        v = data.get(section, {}).get("timeout_sec")
        if v is not None and v <= 0:
            raise TaskError(f"task.toml: {section}.timeout_sec must be positive, got {v}")
    version = str(data.get("schema_version", data.get("version", "1.0")))
    if version.split(".")[0] != SCHEMA_MAJOR:
        raise TaskError(f"task.toml: schema_version {version} is not 1.x, which looprl reads")
    return data


def refusal(cfg: dict[str, Any], task_dir: Path) -> str | None:
    """The first feature of this task looprl does not realise offline, as one line, or None."""
    env, verifier = cfg.get("environment", {}), cfg.get("verifier", {})
    if cfg.get("steps"):
        return (f"[[steps]]: a multi-step task ({len(cfg['steps'])} steps); looprl's task is one "
                "instruction graded once: import each step as a task directory of its own")
    if str(env.get("os", "linux")).lower() != "linux":
        return f"[environment].os = {env['os']!r}: the sandbox runs Linux"
    for key in ("gpus", "gpu_types", "tpu"):
        if env.get(key):
            return f"[environment].{key} = {env[key]!r}: the sandbox has no accelerators"
    if env.get("mcp_servers"):
        names = ", ".join(str(s.get("name", "?")) for s in env["mcp_servers"] if isinstance(s, dict))
        return f"[environment].mcp_servers ({names}): MCP servers are services; the sandbox runs none"
    if env.get("healthcheck"):
        return "[environment].healthcheck: a service readiness check; the sandbox runs no services"
    for section in ("environment", "agent", "verifier"):
        s = cfg.get(section, {})
        if s.get("network_mode") == "allowlist" or s.get("allowed_hosts"):
            return (f"[{section}] network allowlist ({', '.join(map(str, s.get('allowed_hosts') or []))}):"
                    " the sandbox has no network")
    for section in ("environment", "verifier", "solution"):
        for k, v in cfg.get(section, {}).get("env", {}).items():
            if _HOST_VAR.search(v):
                return (f"[{section}].env.{k} = {v!r} takes a variable from the host (credentials?): "
                        "looprl passes none into sandboxes")
    venv_env = verifier.get("environment") or {}
    if venv_env.get("docker_image") or verifier.get("collect"):
        return "[verifier].environment image / [[verifier.collect]]: a separate verifier container"
    for name in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
        for d in ("environment", "tests"):
            if (task_dir / d / name).is_file():
                return f"{d}/{name}: a multi-container environment needs a container engine"
    if env.get("docker_image") and (task_dir / "tests" / "Dockerfile").is_file():
        return ("tests/Dockerfile beside [environment].docker_image: the verifier of an image "
                "task runs in the task's image")
    if not env.get("docker_image") and not (task_dir / "environment" / "Dockerfile").is_file():
        return ("no environment/Dockerfile and no [environment].docker_image: looprl realises an "
                "environment from its Dockerfile or runs it in its image")
    if not (task_dir / "solution" / "solve.sh").is_file():
        return "no solution/solve.sh: looprl validates every task with its oracle solution"
    return None


@dataclass(frozen=True)
class HarborDir:
    """A Harbor task directory, read and checked (nothing realised yet)."""

    path: Path
    config: dict[str, Any]
    instruction: str
    name: str
    """``[task].name`` or the directory's name."""
    notes: tuple[str, ...] = field(default=())


def read_harbor_dir(d: Path) -> HarborDir:
    """Read ``d``; ``TaskError`` when malformed, ``Unsupported`` when refused (one line each)."""
    if not (d / "task.toml").is_file():
        raise TaskError(f"no task.toml in {d} (a Harbor task directory has task.toml, "
                        "instruction.md, environment/, tests/test.sh)")
    cfg = read_config(d / "task.toml")
    if not (d / "tests" / "test.sh").is_file():
        raise TaskError("no tests/test.sh: Harbor's verifier entry point is required")
    try:
        instruction = strip_canary((d / "instruction.md").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"instruction.md cannot be read ({e})") from None
    if not instruction.strip():
        raise TaskError("instruction.md is empty")
    why = refusal(cfg, d)
    if why:
        raise Unsupported(why)
    notes = []
    if cfg.get("artifacts"):
        notes.append("artifacts are not collected: the verifier sees the whole final workspace")
    if cfg.get("environment", {}).get("skills_dir"):
        notes.append("[environment].skills_dir is not given to looprl's agent")
    name = str(cfg.get("task", {}).get("name") or d.name)
    return HarborDir(d, cfg, instruction, name, tuple(notes))


def _copy_tree(src: Path, dst: Path, executable: str | None = None) -> None:
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if executable and (dst / executable).is_file():
        p = dst / executable
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _environment(h: HarborDir) -> tuple[DockerEnv, DockerEnv | None]:
    """The task's environment and, from ``tests/Dockerfile``, the verifier's own (or None)."""
    env = read_dockerfile(h.path / "environment")
    override = h.config.get("environment", {}).get("workdir")
    if override and override.rstrip("/") != env.workdir:
        raise Unsupported(f"[environment].workdir = {override!r} differs from the Dockerfile's "
                          f"WORKDIR {env.workdir}: the workspace must be one directory")
    ver = None
    if (h.path / "tests" / "Dockerfile").is_file():
        ver = read_dockerfile(h.path / "tests", extra_dests=("/tests",), workspace=False)
        if ver.copies:
            raise Unsupported("tests/Dockerfile copies files into the workspace; the verifier "
                              "grades the agent's workspace as it is")
    return env, ver


async def _gold_patch(repo: Path, venv: str | None, image: Image | None, workdir: str,
                      solution: Path, env: dict[str, str], timeout_s: float) -> tuple[str, str]:
    """(diff, output tail) of ``solve.sh`` run once in a sandbox over ``repo`` (a container of
    ``image`` when given), /solution mounted read-only (as Harbor's oracle agent runs it: from
    the WORKDIR)."""
    from looprl.sandbox import Mount, create_sandbox

    sb = await create_sandbox(repo, venv=venv, workdir=workdir, image=image,
                              mounts=(Mount(str(solution), "/solution"),))
    try:
        r = await sb.exec("/solution/solve.sh", env={"DEBIAN_FRONTEND": "noninteractive", **env},
                          timeout_s=timeout_s)
        if r.timed_out:
            raise TaskError(f"solution/solve.sh ran over {timeout_s:g}s")
        return await sb.diff(), (r.stdout + r.stderr)[-1500:]
    except ToolError as e:
        raise TaskError(f"solution/solve.sh could not run: {e}") from None
    finally:
        await sb.close()


def _metadata(h: HarborDir, image: str, workdir: str) -> dict[str, str | int | float | bool | None]:
    meta: dict[str, str | int | float | bool | None] = {
        "package": h.name.split("/")[0] if "/" in h.name else "harbor",
        "source_kind": "harbor", "harbor_name": h.name,
        "description": str(h.config.get("task", {}).get("description", ""))[:500],
        "harbor_image": image, "harbor_workdir": workdir,
        "harbor_schema": str(h.config.get("schema_version", h.config.get("version", "1.0")))}
    agent_timeout = h.config.get("agent", {}).get("timeout_sec")
    if agent_timeout:
        meta["agent_timeout_s"] = float(agent_timeout)
    ours = h.config.get("metadata", {}).get("source") == "looprl"  # exported by looprl: as is
    for k, v in h.config.get("metadata", {}).items():
        key = str(k) if ours else f"harbor_{re.sub(r'[^A-Za-z0-9_]', '_', str(k))}"
        if ours and key in ("source", "source_kind"):
            continue
        if isinstance(v, (str, int, float, bool)):
            meta[key] = v
        elif isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v):
            meta[key] = ",".join(map(str, v))
        else:
            meta[key] = json.dumps(v, default=str)[:500]
    return meta


async def import_dir(h: HarborDir, store: Path) -> tuple[Task, list[str]]:
    """Realise one read task directory under ``store/<id>/`` (repo, tests, solution) and make
    its task; (task, notes). ``TaskError``/``Unsupported`` (one line) when it cannot be (and
    nothing of it is left in ``store``)."""
    dest = store / safe_id(h.name)
    try:
        return await _import_dir(h, dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


async def _image(h: HarborDir, name: str, repo: Path) -> Image:
    """The task's prebuilt image, its WORKDIR copied out to ``repo`` (the task's workspace);
    ``Unsupported`` (one line) when no engine here runs it."""
    from looprl.sandbox.container import check_engine, copy_out, image_workdir

    where = f"[environment].docker_image = {name!r}"
    try:
        engine = await asyncio.to_thread(check_engine, name)
        workdir = (h.config.get("environment", {}).get("workdir")
                   or await asyncio.to_thread(image_workdir, engine, name))
        if not workdir.startswith("/") or workdir.rstrip("/") == "":
            raise Unsupported(f"{where}: the image sets no WORKDIR below / and "
                              "[environment].workdir is unset: the workspace must be one directory")
        await asyncio.to_thread(copy_out, engine, name, workdir, repo)
    except SandboxUnavailableError as e:
        raise Unsupported(f"{where}: {e}") from None
    except SandboxError as e:
        raise TaskError(f"{where}: {e}") from None
    return Image(name, workdir.rstrip("/"))


async def _import_dir(h: HarborDir, dest: Path) -> tuple[Task, list[str]]:
    tid = dest.name
    cfg = h.config
    if dest.exists():
        shutil.rmtree(dest)
    image: Image | None = None
    notes = list(h.notes)
    if cfg.get("environment", {}).get("docker_image"):
        image = await _image(h, cfg["environment"]["docker_image"], dest / "repo")
        venv = verifier_venv = None
        workdir, base_env, ver_env = image.workdir, {}, {}
        meta = _metadata(h, image.name, image.workdir)
        if (h.path / "environment" / "Dockerfile").is_file():
            notes.append("environment/Dockerfile is not built: the task runs in its docker_image")
    else:
        env, ver = _environment(h)
        venv = str(await asyncio.to_thread(cached_venv, env.python, env.requirements))
        verifier_venv = (str(await asyncio.to_thread(cached_venv, ver.python, ver.requirements))
                         if ver is not None else None)
        materialise(env, h.path / "environment", dest / "repo")
        workdir, base_env, ver_env = env.workdir, env.env, (ver.env if ver else {})
        meta = _metadata(h, env.image, env.workdir)
        notes += [*env.notes, *(f"tests/Dockerfile: {n}" for n in (ver.notes if ver else ()))]
        if env.env:
            notes.append(f"ENV {', '.join(env.env)} reach the verifier and the oracle, not the "
                         "agent's commands")
    _copy_tree(h.path / "tests", dest / "tests", executable="test.sh")
    _copy_tree(h.path / "solution", dest / "solution", executable="solve.sh")
    verifier_env = {**base_env, **ver_env, **cfg.get("verifier", {}).get("env", {})}
    solve_env = {**base_env, **cfg.get("solution", {}).get("env", {})}
    timeout = float(cfg.get("agent", {}).get("timeout_sec") or 600.0)
    try:
        gold, tail = await _gold_patch(dest / "repo", venv, image, workdir, dest / "solution",
                                       solve_env, timeout)
    except SandboxError as e:
        raise TaskError(f"the sandbox failed running solution/solve.sh: {e}") from None
    if not gold.strip():
        raise TaskError("solution/solve.sh changed nothing in the WORKDIR (a solution that "
                        f"writes elsewhere cannot be graded here); its output: {one_line(tail)}")
    task = Task(
        id=tid, repo=str(dest / "repo"), prompt=h.instruction,
        grader=Grader(test_command="/tests/test.sh",
                      timeout_s=float(cfg.get("verifier", {}).get("timeout_sec", 600.0)),
                      verifier=Verifier(tests_dir=str(dest / "tests"), workdir=workdir,
                                        venv=verifier_venv, env=verifier_env)),
        venv=venv, gold_patch=gold, metadata={**meta, **patch_metadata(gold)}, image=image)
    task = await validated(task)
    if image is None and re.search(rf"(?<![\w/]){re.escape(workdir)}\b", h.instruction):
        notes.append(f"the instruction names {workdir}: looprl's agent works in the workspace "
                     "at its own path (the verifier sees it at the WORKDIR)")
    return task, notes


def task_dirs(paths: list[Path]) -> list[Path]:
    """Each path that is a task directory, and the task directories one level inside the
    others (a dataset directory)."""
    out: list[Path] = []
    for p in paths:
        if (p / "task.toml").is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(d for d in p.iterdir() if (d / "task.toml").is_file())
    return out


async def import_harbor(paths: list[Path], store: Path, *, jobs: int = 2) -> ImportReport:
    """Import every task directory of ``paths`` (``task_dirs``) into ``store``; the report
    holds the tasks, in order, and a line for each one skipped or noted."""
    report = ImportReport()
    dirs = task_dirs(paths)
    for p in paths:
        if not p.exists():
            report.skip(str(p), "no such directory")
        elif p not in dirs and not any(d.parent == p for d in dirs):
            report.skip(str(p), "no task.toml here or in its subdirectories")
    gate = asyncio.Semaphore(jobs)

    async def one(d: Path) -> tuple[Task, list[str]] | str:
        async with gate:
            try:
                return await import_dir(read_harbor_dir(d), store)
            except Unsupported as e:
                return f"refused: {e}"
            except TaskError as e:
                return str(e)

    ids: set[str] = set()
    for d, got in zip(dirs, await asyncio.gather(*(one(d) for d in dirs)), strict=True):
        if isinstance(got, str):
            report.skip(d.name, got)
            continue
        task, notes = got
        if task.id in ids:
            report.skip(d.name, f"task id {task.id} already imported from another directory")
            continue
        ids.add(task.id)
        report.tasks.append(task)
        for n in notes:
            report.note(task.id, n)
    return report


# ------------------------------------------------------------------ export

HARBOR_WORKDIR = "/app"
_GRADE_PY = '''"""Grade /app: run the graded tests, write the reward (1: every one passed, else 0)."""
import json, os, shlex, subprocess, sys

spec = json.load(open("/tests/tests.json"))
ids = spec["fail_to_pass"] + [t for t in spec["pass_to_pass"] if t not in spec["fail_to_pass"]]
cmd = spec["test_command"] + " " + " ".join(shlex.quote(t) for t in ids)
out = subprocess.run(cmd, shell=True, cwd="/app", capture_output=True, text=True)
text = out.stdout + out.stderr
sys.stdout.write(text[-20000:])
passed = set()
summary = text.partition("short test summary info")[2]
for line in summary.splitlines():
    if line.startswith("PASSED "):  # (pytest -rA: the whole rest of a PASSED line is its id)
        passed.add(line[len("PASSED "):].rstrip("\\n"))
reward = 1 if ids and all(t in passed for t in ids) else 0
os.makedirs("/logs/verifier", exist_ok=True)
with open("/logs/verifier/reward.txt", "w") as f:
    f.write(f"{reward}\\n")
print(f"reward {reward}: {sum(t in passed for t in ids)} of {len(ids)} graded tests passed")
'''
_TEST_SH = """#!/bin/bash
# Exported by looprl. Restores the pristine test files, applies the hidden tests, then grades
# the graded tests by pytest's outcomes; always writes /logs/verifier/reward.txt.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd /app || exit 0
if [ -d /tests/pristine ]; then cp -a /tests/pristine/. /app/; fi
if [ -s /tests/test.patch ]; then
  git apply --whitespace=nowarn /tests/test.patch || patch -p1 --batch --forward -s -i /tests/test.patch || exit 0
fi
python /tests/grade.py
"""
_SOLVE_SH = """#!/bin/bash
# Exported by looprl: applies the gold patch to the workspace.
set -e
cd /app
git apply --whitespace=nowarn /solution/gold.patch || patch -p1 --batch --forward -s -i /solution/gold.patch
"""


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a TOML basic string is a JSON string


def _task_toml(task: Task) -> str:
    meta = {k: v for k, v in task.metadata.items() if isinstance(v, (str, int, float, bool))}
    # separate: the verifier runs in a fresh container of the same environment with the agent's
    # final /app uploaded as an artifact (Harbor re-materialises it at its path), which is
    # how looprl grades: a fresh copy-on-write sandbox of the final workspace
    lines = ['schema_version = "1.4"', f'artifacts = ["{HARBOR_WORKDIR}"]', "", "[task]", f"name = {_toml_str('looprl/' + task.id)}",
             f"description = {_toml_str(str(task.metadata.get('description', '')))}", "",
             "[metadata]", 'source = "looprl"']
    for k, v in sorted(meta.items()):
        if k == "source":
            continue
        val = _toml_str(v) if isinstance(v, str) else ("true" if v is True else "false"
                                                       if v is False else repr(v))
        lines.append(f"{_toml_str(k)} = {val}")
    lines += ["", "[verifier]", f"timeout_sec = {float(task.grader.timeout_s)!r}",
              'environment_mode = "separate"', "", "[agent]", "timeout_sec = 600.0", "",
              "[environment]", 'network_mode = "no-network"', f'workdir = "{HARBOR_WORKDIR}"', ""]
    return "\n".join(lines)


def _dockerfile(task: Task) -> str:
    assert task.venv is not None
    reqs = frozen_requirements(task.venv)
    version = venv_python_version(task.venv)
    run = ("RUN pip install --no-cache-dir " + " \\\n    ".join(reqs) + "\n") if reqs else ""
    # python:X.Y (not -slim): it has git, which solve.sh and test.sh apply patches with
    return (f"# Exported by looprl from task {task.id}: the task's venv, pinned, and its repo.\n"
            f"FROM python:{version}\nWORKDIR {HARBOR_WORKDIR}\n{run}COPY repo/ {HARBOR_WORKDIR}/\n")


def export_task(task: Task, dest: Path) -> Path:
    """Write ``task`` as a Harbor task directory at ``dest`` (replaced); ``TaskError`` when the
    task cannot be (no venv, a verifier task, no gold patch)."""
    if task.grader.verifier is not None:
        raise TaskError(f"task {task.id} is graded by a verifier already (imported from Harbor?); "
                        "export its source directory instead")
    if not task.venv or not task.gold_patch:
        raise TaskError(f"task {task.id} has no {'venv' if not task.venv else 'gold patch'}; "
                        "only tasks with both are exported")
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "environment").mkdir(parents=True)
    shutil.copytree(task.repo, dest / "environment" / "repo", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    (dest / "environment" / "Dockerfile").write_text(_dockerfile(task))
    (dest / "instruction.md").write_text(task.prompt.rstrip("\n") + "\n")
    (dest / "task.toml").write_text(_task_toml(task))
    tests = dest / "tests"
    tests.mkdir()
    for rel in task.grader.test_files:
        src = Path(task.repo) / rel
        if src.is_file() and not src.is_symlink():
            (tests / "pristine" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tests / "pristine" / rel)
    (tests / "test.patch").write_text(task.grader.test_patch)
    (tests / "tests.json").write_text(json.dumps({
        "test_command": task.grader.test_command, "fail_to_pass": list(task.grader.fail_to_pass),
        "pass_to_pass": list(task.grader.pass_to_pass)}, indent=1))
    (tests / "grade.py").write_text(_GRADE_PY)
    (tests / "test.sh").write_text(_TEST_SH)
    (dest / "solution").mkdir()
    (dest / "solution" / "gold.patch").write_text(task.gold_patch)
    (dest / "solution" / "solve.sh").write_text(_SOLVE_SH)
    for script in (tests / "test.sh", dest / "solution" / "solve.sh"):
        script.chmod(0o755)
    return dest


def export_harbor(tasks: list[Task], out: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """Each task as ``out/<id>/``; (directories written, (task id, why) of tasks not exported)."""
    written, skipped = [], []
    for t in tasks:
        try:
            written.append(export_task(t, out / safe_id(t.id)))
        except TaskError as e:
            skipped.append((t.id, str(e)))
    return written, skipped
