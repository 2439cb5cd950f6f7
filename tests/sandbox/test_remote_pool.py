"""Sandboxes leased over HTTP (``sandbox.remote_pool``): a pool served in this process reports its
server's load, which a fleet node's stats read (``fleet.actors.EnvServer.stats``: with
``fleet.experimental.sandboxes = "http"`` every poll of the node raised AttributeError and lost the node)."""

import asyncio

import pytest

from looprl.sandbox.remote_pool import RemotePool, serving_roots

pytestmark = pytest.mark.needs_bwrap


def test_a_served_pool_reports_its_servers_leases(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")

    async def main() -> tuple[int, int]:
        with serving_roots((str(tmp_path),), max_running=2) as pool:
            async with pool.lease(tmp_path) as sb:
                assert (await sb.exec("cat a.py")).stdout == "x = 1\n"
                busy = pool.metrics().busy
            return busy, pool.metrics().busy

    assert asyncio.run(main()) == (1, 0)
    assert RemotePool("http://127.0.0.1:9", "t").metrics() is None  # a server elsewhere


def test_an_image_task_is_not_served_over_http_one_line_naming_it():
    from looprl.errors import SandboxUnavailableError
    from looprl.sandbox.remote_pool import task_roots
    from looprl.types import Grader, Image, Task

    plain = Task("a", "/r/a", "fix", Grader("pytest"))
    assert task_roots([plain]) == ("/r/a",)
    boxed = Task("b", "/r/b", "fix", Grader("sh t.sh"), image=Image("localhost/x:1", "/app"))
    with pytest.raises(SandboxUnavailableError, match=r"^task b runs in image localhost/x:1: "
                                                     r"environment servers serve bubblewrap"):
        task_roots([plain, boxed])
