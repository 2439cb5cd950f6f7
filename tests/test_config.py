"""Typed configs: TOML + dotted overrides, clear errors on bad input."""

import doctest
import pickle
from dataclasses import dataclass, field

import pytest

from looprl import config
from looprl.config import FieldError, check_choice, load_config
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


@dataclass(frozen=True)
class Picky:
    loss: str = "a"
    size: int = 1

    def __post_init__(self) -> None:
        check_choice("loss", self.loss, ("a", "bb"))
        if self.size < 1:
            raise FieldError("size", f"must be >= 1, got {self.size}")


@dataclass
class Two:
    first: Picky = field(default_factory=Picky)
    second: Outer = field(default_factory=Outer)
    nested: Picky | None = None
    required: int = 0


@pytest.mark.parametrize("override,message", [
    # a dataclass's own rule names the key the user wrote, in whichever section the class sits
    ("first.loss=bbb", "first.loss must be one of a, bb; got 'bbb' (did you mean bb?)"),
    ("first.size=0", "first.size must be >= 1, got 0"),
    ("nested.loss=c", "nested.loss must be one of a, bb; got 'c'"),
    # unknown keys name the nearest valid one
    ("second.inner.stepz=3", "unknown config key(s) ['second.inner.stepz'] (did you mean second.inner.steps?)"),
    ("secnd.flag=true", "(did you mean second?)"),
    # a value of the wrong shape is refused, never stringified or truncated
    ("second.name.x=1", "second.name: expected str, got {'x': '1'}"),
    ("second.inner.lr=nan", "second.inner.lr: expected a number, got 'nan'"),
    ("second.inner.names=[1,", "second.inner.names: expected a list written as JSON, got '[1,'"),
    ("required=1.5", "required: expected int, got '1.5'"),
])
def test_errors_name_the_dotted_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(Two, None, [override])
    assert message in str(e.value)


def test_toml_values_of_the_wrong_type(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[second.inner]\nsteps = true\n")
    with pytest.raises(ConfigError, match=r"second.inner.steps: expected int, got True"):
        load_config(Two, p)
    p.write_text("[second.inner]\nmode = [1]\n")
    with pytest.raises(ConfigError, match=r"second.inner.mode: expected str or none, got \[1\]"):
        load_config(Two, p)
    p.write_text("[second]\ninner = 3\n")
    with pytest.raises(ConfigError, match=r"second.inner: expected a table of fields"):
        load_config(Two, p)
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(Two, tmp_path)


def test_a_field_without_default_must_be_given():
    @dataclass
    class Needs:
        path: str

    with pytest.raises(ConfigError, match=r"missing config key\(s\) \['path'\]"):
        load_config(Needs, None, [])
    assert load_config(Needs, None, ["path=x"]).path == "x"


def test_field_error_survives_pickling_and_the_doctest_runs():
    e = pickle.loads(pickle.dumps(FieldError("loss", "must be one of a, b")))
    assert (e.key, e.problem, str(e)) == ("loss", "must be one of a, b", "loss must be one of a, b")
    res = doctest.testmod(config)
    assert res.attempted > 0 and res.failed == 0
