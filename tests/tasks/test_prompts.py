import pytest

from looprl.tasks.prompts import STYLES, Evidence, make_prompt

EV = Evidence(functions=("Inflector._apply", "titleize"), module="inflection",
              failing=("test_inflection.py::test_titleize[a-b]",),
              messages={"test_inflection.py::test_titleize[a-b]":
                        "AssertionError: assert 'Man From The Boondocks' == 'Man from the Boondocks'"},
              package="inflection", sources={"test_inflection.py::test_titleize":
                  "def test_titleize(a, b):\n    assert inflection.titleize(a) == b"})


def test_wrong_value_quotes_actual_and_expected():
    text = STYLES["wrong_value"](EV)
    assert text == "titleize gives me 'Man From The Boondocks' but it should be 'Man from the Boondocks'"


def test_exception_style_only_when_an_exception_failed():
    assert STYLES["exception"](EV) is None
    ev = Evidence(("parse",), "m", ("t.py::test_x",), {"t.py::test_x": "TypeError: bad operand"})
    assert STYLES["exception"](ev) == "parse crashes with TypeError: bad operand now. can you fix it?"


def test_style_choice_is_deterministic_and_varied():
    picks = {make_prompt(EV, f"task-{i}").style for i in range(40)}
    assert make_prompt(EV, "x") == make_prompt(EV, "x")
    assert {"wrong_value", "failing_test", "bug_report", "terse"} <= picks


def test_feature_tasks_ask_for_an_implementation():
    ev = Evidence(("camelize",), "inflection", ("t.py::test_c",), kind="feature_deletion")
    p = make_prompt(ev, "t")
    assert p.style == "implement" and "camelize" in p.text and "NotImplementedError" in p.text


def test_prompts_stay_terse_and_never_show_diffs_or_test_code():
    long = Evidence(("f",), "m", ("t.py::test_f",), {"t.py::test_f": "assert " + "x" * 500 + " == 1"})
    for i in range(20):
        p = make_prompt(long, str(i))
        assert len(p.text) < 260
        assert "def test" not in p.text and "@@" not in p.text and "+++" not in p.text


def test_wrong_value_reads_which_side_was_computed_from_the_test_source():
    """Tests write `assert want == f(x)` as often as `assert f(x) == want`: the prompt must name
    the value the code gave, not the expected one, and skip the style when it cannot tell."""
    from looprl.tasks.prompts import Evidence, s_wrong_value

    node = "test_inflection.py::test_ordinal[-1--1st]"
    msg = {node: "assert '-1st' == '-1th'"}
    expected_left = Evidence(("ordinal",), "inflection", (node,), msg, sources={
        "test_inflection.py::test_ordinal":
            "def test_ordinal(number, ordinalized):\n    assert ordinalized == number + inflection.ordinal(number)"})
    assert s_wrong_value(expected_left) == "ordinal gives me '-1th' but it should be '-1st'"
    actual_left = Evidence(("ordinal",), "inflection", (node,), msg, sources={
        "test_inflection.py::test_ordinal": "def test_ordinal():\n    assert ordinal(-1) == '-1th'"})
    assert s_wrong_value(actual_left) == "ordinal gives me '-1st' but it should be '-1th'"
    assert s_wrong_value(Evidence(("ordinal",), "inflection", (node,), msg)) is None


def test_selection_blocks_follow_the_prompt_with_path_and_lines():
    import doctest

    from looprl.tasks import prompts
    assert doctest.testmod(prompts).failed == 0
    text = prompts.with_selection("fix f", [("./a.py", 3, "x = 1\ny = 2"), ("./b.py", 9, "z")])
    assert text.split("\n\n") == ["fix f", "selected in ./a.py, lines 3-4:\n```\nx = 1\ny = 2\n```",
                                  "selected in ./b.py, lines 9-9:\n```\nz\n```"]
    with pytest.raises(ValueError, match="at least one"):
        prompts.with_selection("fix f", [])
