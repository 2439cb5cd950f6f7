"""Notes across trajectories (``harness.notes``): the budget, the leakage guard, the prompt."""

import pytest

from looprl.config import FieldError
from looprl.harness.notes import HEADER, Notebook
from looprl.rollout.config import RolloutConfig, RolloutExperimental
from looprl.types import Grader, Task


def _t(package: str, function: str, i: int = 0) -> Task:
    return Task(f"{package}-{function}-{i}", f"/r/{package}", f"fix {function}", Grader("pytest"),
                metadata={"package": package, "functions": function})


def test_the_budget_keeps_the_newest_notes_of_each_repository():
    book = Notebook(budget_chars=25)
    book.add(_t("a", "f"), [["note one (10)", "note two (10)"], ["note one (10)"]])
    # 13 + 13 > 25: the oldest left; rewriting "note one" made it the newest
    assert book.readable(_t("a", "g")) == ["note one (10)"]
    book.add(_t("a", "h"), [["x" * 40]])  # longer than the budget: cut to it, alone
    assert book.readable(_t("a", "g")) == ["x" * 25]
    assert book.readable(_t("b", "g")) == []  # another repository reads none of them
    with pytest.raises(ValueError, match="positive budget"):
        Notebook(0)


def test_a_task_never_reads_notes_written_on_its_own_function():
    book = Notebook(500)
    book.add(_t("a", "f", 0), [["f: the bug is the comparison"]])
    book.add(_t("a", "g", 0), [["tests live in tests/"]])
    assert book.readable(_t("a", "f", 1)) == ["tests live in tests/"]  # another task of f
    assert book.show(_t("a", "f", 1)).prompt == (f"{HEADER}\n- tests live in tests/\n\nfix f")
    assert book.show(_t("a", "f", 1)).metadata["notes"] == 1
    assert book.show(_t("b", "f")) == _t("b", "f")  # no notes: the task as it was


def test_evaluation_reads_a_copy_without_notes_on_its_functions_and_writes_none():
    train = Notebook(500)
    train.add(_t("a", "f"), [["note on f"]])
    train.add(_t("a", "g"), [["note on g"]])
    held = [_t("a", "g", 5)]  # a held-out task of g (a leak the split forbids, guarded anyway)
    ev = train.for_evaluation(held)
    assert ev.read_only and ev.readable(_t("a", "h")) == ["note on f"]
    ev.add(held[0], [["written during evaluation"]])
    assert ev.readable(_t("a", "h")) == ["note on f"]
    assert train.readable(_t("a", "h")) == ["note on f", "note on g"]  # training's untouched


def test_notes_survive_a_save_and_load(tmp_path):
    book = Notebook(100)
    book.add(_t("a", "f"), [["n1", "n2"]])
    book.save(tmp_path / "notes.json")
    back = Notebook.load(tmp_path / "notes.json")
    assert back == book and back.readable(_t("a", "g")) == ["n1", "n2"]


def test_notes_need_the_memory_tool_and_are_off_by_default():
    assert RolloutExperimental().notes_chars == 0
    with pytest.raises(FieldError, match="no memory tool"):
        RolloutConfig(tools=("read_file", "finish"),
                      experimental=RolloutExperimental(notes_chars=100))
