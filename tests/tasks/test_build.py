"""The task pipeline on the offline example package: screening in sandboxes, task repos, gold
patches, validation through the harness's OracleAgent."""

import asyncio
from pathlib import Path

import pytest

from looprl.rewards.tests import grade
from looprl.tasks import mutate
from looprl.tasks.build import BuildConfig, Screened, Screener, abuild_package_tasks, make_task

pytestmark = pytest.mark.slow  # builds and validates real tasks in sandboxes (~30-60 s)


@pytest.fixture(scope="module")
def built(example_snapshot):
    cfg = BuildConfig(max_tasks=4, budget_s=40, validate="oracle", seed=1)
    seen = []
    tasks = asyncio.run(abuild_package_tasks(example_snapshot, cfg,
                                             lambda what, n: seen.append(what)))
    return tasks, seen, cfg


def test_builds_validated_tasks_of_three_kinds(built, example_snapshot):
    tasks, seen, _ = built
    kinds = {t.metadata["source_kind"] for t in tasks}
    assert kinds == {"mutation", "multi_site", "feature_deletion"}
    assert seen.count("validated") >= len(tasks) and "tried" in seen
    for t in tasks:
        assert 1 <= len(t.grader.fail_to_pass) <= 25
        assert not set(t.grader.fail_to_pass) & set(t.grader.pass_to_pass)
        assert set(t.grader.fail_to_pass) <= set(example_snapshot.passing_tests)
        assert t.metadata["validated"] == "oracle" and t.metadata["untouched_score"] == 0.0
        # screening graded the untouched task repo and left pytest's bytecode for later runs
        assert list(Path(t.repo, "tests", "__pycache__").glob("*-pytest-*.pyc"))
        assert t.metadata["lines_changed"] >= 1 and t.metadata["prompt_chars"] == len(t.prompt)
        assert "@@" not in t.prompt and "def test" not in t.prompt
        # the task repo carries the bug; the package's pristine repo does not
        f = t.metadata["files"].split(",")[0]
        assert (Path(t.repo) / f).read_text() != (Path(example_snapshot.repo) / f).read_text()


def test_untouched_task_fails_and_gold_passes(built):
    tasks, _, _ = built
    t = tasks[0]
    assert asyncio.run(grade(t, "")).score == 0.0
    assert asyncio.run(grade(t, t.gold_patch)).score == 1.0


def test_only_tasks_keep_repos(built, example_snapshot):
    """Rejected mutations and singles screened only to be combined leave nothing behind."""
    from looprl.tasks.build import package_root

    tasks, _, _ = built
    dirs = {p.name for p in package_root(example_snapshot).iterdir() if p.is_dir()}
    assert dirs == {t.id for t in tasks}


def test_second_build_is_served_from_cache(built, example_snapshot):
    tasks, _, cfg = built
    again = asyncio.run(abuild_package_tasks(example_snapshot, cfg, None))
    assert [t.id for t in again] == [t.id for t in tasks]


def test_screening_rejects_mutations_no_test_notices(example_snapshot):
    cfg = BuildConfig(workers=1)
    src = Path(example_snapshot.repo, "src/minicalc/core.py").read_text()
    # changing a docstring-free default nobody tests beyond 'sep' keeps tests green: rejected
    muts = mutate.candidates(src, "src/minicalc/core.py", ("change_default",))
    start_default = next(m for m in muts if m.functions == ("running_total",))
    clamp_flip = next(m for m in mutate.candidates(src, "src/minicalc/core.py", ("compare_flip",))
                      if m.functions == ("clamp",))

    async def go():
        async with Screener(example_snapshot, cfg) as sc:
            return await sc.screen(start_default), await sc.screen(clamp_flip)

    unnoticed, caught = asyncio.run(go())
    assert unnoticed is None or unnoticed.fail_to_pass  # noticed only if a test pins the default
    assert isinstance(caught, Screened)
    assert set(caught.fail_to_pass) <= {"tests/test_core.py::test_clamp_inside",
                                        "tests/test_core.py::test_clamp_low",
                                        "tests/test_core.py::test_clamp_high"}
    assert len(caught.pass_to_pass) == 14 - len(caught.fail_to_pass)
    task = make_task(example_snapshot, caught, Path(example_snapshot.repo).parent / "t",
                     {"src/minicalc/core.py": src})
    assert task.metadata["mutation_kind"] == "compare_flip"



