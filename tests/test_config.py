"""Typed configs: TOML + dotted overrides, clear errors on bad input."""

from dataclasses import dataclass, field

import pytest

from looprl.config import load_config
from looprl.errors import ConfigError


@dataclass
class Inner:
    lr: float = 1e-5
    """learning rate"""
    steps: int = 10
    names: list[str] = field(default_factory=list)
    mode: str | None = None


@dataclass
class Outer:
    name: str = "run"
    inner: Inner = field(default_factory=Inner)
    flag: bool = False


def test_defaults_file_and_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('name = "x"\n[inner]\nsteps = 3\n')
    cfg = load_config(Outer, p, ["inner.lr=0.5", "flag=true", "inner.names=a,b", "inner.mode=none"])
    assert cfg == Outer(name="x", inner=Inner(lr=0.5, steps=3, names=["a", "b"], mode=None), flag=True)


@pytest.mark.parametrize("override,match", [
    ("inner.lrr=1", r"unknown config key.*inner.lrr.*valid keys under inner"),
    ("inner.steps=abc", r"inner.steps: expected int"),
    ("flag=maybe", r"flag: expected true/false"),
    ("noequals", r"must look like 'section.key=value'"),
])
def test_bad_overrides_say_how_to_fix(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(Outer, None, [override])


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Outer, tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(Outer, bad)
