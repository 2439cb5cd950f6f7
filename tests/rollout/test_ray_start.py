"""Starting a Ray head of our own on a slow machine: Ray's 30 s raylet wait is retried."""
import pytest

from looprl.fleet.ray_fleet import FleetError, _init_ray

TIMEOUT = ("The current node timed out during startup. This could happen because some of the "
           "raylet failed to startup or the GCS has become overloaded.")


class SlowRay:
    """Ray's module at the seam `_init_ray` uses: init times out `fails` times, then joins."""

    def __init__(self, fails: int, error: Exception | None = None):
        self.fails, self.error = fails, error
        self.inits = self.shutdowns = 0

    def init(self, **kwargs):
        self.inits += 1
        if self.inits <= self.fails:
            raise self.error or Exception(TIMEOUT)

    def shutdown(self):
        self.shutdowns += 1


def test_a_head_that_times_out_starting_is_started_again():
    ray = SlowRay(fails=2)
    _init_ray(ray, {}, address=None)
    assert (ray.inits, ray.shutdowns) == (3, 2)


def test_a_head_that_never_starts_is_one_line_fleet_error():
    ray = SlowRay(fails=3)
    with pytest.raises(FleetError, match="did not start .3 tries") as e:
        _init_ray(ray, {}, address=None)
    assert "\n" not in str(e.value) and ray.inits == 3


def test_joining_a_cluster_is_not_retried():
    ray = SlowRay(fails=1)
    with pytest.raises(FleetError, match="did not start .1 tries"):
        _init_ray(ray, {}, address="10.0.0.1:6379")
    assert ray.inits == 1


def test_other_errors_pass_through_unretried():
    ray = SlowRay(fails=1, error=ConnectionError("refused"))
    with pytest.raises(FleetError, match="cannot join Ray at fleet.address='h:1': refused"):
        _init_ray(ray, {}, address="h:1")
    assert ray.inits == 1
