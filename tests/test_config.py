"""Typed configs: TOML + dotted overrides, clear errors on bad input; every numeric field's range
checked at load, and a fuzz test over every field of ``TrainConfig`` and ``RealtimeConfig``."""

import doctest
import json
import math
import pickle
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from looprl import config
from looprl.config import FieldError, Length, Range, check_choice, from_dict, load_config
from looprl.errors import ConfigError
from looprl.feedback.realtime_config import RealtimeConfig
from looprl.train.config import TrainConfig
from tests.config_leaves import Leaf, leaves


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
    ("second.inner.lr=nan", "second.inner.lr: expected a finite number, got 'nan'"),
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


# -- ranges ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ranged:
    size: Annotated[int, Range(1, 4096)] = 8
    share: Annotated[float, Range(0.0, 1.0, lo_open=True)] = 0.5
    cap: Annotated[float, Range(0.0, math.inf, lo_open=True)] = 2.0
    """(0, inf]: inf = no cap."""
    plain: float = 1.0
    """No range: any finite number."""
    steps: Annotated[int, Range(1, 100)] | None = None
    name: Annotated[str, Length(1, 8)] = "x"
    tools: Annotated[tuple[str, ...], Length(1, 3)] = ("a",)
    mix: dict[str, Annotated[float, Range(0.0, 1.0)]] = field(default_factory=dict)


