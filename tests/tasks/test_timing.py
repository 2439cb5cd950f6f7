import time

from looprl.tasks import timing


def test_stages_add_up_in_pipeline_order():
    timing.reset()
    with timing.stage("validate_oracle"):
        time.sleep(0.01)
    for _ in range(3):
        with timing.stage("screen"):
            time.sleep(0.005)
    try:
        with timing.stage("zz_custom"):
            raise KeyError
    except KeyError:
        pass  # a failing stage still counts its time
    totals = timing.totals()
    assert list(totals) == ["screen", "validate_oracle", "zz_custom"]
    assert totals["screen"] >= 0.015 and totals["validate_oracle"] >= 0.01
    assert timing.counts() == {"validate_oracle": 1, "screen": 3, "zz_custom": 1}
    timing.reset()
    assert timing.totals() == {}


def test_breakdown_line():
    assert timing.breakdown({"screen": 2.0, "validate_oracle": 1.5}, {"screen": 3}) == \
        "screen 2.0s (3x) | validate_oracle 1.5s"
