"""The call map that picks the tests screening runs: it must keep every test a mutation breaks
(checked against full-suite runs, on the example package and on a real PyPI package)."""

import ast
import asyncio
import random
from pathlib import Path

import pytest

from looprl.rewards.tests import run_tests
from looprl.tasks import mutate
from looprl.tasks.build import BuildConfig, Screener
from looprl.tasks.coverage import CallMap, def_line, record_coverage


def test_def_line_is_the_first_decorator():
    tree = ast.parse("def f():\n    pass\n\n\n@a\n@b(1)\ndef g():\n    pass\n")
    f, g = tree.body
    assert def_line(f) == 1 and def_line(g) == 5
    code = compile("@staticmethod\ndef g():\n    pass\n", "m.py", "exec")
    inner = next(c for c in code.co_consts if hasattr(c, "co_firstlineno"))
    assert inner.co_firstlineno == def_line(ast.parse("@staticmethod\ndef g():\n    pass\n").body[0])


def test_call_map_inverts_per_test_calls_over_passing_tests():
    per_test = {"t.py::a": ["m.py:1", "m.py:9"], "t.py::b": ["m.py:9"], "t.py::flaky": ["m.py:1"]}
    cmap = CallMap.from_per_test(per_test, ("t.py::a", "t.py::b"))
    assert cmap.tests_for("m.py", 9) == ("t.py::a", "t.py::b")
    assert cmap.tests_for("m.py", 1) == ("t.py::a",)  # a test that did not pass is not recorded
    assert cmap.tests_for("m.py", 5) == ()
    assert CallMap.from_json(cmap.to_json()) == cmap


async def _full_suite_failures(snap, muts: list[mutate.Mutation], originals: dict[str, str]
                               ) -> list[set[str]]:
    """Tests of the whole recorded suite that fail under each mutation (one reused sandbox)."""
    from looprl.sandbox import create_sandbox

    out = []
    sb = await create_sandbox(snap.repo, venv=snap.venv)
    try:
        for m in muts:
            files = mutate.mutated_files(originals, m)
            for p, text in files.items():
                await sb.write(p, text.encode())
            run = await run_tests(sb, snap.test_command, list(snap.test_targets), timeout_s=120)
            for p in files:
                await sb.write(p, originals[p].encode())
            out.append({t for t in snap.passing_tests if run.outcomes.get(t) != "passed"})
    finally:
        await sb.close()
    return out


def _check_selection_keeps_every_failure(snap, n: int, seed: int) -> int:
    """Mutations of functions with covering tests: their full-suite failures are covered."""
    async def go():
        async with Screener(snap, BuildConfig()) as sc:
            assert sc.calls is not None, "tracing failed: the call map is missing"
            pool = []
            for path, text in sc.originals.items():
                pool += [m for m in mutate.candidates(text, path) if sc.covering_tests(m)]
            random.Random(seed).shuffle(pool)
            muts = pool[:n]
            fails = await _full_suite_failures(snap, muts, sc.originals)
            return [(m, set(sc.covering_tests(m)), f) for m, f in zip(muts, fails, strict=True)]

    broke = 0
    for m, covering, failing in asyncio.run(go()):
        assert failing <= covering, (m.description, sorted(failing - covering)[:5])
        broke += bool(failing)
    return broke


def test_call_map_of_example_package(example_snapshot):
    cmap = asyncio.run(record_coverage(example_snapshot))
    clamp_line = 4  # `def clamp` in src/minicalc/core.py
    src = Path(example_snapshot.repo, "src/minicalc/core.py").read_text()
    assert src.splitlines()[clamp_line - 1].startswith("def clamp")
    assert set(cmap.tests_for("src/minicalc/core.py", clamp_line)) == {
        "tests/test_core.py::test_clamp_inside", "tests/test_core.py::test_clamp_low",
        "tests/test_core.py::test_clamp_high"}
    # cached next to the repo: a second call reads it back
    assert asyncio.run(record_coverage(example_snapshot)) == cmap


def test_selection_keeps_every_failing_test_example(example_snapshot):
    assert _check_selection_keeps_every_failure(example_snapshot, n=12, seed=0) >= 6


@pytest.mark.slow
def test_selection_keeps_every_failing_test_real_package(looprl_home):
    from looprl.tasks.sources import fetch_package

    snap = fetch_package("inflection==0.5.1")  # ~480 tests, one module
    assert _check_selection_keeps_every_failure(snap, n=8, seed=1) >= 3


def test_pass_to_pass_fill_is_spread_and_bounded():
    from looprl.tasks.build import _spread

    items = [f"t{i}" for i in range(10)]
    assert _spread(items, 20) == items
    assert _spread(items, 5) == ["t0", "t2", "t4", "t6", "t8"]
    assert _spread(items, 0) == [] and _spread(items, -3) == []
