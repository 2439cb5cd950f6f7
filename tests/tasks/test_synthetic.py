"""Synthetic SFT demos: mutations of source packages' functions, solved by the oracle through
the harness in real sandboxes, each checked to restore the pristine file."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from looprl.chat import ChatFormat
from looprl.errors import TaskError
from looprl.models.tokenizer import build_tokenizer
from looprl.tasks import mutate
from looprl.tasks.demos import expected_files, matches, oracle_demos
from looprl.tasks.synthetic import synthetic_repos, synthetic_tasks
from tests.bwrap_support import needs_bwrap
from tests.example_package import CORE

TOOLS = ("grep", "read_file", "edit_file", "finish")
VERIFYING_TOOLS = (*TOOLS, "run_tests")


@pytest.fixture
def corpus(tmp_path):
    """Source repositories laid out as ``models.corpus`` makes them: minicalc (the task package),
    helpers, and tiny (too few files)."""
    root = tmp_path / "corpus"
    for name in ("minicalc", "helpers"):
        pkg = root / name / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "core.py").write_text(CORE)
        (pkg / "more.py").write_text(CORE.replace("def ", "def more_"))
    (root / "tiny" / "tiny").mkdir(parents=True)
    (root / "tiny" / "tiny" / "__init__.py").write_text("")
    return sorted(root.iterdir())


def test_repos_exclude_task_packages_and_tiny_ones(corpus):
    repos = synthetic_repos(exclude=["minicalc==0.1"], repos=corpus)
    assert [r.name for r in repos] == ["helpers"]
    assert (repos[0] / "helpers" / "core.py").read_text() == CORE  # paths keep the package dir
    with pytest.raises(TaskError, match="no source repositories"):
        synthetic_repos(exclude=["minicalc", "helpers"], repos=corpus)


def test_items_are_public_single_site_and_balanced(corpus, looprl_home):
    repos = synthetic_repos(repos=corpus)
    items = synthetic_tasks(repos, 12, seed=1)
    assert len(items) == 8 and len({i.task.id for i in items}) == 8  # 2 a file, 4 files
    for i in items:
        (fn,) = i.task.metadata["functions"].split(",")
        assert not fn.startswith("_") and i.task.metadata["mutation_kind"] in mutate.LOCAL_KINDS
        assert fn.split(".")[-1] in i.task.prompt  # the prompt names the function
        (path,) = i.files
        pristine = (Path(i.task.repo) / path).read_text()
        assert mutate.parses(i.files[path]) and i.files[path] != pristine
        assert expected_files(i.task, i.files) == {path: pristine}  # the gold patch undoes it
    kinds = Counter(i.task.metadata["mutation_kind"] for i in items)
    assert max(kinds.values()) - min(kinds.values()) <= 2, kinds


@pytest.mark.parametrize("kind", [pytest.param("bwrap", marks=needs_bwrap)])
def test_oracle_demos_undo_the_bug_through_the_harness(corpus, looprl_home, kind):
    repos = synthetic_repos(repos=corpus)
    items = synthetic_tasks(repos, 6, seed=2)
    tok = build_tokenizer(None)
    demos = asyncio.run(oracle_demos([(i.task, i.files) for i in items], tok, tools=TOOLS))
    assert len(demos) == 6
    for d in demos:
        names = [m["name"] for m in d.messages if m["role"] == "tool"]
        assert names[0] == "grep" and names[-2:] == ["edit_file", "finish"], names
        assert d.segments[0].num_model_tokens > 0
        prompt = ChatFormat(tok).decode(list(d.segments[0].token_ids_T))
        assert '"name": "grep"' in prompt and '"name": "run_terminal"' not in prompt


@pytest.mark.parametrize("kind", [pytest.param("bwrap", marks=needs_bwrap)])
def test_a_demo_that_does_not_reach_the_gold_state_is_dropped(corpus, looprl_home, kind):
    import dataclasses

    repos = synthetic_repos(repos=corpus)
    (item,) = synthetic_tasks(repos, 1, seed=3)
    (path,) = item.files
    pristine = (Path(item.task.repo) / path).read_text()
    tok = build_tokenizer(None)
    assert asyncio.run(oracle_demos([(item.task, item.files)], tok, tools=TOOLS))
    # a gold patch that does not undo the bug: the oracle's edit leaves the wrong state
    half = dataclasses.replace(item.task, gold_patch=mutate.gold_patch(
        {path: item.files[path]}, {path: item.files[path].replace("\n", "\n\n", 1)}))
    assert not asyncio.run(oracle_demos([(half, item.files)], tok, tools=TOOLS)) or \
        expected_files(half, item.files)[path] != pristine
    from looprl.sandbox import create_sandbox

    async def check() -> tuple[bool, bool]:
        sb = await create_sandbox(item.task.repo)
        try:
            same = await matches(sb, {path: pristine})
            await sb.write(path, item.files[path].encode())
            return same, await matches(sb, {path: pristine})
        finally:
            await sb.close()

    assert asyncio.run(check()) == (True, False)


@pytest.mark.parametrize("kind", [pytest.param("bwrap", marks=needs_bwrap)])
def test_slip_demos_fail_once_then_fix_and_learn_only_the_fix(corpus, looprl_home, kind):
    repos = synthetic_repos(repos=corpus)
    items = synthetic_tasks(repos, 6, seed=2)
    tok = build_tokenizer(None)
    sources = [(i.task, i.files) for i in items]
    plain = asyncio.run(oracle_demos(sources, tok, tools=TOOLS))
    slipped = asyncio.run(oracle_demos(sources, tok, tools=TOOLS, slips=1.0, seed=5))
    assert len(slipped) == len(plain) == 6
    for p, d in zip(plain, slipped, strict=True):
        results = [(m["name"], m["content"]) for m in d.messages if m["role"] == "tool"]
        names = [n for n, _ in results]
        # the cut call comes back as an invalid call (counted as broken); the edit then works
        assert d.metadata["slip"] == "cut" and d.counters.broken_tool_calls == 1
        assert results[-3][1].startswith("Invalid tool call: unclosed <tool_call> block")
        assert names[-2:] == ["edit_file", "finish"] and results[-2][1].startswith("Edited")
        # SFT learns the same model tokens as the plain demo: the slip is context only
        seg, plain_seg = d.segments[0], p.segments[0]
        learned = [t for t, m in zip(seg.token_ids_T, seg.loss_mask_T, strict=True) if m]
        assert learned == [t for t, m in zip(plain_seg.token_ids_T, plain_seg.loss_mask_T,
                                              strict=True) if m]
        assert len(seg.token_ids_T) > len(plain_seg.token_ids_T)


@pytest.mark.parametrize("kind", [pytest.param("bwrap", marks=needs_bwrap)])
def test_verifying_demos_run_the_tests_between_edit_and_finish(corpus, looprl_home, kind):
    repos = synthetic_repos(repos=corpus)
    items = synthetic_tasks(repos, 4, seed=2)
    tok = build_tokenizer(None)
    sources = [(i.task, i.files) for i in items]
    plain = asyncio.run(oracle_demos(sources, tok, tools=VERIFYING_TOOLS))
    verified = asyncio.run(oracle_demos(sources, tok, tools=VERIFYING_TOOLS, verifies=1.0))
    assert len(verified) == len(plain) == 4
    for p, d in zip(plain, verified, strict=True):
        names = [m["name"] for m in d.messages if m["role"] == "tool"]
        plain_names = [m["name"] for m in p.messages if m["role"] == "tool"]
        assert names == [*plain_names[:-1], "run_tests", "finish"]
        assert d.metadata["verify"] == "run_tests" and "verify" not in p.metadata
        assert d.counters.broken_tool_calls == 0
    # a share is drawn per demo
    half = asyncio.run(oracle_demos(sources, tok, tools=VERIFYING_TOOLS, verifies=0.5, seed=1))
    assert {("verify" in d.metadata) for d in half} == {True, False}
