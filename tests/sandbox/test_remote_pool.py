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
