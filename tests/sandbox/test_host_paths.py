"""Every host-side entry point on a workspace the agent shaped with symlinks (``beneath.py``).

The agent plants a symlink at each level — a top directory, an intermediate directory, a file, a
new name — pointing out of the workspace at a host directory only root can read (0700, files
0600), through ``/proc/self/root``, by a relative climb, or inside the workspace. Then the host
reads, writes, lists, diffs, snapshots, serves and grades it: the host's secret never appears,
and each operation treats the link as a link (a diff shows git's symlink entry) or refuses it
with an error that names it. The issue's reproduction is ``top_dir``: before ``beneath.Root``,
``sb.diff()`` (and ``GET /v1/sandboxes/{id}/diff``) carried the host file's content.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from looprl.errors import PathEscapeError, ToolError
from looprl.rewards.tests import grade
from looprl.sandbox import RemoteSandbox, SandboxPool, create_sandbox
from looprl.sandbox.server import EnvServer, EnvServerConfig
from looprl.types import Grader, Task

from .conftest import needs_bwrap, run, tree_hash

pytestmark = needs_bwrap
SECRET = "TOP-SECRET-HOST-7f3a"
CLIMB = "../" * 40  # more than any workspace's depth: a relative link up to /

# name -> (the agent's command, the link it leaves, paths the host is asked for through it)
PLANTS = {
    "top_dir": ("rm -rf pkg && ln -s {secret} pkg", "pkg",
                ["pkg/calc.py", "pkg/__init__.py", "pkg/sub/data.txt"]),
    "mid_dir": ("rm -rf pkg/sub && ln -s {secret} pkg/sub", "pkg/sub", ["pkg/sub/data.txt"]),
    "leaf_file": ("rm pkg/calc.py && ln -s {secret}/calc.py pkg/calc.py", "pkg/calc.py",
                  ["pkg/calc.py"]),
    "new_file": ("ln -s {secret}/calc.py leak.py", "leak.py", ["leak.py"]),
    "proc_root": ("rm -rf pkg/sub && ln -s /proc/self/root{secret} pkg/sub", "pkg/sub",
                  ["pkg/sub/data.txt"]),
    "relative_climb": ("rm -rf tests && ln -s " + CLIMB.rstrip("/") + "{secret} tests", "tests",
                       ["tests/test_calc.py"]),
    "in_tree_dir": ("rm -rf pkg/sub && ln -s ../tests pkg/sub", "pkg/sub",
                    ["pkg/sub/test_calc.py"]),
}


@pytest.fixture()
def secret_dir(tmp_path: Path) -> Path:
    """A host directory only root reads, holding files named like the base's, each a secret."""
    d = tmp_path / "host-private"
    d.mkdir(mode=0o700)
    for name in ("calc.py", "__init__.py", "data.txt", "test_calc.py"):
        (d / name).write_text(f"{SECRET} = 1\n")
        os.chmod(d / name, 0o600)
    os.chmod(d, 0o700)
    return d


def _plant(name: str, secret_dir: Path) -> tuple[str, str, list[str]]:
    cmd, link, probes = PLANTS[name]
    return cmd.format(secret=secret_dir), link, probes


def _no_secret(*texts: object) -> None:
    for t in texts:
        assert SECRET not in repr(t), t


async def _check_sandbox(sb, link: str, probes: list[str], secret_dir: Path) -> str:
    """Every file operation of ``sb`` through ``link``: refused or the link itself; the diff."""
    before = tree_hash(secret_dir)
    for p in {link, *probes}:
        with pytest.raises(PathEscapeError, match="symlink"):
            await sb.read(p)
    entries = {e.path: e.kind for e in await sb.walk()}
    assert entries[link] == "link"
    assert not [p for p in entries if p.startswith(link + "/")]
    with pytest.raises(PathEscapeError, match="symlink"):
        await sb.walk(link)
    for p in probes:
        if p != link:
            with pytest.raises(PathEscapeError, match=f"goes through the symlink '{link}'"):
                await sb.write(p, b"pwned")
    d = await sb.diff()
    _no_secret(d, entries)
    assert f"diff --git a/{link} b/{link}\n" in d and "120000\n" in d  # git's symlink entry
    assert tree_hash(secret_dir) == before
    return d


