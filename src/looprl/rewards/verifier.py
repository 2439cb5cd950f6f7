"""The verifier grader kind: a script that grades the final workspace by writing a reward file
(Harbor's contract: ``tests/test.sh``, uploaded to ``/tests``, writes ``/logs/verifier/
reward.json`` or ``reward.txt``; its output goes to ``/logs/verifier/test-stdout.txt``).

``rewards.tests.grade`` grades a task whose ``grader.verifier`` is set with the pieces here, in a
fresh copy-on-write sandbox over the task's base with the agent's graded diff applied (Harbor's
``environment_mode = "separate"`` with the workspace as the artifact, whatever the task says):

    with verifier_logs() as logs:                         # a fresh host dir, mounted at /logs
        sb = await create_sandbox(task.repo, venv=..., workdir=v.workdir, image=task.image,
                                  mounts=verifier_mounts(v, logs))   # pristine /tests, read-only
        await sb.exec(verifier_command(v), env=v.env, timeout_s=...)
        reward = read_reward(logs)          # Reward(score, metrics); RewardFileError otherwise

The reward file: ``reward.json`` (read first, as Harbor does) holds a number, or an object of
numbers whose ``reward`` key is the score and whose other keys are metrics; ``reward.txt`` holds
one number. The score must be finite and in [0, 1] (looprl's tests term). Anything else — no
file, an empty one, not a number, a link — is a ``RewardFileError`` naming what was wrong: the
caller decides whose fault it is (the agent's diff, when the untouched base scores; the task's,
when it does not), never a silent 0.

A symlink the diff makes that points out of the workspace is left out of the graded diff
(``links_out``, flagged ``link_out_of_workspace``). What this does NOT protect against: the code under test runs as the same user as ``test.sh``
and can write the reward file itself; ``reward_writes`` flags a diff that names the reward
files or their directory (scored 0 as ``runner_tampering``), not one that builds the path at
run time. ``/tests`` is read-only and the host reads ``/logs`` through ``beneath.Root`` (no link
followed), so neither the verifier's files nor the host's are reachable that way.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import posixpath
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from looprl.diffs import SYMLINK, parse_diff
from looprl.sandbox.beneath import Root
from looprl.sandbox.mounts import Mount
from looprl.types import Verifier

TESTS_AT = "/tests"
LOGS_AT = "/logs"
REWARD_JSON = "verifier/reward.json"
REWARD_TXT = "verifier/reward.txt"
STDOUT = "verifier/test-stdout.txt"
"""Paths under ``LOGS_AT`` (Harbor's ``EnvironmentPaths``)."""
MAX_REWARD_BYTES = 1 << 20
_REWARD_RE = re.compile(r"/logs/verifier|\breward\.(txt|json)\b")


class RewardFileError(ValueError):
    """The verifier left no usable reward file; the message says what it left instead."""


@dataclass(frozen=True)
class Reward:
    """What a reward file says."""

    score: float
    metrics: dict[str, float] = field(default_factory=dict)
    """reward.json's other keys."""


def _score(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RewardFileError(f"{where} is {value!r}, not a number")
    if not math.isfinite(value):
        raise RewardFileError(f"{where} is {value!r}, not a finite number")
    return float(value)


def parse_reward(json_bytes: bytes | None, txt_bytes: bytes | None) -> Reward:
    """The reward of ``reward.json``'s bytes if given (None: no such file), else ``reward.txt``'s.

    >>> parse_reward(b'{"reward": 0.5, "passed": 3}', None)
    Reward(score=0.5, metrics={'passed': 3.0})
    >>> parse_reward(None, b"1\\n").score
    1.0
    >>> parse_reward(None, None)
    Traceback (most recent call last):
    ...
    looprl.rewards.verifier.RewardFileError: test.sh wrote neither /logs/verifier/reward.json nor /logs/verifier/reward.txt
    >>> parse_reward(b'{"score": 1}', None)
    Traceback (most recent call last):
    ...
    looprl.rewards.verifier.RewardFileError: reward.json has no 'reward' key (it has: score); looprl's score is the 'reward' key
    """
    if json_bytes is not None:
        if not json_bytes.strip():
            raise RewardFileError("reward.json is empty")
        try:
            data = json.loads(json_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RewardFileError(f"reward.json is not JSON ({e})") from None
        if isinstance(data, dict):
            if "reward" not in data:
                raise RewardFileError(f"reward.json has no 'reward' key (it has: "
                                      f"{', '.join(map(str, data)) or 'nothing'}); looprl's "
                                      "score is the 'reward' key")
            metrics = {str(k): _score(v, f"reward.json's {k!r}") for k, v in data.items()
                       if k != "reward"}
            score = _score(data["reward"], "reward.json's 'reward'")
        else:
            score, metrics = _score(data, "reward.json"), {}
    elif txt_bytes is not None:
        text = txt_bytes.decode("utf-8", "replace").strip()
        if not text:
            raise RewardFileError("reward.txt is empty")
        try:
            value = float(text)
        except ValueError:
            raise RewardFileError(f"reward.txt holds {text[:80]!r}, not a number") from None
        score, metrics = _score(value, "reward.txt"), {}
    else:
        raise RewardFileError(f"test.sh wrote neither {LOGS_AT}/{REWARD_JSON} nor "
                              f"{LOGS_AT}/{REWARD_TXT}")
    if not 0.0 <= score <= 1.0:
        raise RewardFileError(f"the reward is {score:g}, outside [0, 1]: looprl's tests term is a "
                              "score in [0, 1] (write the raw value as another reward.json key)")
    return Reward(score, metrics)


def _read(root: Root, rel: str) -> bytes | None:
    """The file's bytes, None when absent; a link, directory or oversized file is an error."""
    st = root.lstat(rel)
    if st is None:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise RewardFileError(f"{LOGS_AT}/{rel} is not a regular file")
    if st.st_size > MAX_REWARD_BYTES:
        raise RewardFileError(f"{LOGS_AT}/{rel} is {st.st_size} bytes; a reward file is a number")
    try:
        return root.read(rel)
    except OSError as e:
        raise RewardFileError(f"{LOGS_AT}/{rel} cannot be read ({e.strerror})") from None


def read_reward(logs: Path) -> Reward:
    """The reward the verifier wrote under ``logs`` (the host side of ``/logs``)."""
    with Root(logs) as root:
        return parse_reward(_read(root, REWARD_JSON), _read(root, REWARD_TXT))


def output_tail(logs: Path, n: int = 2000) -> str:
    """The end of ``test-stdout.txt`` ('' when the verifier left none)."""
    with Root(logs) as root:
        try:
            return root.read(STDOUT, last=n).decode("utf-8", "replace")
        except OSError:
            return ""


@contextlib.contextmanager
def verifier_logs() -> Iterator[Path]:
    """A fresh host directory for one verifier run's ``/logs`` (with ``verifier/`` made), writable
    by the sandbox's user; removed afterwards. Its parent is root's and private (mode 0700): the
    open modes reach only the sandbox it is mounted into."""
    parent = Path(tempfile.mkdtemp(prefix="looprl-verifier-"))
    try:
        logs = parent / "logs"
        for d in (logs, logs / "verifier"):
            d.mkdir()
            d.chmod(0o777)
        yield logs
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def verifier_mounts(v: Verifier, logs: Path) -> tuple[Mount, ...]:
    """The pristine tests read-only at ``/tests``, ``logs`` writable at ``/logs``."""
    return (Mount(v.tests_dir, TESTS_AT, readonly=True), Mount(str(logs), LOGS_AT, readonly=False))


def verifier_command(v: Verifier) -> str:
    """Run ``test.sh`` as Harbor does (executed, so its ``#!`` line picks the interpreter; by bash
    when the file is not executable), its output to ``test-stdout.txt``."""
    script = Path(v.tests_dir) / "test.sh"
    run = f"{TESTS_AT}/test.sh" if os.access(script, os.X_OK) else f"bash {TESTS_AT}/test.sh"
    return f"{run} > {LOGS_AT}/{STDOUT} 2>&1"


def reward_writes(diff: str) -> tuple[str, ...]:
    """Lines the diff adds that name the reward files or their directory: code of the workspace
    writing its own reward (``runner_tampering``).

    >>> reward_writes("--- a/m.py\\n+++ b/m.py\\n@@ -1 +1 @@\\n-x\\n+open('/logs/verifier/reward.txt', 'w')\\n")
    ("open('/logs/verifier/reward.txt', 'w')",)
    """
    return tuple(ln for fp in parse_diff(diff) for ln in fp.added_lines if _REWARD_RE.search(ln))


def links_out(diff: str) -> tuple[str, ...]:
    r"""Paths the diff makes symlinks pointing out of the workspace (absolute, or up past its
    root): the grader leaves them out (Harbor's separate verifier skips such links in the
    artifacts it uploads too), so a workspace link cannot reach the verifier's /tests.

    >>> links_out("diff --git a/x b/x\nnew file mode 120000\n--- /dev/null\n+++ b/x\n"
    ...           "@@ -0,0 +1 @@\n+/tests/answer.txt\n\\ No newline at end of file\n")
    ('x',)
    """
    out = []
    for fp in parse_diff(diff):
        if fp.new_mode != SYMLINK or fp.new_path is None:
            continue
        target = "".join(ln for h in fp.hunks for ln in h.new_lines)
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(fp.new_path), target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            out.append(fp.new_path)
    return tuple(out)
