"""A Ray cluster on loopback for the tests that need one: several raylets, not local mode."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import ray
from ray.cluster_utils import Cluster

from looprl.sandbox.server import free_port


@contextmanager
def loopback_cluster(ip: str, workers: int, prefix: str) -> Iterator[Cluster]:
    """A head raylet with 0 CPUs (the driver's) and ``workers`` 1-CPU worker raylets at ``ip``,
    its own GCS port; Ray's files (sessions, sockets: a short path) and the address file a
    Cluster writes for ``ray.init()`` go under a temp dir of its own, not the machine's
    /tmp/ray, removed with the cluster."""
    temp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.makedirs(os.path.join(temp, "ray"))
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": ip, "include_dashboard": False,
        "gcs_server_port": free_port()})
    try:
        for _ in range(workers):
            cluster.add_node(num_cpus=1, node_ip_address=ip)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if before is None:
            os.environ.pop("RAY_TMPDIR")
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(temp, ignore_errors=True)