def _screened_clamp_flip(snap) -> Screened:
    """The screened compare_flip mutation of ``clamp`` (caught by its tests)."""
    src = Path(snap.repo, "src/minicalc/core.py").read_text()
    flip = next(m for m in mutate.candidates(src, "src/minicalc/core.py", ("compare_flip",))
                if m.functions == ("clamp",))

    async def screened():
        async with Screener(snap, BuildConfig(workers=1)) as sc:
            return await sc.screen(flip)

    return asyncio.run(screened())


def test_validation_grades_the_untouched_task_with_its_real_grader(example_snapshot, monkeypatch):
    """Screening's run differs from the grader's (test order, --maxfail); an order-dependent
    suite can make a mutation look caught in screening and pass in grading. Such a task is
    dropped: here a screened mutation whose fail_to_pass is a test that passes untouched."""
    from looprl.tasks import build

    good = _screened_clamp_flip(example_snapshot)
    flip = good.mutation
    assert isinstance(good, Screened)
    # the same mutation claimed to break a test it does not break (order-dependence, simulated)
    bad = Screened(flip, good.pass_to_pass[:1], good.pass_to_pass[1:], {})

    async def fake_screen(snap, cfg, progress=None):
        return [bad]

    monkeypatch.setattr(build, "screen_package", fake_screen)
    cfg = BuildConfig(max_tasks=1, validate="patch", seed=99)
    assert asyncio.run(abuild_package_tasks(example_snapshot, cfg, None)) == []
    monkeypatch.setattr(build, "screen_package", lambda *a, **k: _const([good]))
    kept = asyncio.run(abuild_package_tasks(example_snapshot, BuildConfig(max_tasks=1, validate="patch",
                                                                          seed=98), None))
    assert [t.metadata["untouched_score"] for t in kept] == [0.0]


async def _const(x):
    return x


def test_a_rejecting_build_keeps_repos_another_cached_set_lists(example_snapshot, monkeypatch,
                                                               capsys):
    """Task repos are shared by every build config of a package. Validation can pass in one
    build and fail in another (timing); the failing build used to remove the repo the other's
    cached set lists, so loading that set later failed on a missing file. A cached set whose
    repos are gone anyway is rebuilt."""
    import shutil

    from looprl.tasks import build

    good = _screened_clamp_flip(example_snapshot)
    flip = good.mutation
    bad = Screened(flip, good.pass_to_pass[:1], good.pass_to_pass[1:], {})  # fails validation
    cfg_a = BuildConfig(max_tasks=1, validate="patch", seed=97)
    monkeypatch.setattr(build, "screen_package", lambda *a, **k: _const([good]))
    [task] = asyncio.run(abuild_package_tasks(example_snapshot, cfg_a, None))
    monkeypatch.setattr(build, "screen_package", lambda *a, **k: _const([bad]))
    cfg_b = BuildConfig(max_tasks=1, validate="patch", seed=96)
    assert asyncio.run(abuild_package_tasks(example_snapshot, cfg_b, None)) == []
    assert Path(task.repo).is_dir(), "the other config's cached task lost its repo"
    assert [t.id for t in asyncio.run(abuild_package_tasks(example_snapshot, cfg_a, None))] == [
        task.id]

    shutil.rmtree(Path(task.repo).parent)  # gone by hand: the cached set is rebuilt
    monkeypatch.setattr(build, "screen_package", lambda *a, **k: _const([good]))
    again = asyncio.run(abuild_package_tasks(example_snapshot, cfg_a, None))
    assert [t.id for t in again] == [task.id] and Path(again[0].repo).is_dir()
    assert "task repos listed in" in capsys.readouterr().err


def test_a_count_budget_keeps_the_same_mutations_whatever_finishes_first(example_snapshot,
                                                                          monkeypatch):
    """With ``max_tries`` the candidates screened and kept depend on the config alone: two
    screenings whose sandboxes finish in different orders keep the same mutations."""
    import random

    from looprl.tasks import build

    real = build.Screener.screen
    cfg = BuildConfig(max_tasks=3, mix={"mutation": 1.0}, max_tries=6, budget_s=600, seed=3)

    def screened(delays: random.Random) -> list[str]:
        async def slow_screen(self, m):
            await asyncio.sleep(delays.random() * 0.3)  # finish order differs run to run
            return await real(self, m)

        monkeypatch.setattr(build.Screener, "screen", slow_screen)
        out = asyncio.run(build.screen_package(example_snapshot, cfg))
        keep = build.listed_task_ids(build.package_root(example_snapshot))
        for s in out:  # screened only: their repos go, as a build that rejected them would
            build.remove_task_repo(build.package_root(example_snapshot),
                                   build.task_id_of(example_snapshot, s.mutation), keep)
        return [s.mutation.id for s in out]

    first, second = screened(random.Random(1)), screened(random.Random(2))
    assert first and first == second