@pytest.mark.parametrize("override,message", [
    ("size=0", "size must be in [1, 4096], got 0"),
    ("size=100000000000000000000000000", "size must be in [1, 4096], got 100000000000000000000000000"),
    ("size=-3", "size must be in [1, 4096], got -3"),
    ("size=true", "size: expected int, got 'true'"),
    ("share=0", "share must be in (0, 1], got 0.0"),
    ("share=1.5", "share must be in (0, 1], got 1.5"),
    ("share=-inf", "share: expected a finite number, got '-inf'"),
    ("share=nan", "share: expected a finite number, got 'nan'"),
    ("cap=0", "cap must be in (0, inf], got 0.0"),
    ("cap=-inf", "cap must be in (0, inf], got -inf"),
    ("plain=inf", "plain: expected a finite number, got 'inf'"),
    ("plain=1e999", "plain: expected a finite number, got '1e999'"),
    # a value of the right type but out of range says so, not "expected int or none"
    ("steps=0", "steps must be in [1, 100], got 0"),
    ("name=", "name must have 1 to 8 characters, got 0"),
    ("name=" + "n" * 9, "name must have 1 to 8 characters, got 9"),
    ("tools=", "tools must have 1 to 3 entries, got 0"),
    ("tools=a,b,c,d", "tools must have 1 to 3 entries, got 4"),
    ('mix={"a": 2}', "mix.a must be in [0, 1], got 2.0"),
])
def test_a_value_out_of_its_range_is_refused_with_the_range(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(Ranged, None, [override])
    assert str(e.value) == message


def test_values_in_range_load_and_inf_only_where_the_range_reaches_it():
    cfg = load_config(Ranged, None, ["size=4096", "share=1", "cap=inf", "steps=none",
                                     'mix={"a": 0}', "plain=-1e300"])
    assert (cfg.size, cfg.share, cfg.cap, cfg.steps, cfg.mix, cfg.plain) == (
        4096, 1.0, math.inf, None, {"a": 0.0}, -1e300)


def test_a_bool_is_not_a_number_nor_a_number_a_string(tmp_path):
    p = tmp_path / "c.toml"
    for text, message in [("size = true", "size: expected int, got True"),
                          ("plain = false", "plain: expected float, got False"),
                          ("name = 5", "name: expected str, got 5"),
                          ("tools = [1]", "tools[]: expected str, got 1")]:
        p.write_text(text + "\n")
        with pytest.raises(ConfigError, match=f"^{__import__('re').escape(message)}$"):
            load_config(Ranged, p)


def test_a_long_value_is_cut_to_one_line():
    with pytest.raises(ConfigError) as e:
        load_config(Ranged, None, ["size=" + "x\n" * 5000])
    assert "\n" not in str(e.value) and len(str(e.value)) < 120


# -- every field of TrainConfig and RealtimeConfig ---------------------------------------------

BASE: dict[type, dict[str, Any]] = {
    TrainConfig: {"tasks": {"train_packages": ["inflection==0.5.1"]}},
    RealtimeConfig: {"model": "runs/quickstart/model_start",
                     "users": {"tasks": "runs/quickstart/tasks/heldout.jsonl"}}}
"""The configs whose every field is fuzzed (a new field or section is covered as it is added),
each with what it needs to be valid: a ``[tasks]`` table names its tasks; the real-time loop
names the policy it serves and the tasks its simulated users send."""
ROOTS = list(BASE)
FIELDS = [(root, leaf) for root in ROOTS for leaf in leaves(root)]
PLUGIN_OPTIONS = {"model.engine_options"}
"""Free-form keyword options of a plugin engine: numbers there have no range of ours."""


def _plain(tp: Any) -> tuple[Any, list[Any], bool]:
    """``(the type, its Range/Length checks, whether None is allowed)`` of an annotation."""
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and \
        type(None) in typing.get_args(tp)
    if optional:
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    checks: list[Any] = []
    if typing.get_origin(tp) is Annotated:
        tp, *checks = typing.get_args(tp)
    return tp, checks, optional


def _nested(root: type, leaf: Leaf, value: Any) -> dict[str, Any]:
    """A valid config dict (``BASE``, defaults elsewhere) with ``leaf`` set to ``value``."""
    data = json.loads(json.dumps(BASE[root]))
    node = data
    *parents, last = leaf.key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return data


def test_the_base_of_the_fuzz_is_a_valid_config():
    assert from_dict(TrainConfig, BASE[TrainConfig]) == TrainConfig()
    cfg = from_dict(RealtimeConfig, BASE[RealtimeConfig])
    assert cfg.grpo.experimental.objective.norm_tokens == 1024 and cfg.window == 64


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _bad_values(leaf: Leaf) -> list[Any]:
    """Values ``leaf`` must refuse: wrong types, NaN, inf where the range stops short, out of
    range, huge, negative, empty where a length is required."""
    tp, checks, optional = _plain(leaf.type)
    origin = typing.get_origin(tp)
    shapes: list[Any] = [{"a": 1}] if origin is not dict else [[1], 5]
    bad: list[Any] = [] if optional else [None]
    if tp in (int, float):
        bad += ["abc", True, [1], *shapes, math.nan, "nan"]
        for r in (c for c in checks if isinstance(c, Range)):
            for edge, inside, is_open in ((r.lo, 1, r.lo_open), (r.hi, -1, r.hi_open)):
                if math.isinf(edge):
                    bad += [] if (r.admits_inf and not is_open) else [edge]
                    continue
                bad.append(edge if is_open else edge - inside * (1 if tp is int else 1e-9 * max(
                    1.0, abs(edge))))
                bad.append(edge - inside * 10**26)
        if tp is int:
            bad += [1.5, "1.5"]
        if not any(isinstance(c, Range) and c.admits_inf for c in checks):
            bad += [math.inf, -math.inf, "inf"]
    elif tp is bool:
        bad += ["maybe", 2, 1.5, [True], *shapes]
    elif tp is str:
        bad += [5, 1.5, True, [1], *shapes]
    elif origin in (list, tuple):
        bad += [5, 1.5, True, {"a": 1}, [1], [[1]], ["x", {"a": 1}]]
    elif origin is dict:
        bad += [5, [1], "notjson", {"k": [1, 2]}, {"k": {"a": 1}}]
        (value_tp,) = typing.get_args(tp)[1:]
        if _plain(value_tp)[0] in (int, float):
            bad += [{"k": "abc"}, {"k": math.nan}, {"k": 10**26}]
    elif origin is typing.Literal:
        bad += ["no_such_choice", 5, [1]]
    else:
        raise AssertionError(f"{leaf.key}: a field of type {tp} has no bad values here; add them")
    for c in checks:
        if isinstance(c, Length) and c.lo > 0:
            bad.append("" if tp is str else [] if origin in (list, tuple) else {})
        if isinstance(c, Length):
            bad.append("x" * (c.hi + 1) if tp is str else ["x"] * (c.hi + 1)
                       if origin in (list, tuple) else {f"k{i}": 0.5 for i in range(c.hi + 1)})
    return bad


def _assert_refused(root: type, leaf: Leaf, value: Any) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(root, _nested(root, leaf, value))
    message = str(e.value)
    assert "\n" not in message, message
    assert leaf.key in message, (value, message)


def test_every_numeric_field_declares_its_range():
    """An int or float field (in a list, a table or ``| None`` too) without a ``Range`` loads any
    number: a new one fails here until it says which are valid."""
    missing = []
    for root, leaf in FIELDS:
        tp, checks, _ = _plain(leaf.type)
        inner = typing.get_args(tp)[-1:] if typing.get_origin(tp) in (list, tuple, dict) else ()
        for t, cs in [(tp, checks), *((_plain(i)[0], _plain(i)[1]) for i in inner)]:
            if t in (int, float) and not any(isinstance(c, Range) for c in cs) \
                    and leaf.key not in PLUGIN_OPTIONS:
                missing.append(f"{root.__name__}.{leaf.key}")
    assert not missing, missing
    walked = {root: sum(r is root for r, _ in FIELDS) for root in ROOTS}
    assert walked[TrainConfig] > 150 and walked[RealtimeConfig] > 60, walked  # every section


@pytest.mark.parametrize("root,leaf", FIELDS, ids=[f"{root.__name__}.{leaf.key}" for root, leaf in FIELDS])
def test_every_field_refuses_bad_values_with_one_line_naming_it(root, leaf):
    for value in _bad_values(leaf):
        _assert_refused(root, leaf, value)


ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-10**30, max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    # no ":": a module:attr plugin name would import whatever module the text names
    | st.text(alphabet=st.characters(blacklist_characters=":", blacklist_categories=("Cs",)),
              max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=3),
    max_leaves=6)


