import sys

sys.path.insert(0, "/app")

from stats import mean, median  # noqa: E402


def test_median_odd():
    assert median([3, 1, 2]) == 2


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_median_even_unsorted_floats():
    assert median([10.0, 0.0]) == 5.0


def test_mean_unchanged():
    assert mean([1, 2, 3, 4]) == 2.5
