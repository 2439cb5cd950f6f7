"""The ``fleet`` section of ``looprl train``: where rollouts and sandboxes run.

    [fleet]
    backend = "ray"              # "inprocess" (default): every role in the trainer's process
    address = "10.0.0.1:6379"    # the head started by `ray start --head` ("" = a Ray of this machine)

    [fleet.experimental]
    engines_per_node = 8         # e.g. one replica per GPU
    gpus_per_engine = 1

Importing this module imports no Ray: the in-process default works without the ``ray`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from looprl.config import FieldError, Range, check_choice

BACKENDS = ("inprocess", "ray")
SANDBOXES = ("pool", "http")


@dataclass(frozen=True)
class FleetExperimental:
    """How a Ray fleet is laid out on its nodes and how long it waits for them: tuning knobs
    (``experimental`` in ``looprl.config``); one engine and 16 sandboxes a node by default."""

    node_ip: str = ""
    """This machine's address as Ray should see it ("" = Ray picks the routable one). A cluster
    kept on one machine uses a loopback address other than 127.0.0.1, e.g. 127.0.0.2 (Ray maps
    127.0.0.1 to the routable address)."""
    node_resource: str = ""
    """Only nodes started with this custom resource host rollouts (``ray start
    --resources='{"rollout": 1}'``); "" = every node with the CPUs and GPUs an engine needs."""
    engines_per_node: Annotated[int, Range(1, 4096)] = 1
    """Engine replicas on each node (e.g. one per GPU); a group's rollouts stay on one replica."""
    cpus_per_engine: Annotated[float, Range(0.0, 100_000.0)] = 1.0
    """Ray CPUs each replica reserves; a node with fewer (a head started with ``--num-cpus=0``
    for the trainer alone) hosts no rollouts."""
    gpus_per_engine: Annotated[float, Range(0.0, 4096.0)] = 0.0
    """Ray GPUs each replica reserves; > 0 puts the replica's model on CUDA."""
    engine_threads: Annotated[int, Range(1, 4096)] = 1
    """torch's threads in each replica's process (per process: the trainer keeps its own)."""
    sandboxes_per_node: Annotated[int, Range(1, 1_000_000)] = 16
    """Sandboxes running at once on each node (its environment server's pool size)."""
    sandboxes: str = "pool"
    """How the harness reaches its sandboxes: pool (the pool of this process or of the node's
    environment server actor) or http (an HTTP environment server, ``looprl.sandbox.server``,
    started in that process and reached through ``RemoteSandbox``, as a separate sandbox
    service would be; allowed the tasks' repositories and venvs alone)."""
    weights_url: str = ""
    """Where replicas pull new weight versions (an fsspec URL: s3://bucket/run, or a directory
    every node reads). "" = the run directory's ``weights/``, which only a one-machine cluster or
    a shared filesystem can read. The starting checkpoint must be readable at the same path on
    every node."""
    weights_options: dict[str, bool | int | float | str] = field(default_factory=dict)
    """The fsspec storage options of ``weights_url``, for the trainer and every replica (s3fs:
    ``endpoint_url`` of an S3-compatible server such as MinIO; credentials are better left to the
    backend's environment, AWS_ACCESS_KEY_ID / ~/.aws, than written in a config)."""
    min_nodes: Annotated[int, Range(1, 1_000_000)] = 1
    """Nodes whose engine and environment server must be up before the run starts."""
    poll_s: Annotated[float, Range(0.0, 86_400.0, lo_open=True)] = 1.0
    """How often the driver looks for nodes that joined or left and samples every actor's load
    (the dashboard's fleet view, ``fleet.json`` in the run directory)."""
    start_timeout_s: Annotated[float, Range(0.0, 1e7, lo_open=True)] = 300.0
    """A node's actors must be ready (model loaded, weights pulled) within this many seconds."""
    wait_for_nodes_s: Annotated[float, Range(0.0, 1e7, lo_open=True)] = 300.0
    """With no node left, a rollout waits this long for one to join before it fails (as an
    infrastructure failure: retried, then dropped, never scored)."""

    def __post_init__(self) -> None:
        check_choice("sandboxes", self.sandboxes, SANDBOXES)
        if self.node_ip in ("127.0.0.1", "localhost", "::1"):
            raise FieldError("node_ip", f"{self.node_ip!r} is replaced by the routable address "
                             "inside Ray; use another loopback address such as 127.0.0.2")


@dataclass(frozen=True)
class FleetConfig:
    """Where the rollout engines and the environment servers run."""

    backend: str = "inprocess"
    """inprocess: one engine and one sandbox pool in the trainer's process. ray: an engine
    replica and an environment server on every node of a Ray cluster (``pip install -e .[ray]``;
    ``looprl.fleet.ray_fleet``), the trainer as the driver."""
    address: str = ""
    """The Ray cluster to join, HOST:PORT of ``ray start --head`` (or "auto": the one started on
    this machine). "" starts a one-node Ray inside this run, even while another runs on this
    machine (or joins ``RAY_ADDRESS`` if set)."""
    experimental: FleetExperimental = field(default_factory=FleetExperimental)

    def __post_init__(self) -> None:
        check_choice("backend", self.backend, BACKENDS)