@pytest.mark.parametrize("backend", ["overlay", "copy"])
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_sandbox_file_api_and_diff_never_follow_a_link(
        plant: str, backend: str, base_repo: Path, secret_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "copy":
        monkeypatch.setenv("LOOPRL_SANDBOX_COW", "copy")
    cmd, link, probes = _plant(plant, secret_dir)

    async def go():
        sb = await create_sandbox(base_repo)
        try:
            assert sb.cow_backend == backend
            r = await sb.exec(cmd)
            assert r.ok, r
            d = await _check_sandbox(sb, link, probes, secret_dir)
            kid, = await sb.fork(1)  # the snapshot copies the link as a link
            try:
                assert (await kid.exec(f"test -L {link}")).ok
                assert await kid.diff() == d
            finally:
                await kid.close()
            return d
        finally:
            await sb.close()
    d = run(go())
    if plant == "in_tree_dir":  # the link's text, never the tests it points to a second time
        assert "+../tests\n" in d and "pkg/sub/test_calc.py" not in d


def test_the_issues_reproduction_diff_shows_the_link_and_deletions(base_repo: Path,
                                                                   secret_dir: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo)
        try:
            await sb.exec(f"rm -rf pkg && ln -s {secret_dir} pkg")
            return await sb.diff()
        finally:
            await sb.close()
    d = run(go())
    _no_secret(d)
    assert "diff --git a/pkg b/pkg\nnew file mode 120000\n" in d and f"+{secret_dir}\n" in d
    for gone in ("pkg/__init__.py", "pkg/calc.py", "pkg/sub/data.txt"):
        assert f"diff --git a/{gone} b/{gone}\ndeleted file mode 100644\n" in d, gone


def test_write_replaces_a_file_link_and_never_writes_through_it(base_repo: Path,
                                                                secret_dir: Path) -> None:
    before = tree_hash(secret_dir)

    async def go():
        sb = await create_sandbox(base_repo)
        try:
            await sb.exec(f"rm pkg/calc.py && ln -s {secret_dir}/calc.py pkg/calc.py && "
                          "ln -s calc.py pkg/alias.py")
            await sb.write("pkg/calc.py", b"def add(a, b):\n    return a + b\n")
            with pytest.raises(PathEscapeError, match=r"use the path it points to \('pkg/calc.py'\)"):
                await sb.read("pkg/alias.py")
            r = await sb.exec("test -f pkg/calc.py && ! test -L pkg/calc.py && cat pkg/alias.py")
            return r.stdout
        finally:
            await sb.close()
    assert run(go()) == "def add(a, b):\n    return a + b\n"
    assert tree_hash(secret_dir) == before


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_env_server_entry_points_never_follow_a_link(plant: str, base_repo: Path,
                                                     secret_dir: Path, tmp_path: Path) -> None:
    """Over HTTP, with the host directory outside the server's allowed roots."""
    cmd, link, probes = _plant(plant, secret_dir)
    roots = tmp_path / "roots"
    roots.mkdir()
    repo = roots / "repo"
    base_repo.rename(repo)
    cfg = EnvServerConfig(allowed_roots=(str(roots), sys.prefix))

    async def go(url: str):
        sb = await RemoteSandbox.create(url, "tok", str(repo))
        try:
            assert (await sb.exec(cmd)).ok
            await _check_sandbox(sb, link, probes, secret_dir)
            snap = await sb.snapshot()
            kid = await RemoteSandbox.create(url, "tok", str(repo), snapshot_id=snap)
            try:
                _no_secret(await kid.diff())
                assert (await kid.exec(f"test -L {link}")).ok
            finally:
                await kid.close()
        finally:
            await sb.close()
    with EnvServer("tok", pool=SandboxPool(max_running=2), cfg=cfg) as srv:
        run(go(srv.url))


# ---------------------------------------------------------------- the grader's host-side reads

CMD = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONPATH=. python -m pytest -p no:cacheprovider -q "
       "-o addopts=")
FIX = "sed -i 's/a - b/a + b/' pkg/calc.py"


def _task(repo: Path) -> Task:
    return Task("calc", str(repo), "fix add", venv=sys.prefix,
                grader=Grader(CMD, ("tests/test_calc.py::test_add",),
                              test_files=("tests/test_calc.py",), timeout_s=60))


def _agent_diff(repo: Path, cmd: str) -> str:
    async def go():
        sb = await create_sandbox(repo, venv=sys.prefix)
        try:
            r = await sb.exec(cmd)
            assert r.ok, r
            return await sb.diff()
        finally:
            await sb.close()
    return run(go())


@pytest.mark.parametrize("cmd, score", [
    (f"{FIX} && ln -s {{secret}}/calc.py leak.py", 1.0),
    # the grader's own output file, planted as a link: it is removed, not read through
    (f"{FIX} && ln -s {{secret}}/calc.py .looprl-pytest.out", 1.0),
    (f"{FIX} && ln -s ../tests/test_calc.py .looprl-pytest.out", 1.0),
    (f"{FIX} && rm -rf pkg/sub && ln -s {{secret}} pkg/sub", 1.0),
    ("rm -rf pkg/sub && ln -s {secret} pkg/sub", 0.0),
])
def test_grader_grades_workspaces_with_links_and_never_reads_through_them(
        cmd: str, score: float, base_repo: Path, secret_dir: Path) -> None:
    diff = _agent_diff(base_repo, cmd.format(secret=secret_dir))
    g = asyncio.run(grade(_task(base_repo), diff, cache=False))
    _no_secret(diff, g)
    assert g.score == score, g


def test_a_link_out_in_the_base_is_never_read_through(base_repo: Path, secret_dir: Path) -> None:
    """A base that itself holds a link out (say, a task repository unpacked with one): the agent
    turns it into a directory with a file of the link's target's name. The diff and the grader's
    restore of test paths look the old side up beneath the base: absent, never the host's file."""
    (base_repo / "tests" / "fixtures").symlink_to(secret_dir)
    diff = _agent_diff(base_repo, f"{FIX} && rm tests/fixtures && mkdir tests/fixtures && "
                                  "echo 'x = 1' > tests/fixtures/test_calc.py")
    _no_secret(diff)
    assert "diff --git a/tests/fixtures/test_calc.py b/tests/fixtures/test_calc.py\nnew file" in diff
    g = asyncio.run(grade(_task(base_repo), diff, cache=False))
    _no_secret(g)
    assert g.score == 1.0 and g.edited_tests, g


def test_tool_errors_name_the_link_for_the_model(base_repo: Path, secret_dir: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo)
        try:
            await sb.exec(f"ln -s {secret_dir} out && ln -s pkg/sub inner")
            msgs = []
            for p in ("out/calc.py", "inner/data.txt"):
                with pytest.raises(ToolError) as e:
                    await sb.read(p)
                msgs.append(str(e.value))
            return msgs
        finally:
            await sb.close()
    out, inner = run(go())
    assert "goes through the symlink 'out'" in out and "leads outside the workspace" in out
    assert "use the path it points to ('pkg/sub/data.txt')" in inner
