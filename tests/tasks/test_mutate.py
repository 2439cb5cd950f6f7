import ast

import pytest

from looprl.diffs import apply_patch, parse_diff
from looprl.tasks import mutate
from tests.example_package import CORE

SRC = '''def f(xs, n=3, flag=True):
    """Doc."""
    total = 0  # keep me
    for i in range(len(xs)):
        if xs[i] < n and flag:
            total += xs[i] * 2
    if not xs:
        return None
    return max(total, n)
'''


def kinds_of(text):
    return {m.kind for m in mutate.candidates(text, "m.py")}


def test_every_kind_found_on_a_real_function():
    assert kinds_of(SRC) >= {"compare_flip", "arith_flip", "bool_flip", "off_by_one",
                             "negate_condition", "drop_condition", "drop_guard", "drop_statement",
                             "drop_return", "swap_args", "change_default", "feature_deletion"}


@pytest.mark.parametrize("kind", sorted(mutate.MUTATORS))
def test_mutations_are_minimal_and_reversible(kind):
    muts = [m for m in mutate.candidates(SRC, "m.py") if m.kind == kind]
    assert muts, kind
    for m in muts:
        new = mutate.apply_edits(SRC, m.sites[0].edits)
        assert new != SRC
        ast.parse(new)
        gold = mutate.gold_patch({"m.py": SRC}, {"m.py": new})
        # the gold patch turns the mutated file back into the original, exactly
        assert apply_patch(new, parse_diff(gold)[0]) == SRC
        if kind != "feature_deletion":
            changed = [a for a, b in zip(SRC.splitlines(), new.splitlines(), strict=False) if a != b]
            assert len(changed) <= 2 or kind in ("drop_guard", "drop_statement")
        assert "# keep me" in new or kind in ("feature_deletion", "drop_statement")


def test_operator_flip_keeps_formatting():
    m = next(m for m in mutate.candidates(SRC, "m.py") if m.kind == "compare_flip")
    new = mutate.apply_edits(SRC, m.sites[0].edits)
    assert "if xs[i] >= n and flag:" in new


def test_feature_deletion_keeps_signature_and_docstring():
    m = next(m for m in mutate.candidates(SRC, "m.py") if m.kind == "feature_deletion")
    new = mutate.apply_edits(SRC, m.sites[0].edits)
    assert new == 'def f(xs, n=3, flag=True):\n    """Doc."""\n    raise NotImplementedError\n'


def test_non_ascii_columns_are_handled():
    src = 'def g(s):\n    return "é" + s if len(s) < 2 else s\n'
    m = next(m for m in mutate.candidates(src, "u.py") if m.kind == "compare_flip")
    assert mutate.apply_edits(src, m.sites[0].edits) == \
        'def g(s):\n    return "é" + s if len(s) >= 2 else s\n'


def test_combine_makes_multi_site_across_functions():
    muts = mutate.candidates(CORE, "core.py", ("compare_flip",))
    a = next(m for m in muts if m.functions == ("clamp",))
    b = next(m for m in muts if m.functions == ("is_sorted",))
    combo = mutate.combine([a, b])
    assert combo.kind == "multi_site" and set(combo.functions) == {"clamp", "is_sorted"}
    new = mutate.mutated_files({"core.py": CORE}, combo)["core.py"]
    assert len(parse_diff(mutate.gold_patch({"core.py": CORE}, {"core.py": new}))[0].hunks) == 2
    with pytest.raises(AssertionError):
        mutate.combine([a, a])


def test_syntax_error_file_yields_nothing():
    assert mutate.candidates("def f(:\n", "bad.py") == []
