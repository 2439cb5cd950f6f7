"""looprl.fleet: rollouts and sandboxes spread over the nodes of a Ray cluster.

    cfg = FleetConfig(backend="ray", address="10.0.0.1:6379")       # the ``fleet`` config section
    fleet = await RayFleet.start(cfg, MemberSpec(...), snapshot=RunDir(run_dir).fleet)
    runner = RolloutRunner.over(fleet, rollout_cfg)                  # what GRPOLoop consumes

``config.py`` (the section; no Ray import), ``actors.py`` (a node's engine replica and environment
server), ``ray_fleet.py`` (the driver: placement, routing, failures, weights), ``snapshot.py``
(the fleet view's JSON, read by the dashboard). Ray is the ``ray`` extra: ``pip install -e .[ray]``.
"""

from looprl.fleet.config import FleetConfig

__all__ = ["FleetConfig"]
