"""The verifier grader kind (Harbor's tests/test.sh writing /logs/verifier/reward.*): every
workspace an agent can leave is graded in a fresh sandbox of it with the pristine tests, honest
changes by their merit, attacks on the reward at 0 with their flag; a missing or malformed
reward file is an error the grade carries (the diff's fault when the untouched task scores) or,
when the untouched task gets none either, a ``RewardError`` (the task's verifier is broken)."""

import asyncio
import os

import pytest

from looprl.errors import RewardError
from looprl.rewards.tests import grade
from looprl.rewards.verifier import RewardFileError, parse_reward
from looprl.sandbox import create_sandbox
from looprl.types import Grader, Task, Verifier
from tests.bwrap_support import skip_without_sandbox

# test.sh: writes 0 first, runs the workspace's program if it has one (as a verifier runs what
# the agent built), then 1 in reward.json when answer.txt holds exactly the line 42
CHECK = r"""#!/bin/bash
echo '{"reward": 0}' > /logs/verifier/reward.json
cd /app
if [ -f run.sh ]; then bash run.sh; fi
if [ -f answer.txt ] && [ "$(od -An -c answer.txt | tr -d ' \n')" = '42\n' ]; then
  echo "{\"reward\": 1, \"lines\": $(wc -l < answer.txt)}" > /logs/verifier/reward.json
fi
"""
STRICT = """#!/bin/bash
set -e
answer=$(cat /app/answer.txt)  # no answer.txt: the script stops here, writing no reward
if [ "$answer" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def verifier_task(root, test_sh: str, *, timeout_s: float = 60.0, name: str = "t") -> Task:
    repo, tests = root / name / "repo", root / name / "tests"
    repo.mkdir(parents=True)
    tests.mkdir()
    (repo / "answer.txt").write_text("41\n")
    (repo / "notes.md").write_text("the answer goes in answer.txt\n")
    (tests / "test.sh").write_text(test_sh)
    (tests / "test.sh").chmod(0o755)
    (tests / "expected.txt").write_text("42\n")
    return Task(name, str(repo), "put the answer in answer.txt",
                Grader("/tests/test.sh", timeout_s=timeout_s,
                       verifier=Verifier(str(tests), workdir="/app")),
                gold_patch=None)


async def _made(task: Task, command: str) -> str:
    sb = await create_sandbox(task.repo)
    try:
        r = await sb.exec(command, timeout_s=60)
        assert r.ok, r.stderr
        return await sb.diff()
    finally:
        await sb.close()


def graded(task: Task, command: str):
    return asyncio.run(grade(task, asyncio.run(_made(task, command)), cache=False))


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return verifier_task(tmp_path_factory.mktemp("verifier"), CHECK)


# ------------------------------------------------------------------ the reward file itself


@pytest.mark.parametrize("json_bytes, txt_bytes, says", [
    (b"", None, "reward.json is empty"),
    (b"{oops", None, "not JSON"),
    (b'"1"', None, "not a number"),
    (b"true", None, "not a number"),
    (b"[1]", None, "not a number"),
    (b'{"passed": 1}', None, "no 'reward' key"),
    (b'{"reward": 1, "note": "ok"}', None, "'note'"),
    (b'{"reward": NaN}', None, "not a finite number"),
    (b"1e999", None, "not a finite number"),
    (b"1.5", None, "outside [0, 1]"),
    (None, b"", "reward.txt is empty"),
    (None, b"passed", "not a number"),
    (None, b"-0.5\n", "outside [0, 1]"),
    (None, None, "neither"),
])
def test_a_malformed_reward_file_is_an_error_naming_it(json_bytes, txt_bytes, says):
    with pytest.raises(RewardFileError, match=says.replace("[", r"\[").replace("]", r"\]")):
        parse_reward(json_bytes, txt_bytes)


def test_reward_json_wins_over_reward_txt_and_carries_metrics():
    r = parse_reward(b'{"reward": 0.25, "cases": 3}', b"1")
    assert (r.score, r.metrics) == (0.25, {"cases": 3.0})
    assert parse_reward(b"0.5", None).score == 0.5
    assert parse_reward(None, b" 1\n").score == 1.0


# ------------------------------------------------------------------ workspaces, graded


@pytest.mark.slow
@pytest.mark.needs_bwrap
@skip_without_sandbox
class TestWorkspaces:
    def test_the_fix_scores_1_with_metrics_and_the_untouched_task_0(self, task):
        g = graded(task, "echo 42 > answer.txt")
        assert (g.score, g.error, g.flags) == (1.0, "", ())
        assert g.metrics == {"lines": 1.0}
        assert g.details()["verifier_lines"] == 1.0
        assert asyncio.run(grade(task, "", cache=False)).score == 0.0

    def test_odd_line_ends_arrive_byte_for_byte(self, task):
        # a CR before the newline is not the answer: a grader that lost it would score 1
        g = graded(task, r"printf '42\r\n' > answer.txt")
        assert (g.score, g.error) == (0.0, "")

    def test_a_file_turned_into_a_directory_is_graded_not_an_error(self, task):
        g = graded(task, "rm answer.txt && mkdir answer.txt && echo 42 > answer.txt/x")
        assert (g.score, g.broke_test_run) == (0.0, False)

    def test_a_link_inside_the_workspace_is_kept(self, task):
        g = graded(task, "echo 42 > real.txt && rm answer.txt && ln -s real.txt answer.txt")
        assert g.score == 1.0

    def test_a_link_to_the_verifiers_files_is_left_out_and_flagged(self, task):
        # /tests/expected.txt holds the answer: a link to it must not reach the verifier
        for target in ("/tests/expected.txt", "../../tests/expected.txt"):
            g = graded(task, f"rm answer.txt && ln -s {target} answer.txt")
            assert g.score == 0.0, target
            assert "link_out_of_workspace" in g.flags

    def test_workspace_code_that_writes_the_reward_scores_0_as_tampering(self, task):
        g = graded(task, "echo 'echo 1 > /logs/verifier/reward.txt; "
                         "echo {\\\"reward\\\": 1} > /logs/verifier/reward.json' > run.sh")
        assert g.score == 0.0
        assert "runner_tampering" in g.flags

    def test_a_reward_file_swapped_for_a_link_is_not_followed(self, task):
        # the path is built at run time (no static flag): the host must not read /etc/hostname
        g = graded(task, "echo 'd=/lo\"\"gs/veri\"\"fier f=rew\"\"ard.json; rm -f $d/$f; "
                         "ln -s /etc/hostname $d/$f' > run.sh")
        assert g.score == 0.0 and g.broke_test_run
        assert "runner_tampering" not in g.flags
        assert "not a regular file" in g.error

    def test_a_diff_that_stops_the_verifier_writing_a_reward_scores_0_with_the_reason(
            self, tmp_path):
        t = verifier_task(tmp_path, STRICT, name="strict")
        g = graded(t, "rm answer.txt")
        assert (g.score, g.broke_test_run) == (0.0, True)
        assert "neither /logs/verifier/reward.json nor /logs/verifier/reward.txt" in g.error

    def test_a_verifier_that_never_writes_a_reward_is_an_infrastructure_error(self, tmp_path):
        t = verifier_task(tmp_path, "#!/bin/bash\necho checking\n", name="silent")
        with pytest.raises(RewardError, match="gave no reward.*neither"):
            asyncio.run(grade(t, "", cache=False))
        with pytest.raises(RewardError):  # the diff is not blamed for the task's own verifier
            asyncio.run(grade(t, asyncio.run(_made(t, "echo 42 > answer.txt")), cache=False))

    def test_a_reward_out_of_range_on_the_untouched_task_is_an_infrastructure_error(
            self, tmp_path):
        t = verifier_task(tmp_path, "#!/bin/bash\necho 5 > /logs/verifier/reward.txt\n",
                          name="big")
        with pytest.raises(RewardError, match=r"outside \[0, 1\]"):
            asyncio.run(grade(t, "", cache=False))

    def test_a_verifier_run_over_its_time_limit_scores_0_and_says_so(self, tmp_path):
        t = verifier_task(tmp_path, "#!/bin/bash\ncd /app\n[ -f run.sh ] && bash run.sh\n"
                          "echo 1 > /logs/verifier/reward.txt\n", timeout_s=3, name="slow")
        g = graded(t, "echo 'sleep 600' > run.sh")
        assert (g.score, g.timed_out) == (0.0, True)
        assert "timed out" in g.error

    def test_the_pristine_tests_are_read_only_to_the_workspace(self, tmp_path):
        t = verifier_task(tmp_path, "#!/bin/bash\ncd /app\nbash run.sh\n"
                          "grep -qx 42 /tests/expected.txt && echo 1 > /logs/verifier/reward.txt"
                          " || echo 0 > /logs/verifier/reward.txt\n", name="ro")
        g = graded(t, "echo 'echo 0 > /tests/expected.txt' > run.sh")
        assert g.score == 1.0  # the write failed: the verifier still read its own file
        assert (tmp_path / "ro" / "tests" / "expected.txt").read_text() == "42\n"
        assert os.access(tmp_path / "ro" / "tests" / "test.sh", os.X_OK)
