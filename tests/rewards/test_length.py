"""Length penalty: effort sum, the curve against hand-computed values, continuity at q = 1."""

import math

import pytest

from looprl.config import load_config
from looprl.errors import ConfigError
from looprl.rewards.length import (
    LengthConfig,
    effort,
    length_penalty,
    penalty_curve,
    penalty_of_effort,
)
from looprl.types import Counters, Grader, StopReason, Task, Trajectory

TASK = Task("t", "/repo", "fix it", Grader("pytest"))


def _traj(counters: Counters, stop: StopReason = StopReason.FINISHED) -> Trajectory:
    return Trajectory("t", "g", (), (), counters, stop)


def test_effort_weights_each_counter():
    cfg = LengthConfig(thinking_token_weight=2, output_token_weight=3, tool_call_token_weight=5,
                       tool_output_token_weight=7, tool_call_weight=11, turn_weight=13)
    c = Counters(turns=1, tool_calls=1, thinking_tokens=1, output_tokens=1, tool_call_tokens=1,
                 tool_output_tokens=1, broken_tool_calls=99, summaries=99, summary_tokens=99)
    assert effort(c, cfg) == 2 + 3 + 5 + 7 + 11 + 13  # broken calls / summaries are not effort
    assert effort(Counters(thinking_tokens=10, output_tokens=10), cfg) == 50


@pytest.mark.parametrize("c,q,expected", [
    (100.0, 1.0, -0.1 * math.log(2.0)),
    (300.0, 0.5, -0.1 * (math.sqrt(4.0) - 1) / 0.5),
    (300.0, 2.0, -0.1 * (1 - 1 / 4.0)),
    (300.0, 0.0, -0.3),
    (0.0, 0.7, 0.0),
])
def test_curve_hand_computed(c, q, expected):
    assert penalty_curve(c, coef=1e-3, k=1e-2, q=q) == pytest.approx(expected, rel=1e-12)


def test_q_to_one_is_continuous():
    at_one = penalty_curve(5000.0, 1e-3, 1e-2, 1.0)
    for eps in (1e-3, 1e-6, 1e-9, 1e-13):
        for q in (1 - eps, 1 + eps):
            assert penalty_curve(5000.0, 1e-3, 1e-2, q) == pytest.approx(at_one, rel=10 * eps + 1e-12)


@pytest.mark.parametrize("q", [0.25, 0.5, 1.0, 1.5, 3.0])
def test_concave_steep_then_flat(q):
    cs = [0, 1, 10, 100, 1000, 10_000, 100_000]
    ps = [penalty_curve(c, 1e-3, 1e-2, q) for c in cs]
    assert all(a > b for a, b in zip(ps, ps[1:], strict=False)), "more effort must cost more"
    slopes = [(ps[i + 1] - ps[i]) / (cs[i + 1] - cs[i]) for i in range(len(cs) - 1)]
    assert all(abs(a) > abs(b) for a, b in zip(slopes, slopes[1:], strict=False)), "slope must flatten"
    assert slopes[0] == pytest.approx(-1e-3, rel=0.05)  # slope λ near C = 0


def test_saturates_for_q_above_one():
    assert penalty_curve(1e15, 1e-3, 1e-2, 2.0) == pytest.approx(-0.1, rel=1e-6)  # λ/(k(q-1))


def test_cap_and_trajectory_term():
    cfg = LengthConfig(max_penalty=0.3)
    assert penalty_of_effort(1e9, cfg) == -0.3
    assert penalty_of_effort(1e9, LengthConfig(max_penalty=None)) < -1.0
    traj = _traj(Counters(turns=2, tool_calls=3, output_tokens=30))  # C = 100 + 60 + 30
    assert length_penalty(TASK, traj) == pytest.approx(-0.1 * math.log(2.9))
    assert length_penalty(TASK, _traj(Counters())) == 0.0
    assert length_penalty(TASK, _traj(Counters(turns=9), StopReason.INFRA_ERROR)) is None


@pytest.mark.parametrize("override,says", [
    ("k=0", "k must be in (0, 1000000], got 0.0; for a linear penalty set q=0 instead"),
    ("q=-1", "q must be in [0, 1000], got -1.0"),
    ("coef=nan", "coef: expected a finite number, got 'nan'"),
    ("turn_weight=-1", "turn_weight must be in [0, 1000000], got -1.0")])
def test_bad_config_says_what_to_fix(override, says):
    with pytest.raises(ConfigError) as e:
        load_config(LengthConfig, None, [override])
    assert str(e.value) == says


def test_plot_script_writes_a_png(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "plot_length_penalty.py"
    out = tmp_path / "curve.png"
    subprocess.run([sys.executable, str(script), "--out", str(out)], check=True, timeout=120,
                   capture_output=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