def _in_range(value: Any, checks: list[Any]) -> bool:
    for c in checks:
        if isinstance(c, Range):
            if not (value > c.lo if c.lo_open else value >= c.lo):
                return False
            if not (value < c.hi if c.hi_open else value <= c.hi):
                return False
        elif isinstance(c, Length) and not c.lo <= len(value) <= c.hi:
            return False
    return True


@pytest.mark.parametrize("root,leaf", FIELDS, ids=[f"{root.__name__}.{leaf.key}" for root, leaf in FIELDS])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=ANY_VALUE)
def test_any_value_of_any_field_loads_valid_or_is_refused_in_one_line(root, leaf, value):
    """Whatever a TOML file or a CLI string holds: either a ``ConfigError`` of one line that
    names the field, or a config whose field has its declared type and range, never another
    exception and never an invalid value loaded."""
    for written in (value, json.dumps(value) if not isinstance(value, str) else value):
        try:
            cfg = from_dict(root, _nested(root, leaf, written))
        except ConfigError as e:
            assert "\n" not in str(e) and leaf.key.split(".")[-1] in str(e), str(e)
            continue
        got = _get(cfg, leaf.key)
        tp, checks, optional = _plain(leaf.type)
        if got is None:
            assert optional, leaf.key
            continue
        if tp in (int, float):
            assert type(got) is tp, (leaf.key, got)
            assert not math.isnan(got), leaf.key
            assert _in_range(got, checks), (leaf.key, got)
            assert math.isfinite(got) or any(isinstance(c, Range) and c.admits_inf
                                             for c in checks), (leaf.key, got)
        elif tp in (str, bool):
            assert type(got) is tp and _in_range(got, checks), (leaf.key, got)
        elif typing.get_origin(tp) in (list, tuple, dict):
            assert isinstance(got, typing.get_origin(tp)) and _in_range(got, checks), got
