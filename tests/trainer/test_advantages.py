import math

import pytest

from looprl.errors import ConfigError
from looprl.trainer.advantages import ADVANTAGES, group_advantages, is_zero_variance


def test_never_is_mean_centered():
    assert group_advantages([1.0, 0.0, 0.0, 0.0], "never") == [0.75, -0.25, -0.25, -0.25]


def test_always_divides_by_population_std():
    # mean 0.25, population std sqrt(0.1875) = 0.4330127
    a = group_advantages([1.0, 0.0, 0.0, 0.0], "always", eps=0.0)
    assert a == pytest.approx([0.75 / 0.4330127, -0.25 / 0.4330127, -0.25 / 0.4330127, -0.25 / 0.4330127],
                              rel=1e-6)
    assert a[0] == pytest.approx(math.sqrt(3))


def test_unless_equal_matches_always_on_spread_and_is_exact_zero_on_equal():
    r = [3.0, 1.0, 2.0]
    assert group_advantages(r, "unless_equal") == group_advantages(r, "always")
    # 0.1 * 3 / 3 != 0.1 in floats: 'always' would amplify the rounding error by 1/eps
    equal = [0.1, 0.1, 0.1]
    assert group_advantages(equal, "unless_equal") == [0.0, 0.0, 0.0]


def test_zero_variance_detection():
    assert is_zero_variance([1.0, 1.0, 1.0])
    assert is_zero_variance([])
    assert not is_zero_variance([1.0, 1.0, 0.0])


def test_registry_names_and_unknown_name_error():
    assert set(ADVANTAGES) == {"never", "always", "unless_equal"}
    with pytest.raises(ConfigError, match="never"):
        group_advantages([1.0, 0.0], "zscore")
