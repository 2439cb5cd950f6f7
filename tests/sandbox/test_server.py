"""The environment server over real HTTP on loopback, through RemoteSandbox."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

from looprl.errors import SandboxError, ToolError
from looprl.harness.tools import ToolContext
from looprl.harness.tools.read_lints import ReadLints
from looprl.protocols import Sandbox
from looprl.sandbox import RemoteSandbox, SandboxPool
from looprl.sandbox.server import EnvServer, EnvServerConfig

from .conftest import needs_bwrap, run

pytestmark = needs_bwrap
TOKEN = "test-token-123"


def roots(tmp_path: Path) -> EnvServerConfig:
    """Allowed roots: the test's repos and this venv (its interpreter is the server's own)."""
    return EnvServerConfig(allowed_roots=(str(tmp_path), sys.prefix))


@pytest.fixture()
def server(tmp_path: Path):
    with EnvServer(TOKEN, pool=SandboxPool(max_running=4), cfg=roots(tmp_path)) as srv:
        yield srv


def test_remote_sandbox_is_a_sandbox(server: EnvServer, base_repo: Path, venv: str) -> None:
    async def go():
        sb = await RemoteSandbox.create(server.url, TOKEN, str(base_repo), venv)
        try:
            assert isinstance(sb, Sandbox)
            r = await sb.exec("python -c 'print(6*7)'; echo err >&2; exit 4")
            assert (r.exit_code, r.stdout, r.stderr) == (4, "42\n", "err\n")
            await sb.write("pkg/calc.py", b"def add(a, b):\n    return a + b\n")
            assert (await sb.read("pkg/calc.py")).endswith(b"a + b\n")
            await sb.write("bin.dat", bytes(range(256)))
            assert await sb.read("bin.dat") == bytes(range(256))
            assert "pkg/calc.py" in {e.path for e in await sb.walk()}
            await sb.write("pkg/extra.py", b"import os\n")  # the lint tool, run on the server
            lints = await ReadLints().run({"paths": ["pkg/extra.py"]}, ToolContext(sandbox=sb))
            assert lints == "pkg/extra.py:1:8 F401 `os` imported but unused\n1 diagnostic in 1 file."
            d = await sb.diff()
            assert "+    return a + b" in d and "diff --git a/bin.dat b/bin.dat\nnew file mode 100644" in d
            assert "GIT binary patch" in d  # the bytes travel, as git writes them
            r = await sb.exec("sleep 10", timeout_s=0.3)
            assert r.timed_out and r.exit_code is None
            kids = await sb.fork(2)
            assert (await kids[0].read("pkg/calc.py")).endswith(b"a + b\n")
            await kids[0].write("only0.txt", b"0")
            with pytest.raises(ToolError):
                await kids[1].read("only0.txt")
            for k in kids:
                await k.close()
        finally:
            await sb.close()
        assert not (base_repo / "bin.dat").exists()
    run(go())


def test_model_errors_are_tool_errors_and_infra_errors_are_sandbox_errors(
        server: EnvServer, base_repo: Path) -> None:
    async def go():
        sb = await RemoteSandbox.create(server.url, TOKEN, str(base_repo))
        try:
            with pytest.raises(ToolError, match="outside|'\\.\\.'"):
                await sb.read("../../etc/passwd")
            with pytest.raises(ToolError, match="not found"):
                await sb.read("nope.py")
        finally:
            await sb.close()
        stale = RemoteSandbox(server.url, TOKEN, sb.id, httpx.AsyncClient(
            headers={"Authorization": f"Bearer {TOKEN}"}), str(base_repo), None, sb.tools_dir)
        with pytest.raises(SandboxError, match="no live sandbox"):
            await stale.exec("true")  # the lease was returned: an infra error, not the model's
        await stale._client.aclose()
        with pytest.raises(SandboxError, match="does not exist"):
            await RemoteSandbox.create(server.url, TOKEN, str(base_repo / "missing"))
    run(go())


def test_auth_metrics_and_health(server: EnvServer, base_repo: Path) -> None:
    async def go():
        with pytest.raises(SandboxError, match="token"):
            await RemoteSandbox.create(server.url, "wrong", str(base_repo))
        async with httpx.AsyncClient() as c:
            assert (await c.get(f"{server.url}/v1/metrics")).status_code == 401
            assert (await c.get(f"{server.url}/v1/health")).json()["ok"] is True
            sb = await RemoteSandbox.create(server.url, TOKEN, str(base_repo))
            await sb.exec("true")
            m = (await c.get(f"{server.url}/v1/metrics",
                             headers={"Authorization": f"Bearer {TOKEN}"})).json()
            assert m["busy"] == 1 and m["execs_total"] == 1 and m["exec_p50_ms"] > 0
            await sb.close()
    run(go())


def test_dead_server_is_an_infra_error(base_repo: Path, tmp_path: Path) -> None:
    async def go():
        srv = EnvServer(TOKEN, cfg=roots(tmp_path)).__enter__()
        sb = await RemoteSandbox.create(srv.url, TOKEN, str(base_repo))
        assert (await sb.exec("echo up")).ok
        await asyncio.to_thread(srv.__exit__, None, None, None)  # the server goes away
        with pytest.raises(SandboxError, match="unreachable") as e:
            await sb.exec("true")
        assert e.value.is_infra
        await sb.close()  # closing against a dead server does not raise
    run(go())
