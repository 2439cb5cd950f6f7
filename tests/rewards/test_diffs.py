"""Unified diffs: parse what real tools emit, and apply patches back exactly."""

import difflib
import random
import shutil
import subprocess

import pytest

from looprl.errors import RewardError
from looprl.rewards.diffs import apply_patch, lines_changed, parse_diff, touched_paths


def _udiff(old: str, new: str, path: str = "m.py", n: int = 3) -> str:
    out = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                               f"a/{path}", f"b/{path}", n=n)
    # difflib does not mark a missing final newline; add git's marker like real tools do
    text = ""
    for line in out:
        text += line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
    return text


def _mutate(rng: random.Random, lines: list[str]) -> list[str]:
    out = list(lines)
    for _ in range(rng.randint(1, 6)):
        op = rng.choice(["ins", "del", "mod"])
        i = rng.randrange(len(out) + 1)
        if op == "ins" or not out:
            out.insert(i, f"new {rng.random():.6f}")
        elif op == "del":
            out.pop(min(i, len(out) - 1))
        else:
            out[min(i, len(out) - 1)] = f"mod {rng.random():.6f}"
    return out


@pytest.mark.parametrize("seed", range(60))
def test_apply_round_trips_random_edits(seed):
    rng = random.Random(seed)
    lines = [f"line {i % 7}" for i in range(rng.randint(0, 40))]  # repeats: context is ambiguous
    new_lines = _mutate(rng, lines)
    old = "\n".join(lines) + ("\n" if lines and rng.random() < 0.8 else "")
    new = "\n".join(new_lines) + ("\n" if new_lines and rng.random() < 0.8 else "")
    if old == new:
        return
    for n in (0, 3):
        (fp,) = parse_diff(_udiff(old, new, n=n))
        assert apply_patch(old, fp) == new


def test_created_deleted_and_multi_file():
    d = _udiff("", "x = 1\n", "pkg/new.py") + _udiff("a\nb\n", "a\nc\n", "pkg/m.py")
    d = d.replace("--- a/pkg/new.py", "--- /dev/null", 1)
    d += "--- a/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-one\n-two\n"
    fps = parse_diff(d)
    assert [(fp.old_path, fp.new_path) for fp in fps] == [
        (None, "pkg/new.py"), ("pkg/m.py", "pkg/m.py"), ("old.py", None)]
    assert apply_patch("", fps[0]) == "x = 1\n"
    assert apply_patch("one\ntwo\n", fps[2]) == ""
    assert touched_paths(d) == ("pkg/new.py", "pkg/m.py", "old.py")
    assert lines_changed(d) == 1 + 2 + 2


@pytest.mark.skipif(shutil.which("diff") is None, reason="diffutils not installed")
def test_parses_diff_ruN_output(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "m.py").write_text("def f():\n    return 1\n")
    (tmp_path / "b" / "m.py").write_text("def f():\n    return 2\n")
    (tmp_path / "b" / "tests").mkdir()
    (tmp_path / "b" / "tests" / "test_m.py").write_text("def test():\n    pass\n")
    out = subprocess.run(["diff", "-ruN", "a", "b"], cwd=tmp_path, capture_output=True,
                         text=True).stdout
    fps = {fp.path: fp for fp in parse_diff(out)}  # '--- a/m.py<TAB>timestamp' -> 'm.py'
    assert set(fps) == {"m.py", "tests/test_m.py"}
    assert apply_patch("", fps["tests/test_m.py"]) == "def test():\n    pass\n"
    assert apply_patch("def f():\n    return 1\n", fps["m.py"]) == "def f():\n    return 2\n"


def test_rename_without_content_is_a_touched_path():
    d = ("diff --git a/tests/test_x.py b/tests/test_y.py\nsimilarity index 100%\n"
         "rename from tests/test_x.py\nrename to tests/test_y.py\n")
    assert touched_paths(d) == ("tests/test_x.py", "tests/test_y.py")


def test_errors_on_mismatch_and_truncation():
    (fp,) = parse_diff(_udiff("a\nb\n", "a\nc\n"))
    with pytest.raises(RewardError, match="does not apply"):
        apply_patch("x\ny\n", fp)
    with pytest.raises(RewardError, match="truncated"):
        parse_diff("--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n-b\n")


def test_empty_diff():
    assert parse_diff("") == () and lines_changed("") == 0


def test_git_style_headers_binary_and_mode_only():
    d = ("diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
         "diff --git a/img.png b/img.png\nnew file mode 100644\n"
         "Binary files /dev/null and b/img.png differ\n"
         "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n"
         "@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+y\n")
    fps = parse_diff(d)
    assert [(fp.old_path, fp.new_path, fp.binary) for fp in fps] == [
        ("run.sh", "run.sh", False), (None, "img.png", True), ("pkg/m.py", "pkg/m.py", False)]
    assert apply_patch("x", fps[2]) == "y\n"  # the edit also added the final newline
    with pytest.raises(RewardError, match="binary"):
        apply_patch("", fps[1])
