"""Git diffs (``looprl.diffs``): what it writes real git applies byte for byte, whatever the
workspace holds; it parses what real tools emit and applies patches back exactly."""

import difflib
import doctest
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from looprl import diffs
from looprl.diffs import (
    EXECUTABLE,
    MAX_BLOB_BYTES,
    REGULAR,
    SYMLINK,
    apply_patch,
    blob_diff,
    changed_files,
    lines_changed,
    parse_diff,
    quote_path,
    split_lines,
    touched_paths,
    unified_diff,
    unquote_path,
)
from looprl.errors import DiffError


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
    with pytest.raises(DiffError, match="does not apply"):
        apply_patch("x\ny\n", fp)
    with pytest.raises(DiffError, match="truncated"):
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
    with pytest.raises(DiffError, match="binary"):
        apply_patch("", fps[1])


def test_changed_files_handles_new_and_deleted_files():
    d = ("--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n"
         "--- a/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
    assert changed_files(d) == ("new.py", "old.py")
    assert changed_files("") == ()


def test_changed_files_is_not_fooled_by_header_like_hunk_lines():
    d = ("--- a/notes.md\n+++ b/notes.md\n@@ -1 +1 @@\n--- a/fake\n+++ b/fake\n"
         "--- a/real.py\n+++ b/real.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert changed_files(d) == ("notes.md", "real.py")


# ------------------------------------------------------------------ git's lines, git's format

SPLITLINES_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""Where ``str.splitlines()`` breaks a line and git does not."""


def test_lines_end_at_newline_only():
    text = "".join(f"a{c}b\n" for c in SPLITLINES_BREAKS) + "tail"
    assert split_lines(text) == [f"a{c}b\n" for c in SPLITLINES_BREAKS] + ["tail"]
    assert len(text.splitlines()) > len(split_lines(text))  # what the old parsers did


@pytest.mark.parametrize("char", list(SPLITLINES_BREAKS), ids=lambda c: f"U+{ord(c):04X}")
def test_a_line_holding_a_splitlines_break_round_trips(char):
    old = "def f():\n    return 1\n"
    new = f"def f():\n    return 2  # x{char}y\n\n{char}\n# end\n"
    d = unified_diff("m.py", old, new) + unified_diff("n.py", "a\n", "b\n")
    fps = parse_diff(d)
    assert [fp.path for fp in fps] == ["m.py", "n.py"]  # the second file is not swallowed
    assert apply_patch(old, fps[0]) == new
    assert lines_changed(d) == 1 + 4 + 2


@pytest.mark.parametrize("name", ["a b.py", "tab\there", "new\nline", 'q"uote', "back\\slash",
                                  "caf\u00e9.py", "bad\udcffbyte"])
def test_quoted_paths_round_trip(name):
    assert unquote_path(quote_path(name)) == name
    assert "\n" not in quote_path(name) and "\t" not in quote_path(name)
    (fp,) = parse_diff(unified_diff(name, "a\n", "b\n"))
    assert fp.old_path == fp.new_path == name


def test_type_changes_are_a_deletion_and_a_creation():
    d = blob_diff("t.py", (b"x = 1\n", REGULAR), (b"../f", SYMLINK))
    old, new = parse_diff(d)
    assert (old.old_path, old.new_path, old.old_mode) == ("t.py", None, REGULAR)
    assert (new.old_path, new.new_path, new.new_mode) == (None, "t.py", SYMLINK)
    assert blob_diff("run", (b"x", REGULAR), (b"x", EXECUTABLE)) == (
        "diff --git a/run b/run\nold mode 100644\nnew mode 100755\n")


def test_binary_and_oversized_content():
    (fp,) = parse_diff(blob_diff("b.bin", None, (bytes(range(256)), REGULAR)))
    assert fp.binary and fp.carried and "GIT binary patch" in fp.text
    (fp,) = parse_diff(blob_diff("big.txt", None, (b"x\n" * MAX_BLOB_BYTES, REGULAR)))
    assert fp.binary and not fp.carried and len(fp.text) < 200
    (fp,) = parse_diff(blob_diff("big.txt", (b"x\n" * MAX_BLOB_BYTES, REGULAR), None))
    assert fp.new_path is None and fp.carried and len(fp.text) < 200  # a deletion is carried


def test_patches_give_back_the_diff_they_came_from():
    d = (unified_diff("a.py", "x\n", "y\n") + blob_diff("l", None, (b"a.py", SYMLINK))
         + blob_diff("b.bin", (b"\0", REGULAR), (b"\1\0", REGULAR)) + _udiff("p\n", "q\n", "plain.py")
         + unified_diff("c", "1\n", None))
    fps = parse_diff(d)
    assert [fp.path for fp in fps] == ["a.py", "l", "b.bin", "plain.py", "c"]
    assert "".join(fp.text for fp in fps) == d
    with pytest.raises(DiffError, match="file mode"):
        parse_diff("diff --git a/x b/x\nnew file mode 10x644\n")


# ------------------------------------------------------------------ against real git

WEIRD = ["ab", "x = 1", "\t", " ", "\u00e9", "\r\n", "\\", '"', *SPLITLINES_BREAKS]
NAMES = ["m.py", "a b.py", "tab\there", "nl\nx", 'q"uote', "back\\s", "caf\u00e9.py", "-dash",
         "d/x.py"]


def _content(rng: random.Random) -> tuple[bytes, int]:
    r = rng.random()
    if r < 0.12:
        return rng.choice([b"m.py", b"../x", b"t\xc3\xa9", b"t\xe9"]), SYMLINK
    if r < 0.25:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))), REGULAR
    if r < 0.3:
        return rng.choice([b"a\0b\n", "caf\xe9\n".encode("latin-1")]), REGULAR
    lines = ["".join(rng.choice(WEIRD) for _ in range(rng.randint(0, 4)))
             for _ in range(rng.randint(0, 12))]
    text = "\n".join(lines) + ("\n" if lines and rng.random() < 0.7 else "")
    return text.encode(), EXECUTABLE if rng.random() < 0.1 else REGULAR


def _write(root: Path, tree: dict[str, tuple[bytes, int]]) -> None:
    for name, (data, mode) in tree.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if mode == SYMLINK:
            os.symlink(os.fsdecode(data), p)
        else:
            p.write_bytes(data)
            p.chmod(0o755 if mode == EXECUTABLE else 0o644)


def _read(root: Path) -> dict[str, tuple[bytes, int]]:
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = (os.fsencode(os.readlink(p)), SYMLINK)
            else:
                out[rel] = (p.read_bytes(), EXECUTABLE if p.stat().st_mode & 0o111 else REGULAR)
    for dirpath, dirnames, _ in os.walk(root):  # links to directories too
        for name in dirnames:
            p = Path(dirpath) / name
            if p.is_symlink():
                out[str(p.relative_to(root))] = (os.fsencode(os.readlink(p)), SYMLINK)
    return out


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_deletes_and_shrinks_a_file_over_the_limit(tmp_path):
    big = b"line\n" * (MAX_BLOB_BYTES // 4)
    (tmp_path / "gone.txt").write_bytes(big)
    (tmp_path / "shrunk.txt").write_bytes(big)
    d = blob_diff("gone.txt", (big, REGULAR), None) + blob_diff("shrunk.txt", (big, REGULAR),
                                                                 (b"short\n", REGULAR))
    assert len(d) < 1000
    (tmp_path.parent / "p.diff").write_bytes(d.encode())
    r = subprocess.run(["git", "apply", str(tmp_path.parent / "p.diff")], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "gone.txt").exists()
    assert (tmp_path / "shrunk.txt").read_bytes() == b"short\n"


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
@pytest.mark.parametrize("seed", range(40))
def test_git_apply_reproduces_every_blob_diff(tmp_path, seed):
    rng = random.Random(seed)
    old = {n: _content(rng) for n in rng.sample(NAMES, 6)}
    new = {n: v for n, v in old.items() if rng.random() < 0.4}
    new.update({n: _content(rng) for n in rng.sample(NAMES, 5) if n not in new})
    d = "".join(blob_diff(p, old.get(p), new.get(p)) for p in sorted({*old, *new}))
    if not d:
        return
    work = tmp_path / "work"
    _write(work, old)
    (tmp_path / "p.diff").write_bytes(d.encode())
    r = subprocess.run(["git", "apply", "--whitespace=nowarn", "../p.diff"], cwd=work,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _read(work) == new
    for fp in parse_diff(d):  # and the pure-Python apply agrees on the text patches
        if fp.hunks and SYMLINK not in (fp.old_mode, fp.new_mode) and not fp.binary:
            before = old[fp.old_path][0].decode() if fp.old_path else ""
            assert apply_patch(before, fp) == (new[fp.new_path][0].decode() if fp.new_path else "")


def test_the_doctests_run():
    result = doctest.testmod(diffs)
    assert result.attempted > 5 and result.failed == 0
