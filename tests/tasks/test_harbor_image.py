"""An image-only Harbor task (``[environment].docker_image``, no Dockerfile) runs whole in its
image on the container backend: imported (the WORKDIR copied out, the oracle run in a container),
then the oracle scores 1 and the null policy 0 through the bench, the agent's sandbox and the
grader's both containers of the image. The image is built here from a busybox root filesystem
(``tests.container_support``: a shell and its applets, no Python); skipped, with the reason,
where no engine runs it. Refused in one line where no engine is installed."""

import asyncio
from pathlib import Path

import pytest

from looprl.bench.report import summarize
from looprl.bench.run import BenchSettings, run_bench
from looprl.rewards.tests import grade
from looprl.sandbox import container
from looprl.sandbox.container import ContainerSandbox
from looprl.sandbox.pool import SandboxPool
from looprl.tasks.harbor import import_harbor
from looprl.types import Image, Task
from tests.container_support import HARBOR_IMAGE, NOTES, engine_for

TASK = Path(__file__).parent / "harbor_image_tasks" / "image-line-stats"


@pytest.fixture(scope="module")
def imported(looprl_home, tmp_path_factory):
    engine_for(HARBOR_IMAGE, {"/app/notes.txt": NOTES}, "/app")
    return asyncio.run(import_harbor([TASK], tmp_path_factory.mktemp("harbor-image-store")))


@pytest.mark.slow
def test_an_image_task_imports_and_the_oracle_scores_1_the_null_policy_0(imported):
    assert imported.skipped == []
    (task,) = imported.tasks
    assert task.image == Image(HARBOR_IMAGE, "/app") and task.venv is None
    assert (Path(task.repo) / "notes.txt").read_text() == NOTES  # the WORKDIR, copied out
    assert "+++ b/linestats.sh" in task.gold_patch
    assert Task.from_json(task.to_json()) == task
    settings = BenchSettings(concurrency=2, max_turns=6)
    for policy, want in (("oracle", 1.0), ("null", 0.0)):
        samples = run_bench(imported.tasks, policy, 1, settings)
        rep = summarize(samples, 1, policy=policy, tasks_file="harbor-image")
        assert rep["infra_errors"] == 0
        assert {tid: r["pass@1"] for tid, r in rep["per_task"].items()} == {task.id: want}


_ONLY_IN_THE_IMAGE = """\
--- /dev/null
+++ b/linestats.sh
@@ -0,0 +1,4 @@
+#!/bin/sh
+if command -v python3 >/dev/null; then echo "not in the image"; exit 1; fi
+awk '{ n++; if (length($0) > 0) e++; if (length($0) > m) m = length($0) }
+     END { printf "lines %d\\nnonempty %d\\nlongest %d\\n", n, e, m }' "$1"
"""


@pytest.mark.slow
def test_the_agent_and_the_grader_both_run_in_the_image(imported):
    """A solution that is right only where there is no Python (the image, not this host)
    scores 1; the rollouts' pool leases a container of the image, without Python either."""
    (task,) = imported.tasks
    assert asyncio.run(grade(task, _ONLY_IN_THE_IMAGE, cache=False)).score == 1.0

    async def lease() -> tuple[bool, bool, str]:
        pool = SandboxPool(max_running=1, warm=0)
        try:
            async with pool.lease(task.repo, task.venv, image=task.image) as sb:
                r = await sb.exec("pwd; command -v python3")
                return isinstance(sb.inner, ContainerSandbox), r.exit_code != 0, r.stdout
        finally:
            await pool.close()

    assert asyncio.run(lease()) == (True, True, "/app\n")


def test_where_no_engine_is_installed_the_image_task_is_refused_in_one_line(
        tmp_path, looprl_home, monkeypatch):
    monkeypatch.setattr(container, "_engines", lambda: [])
    container._probe.cache_clear()
    report = asyncio.run(import_harbor([TASK], tmp_path / "store"))
    assert report.tasks == []
    ((source, why),) = report.skipped
    assert source == "image-line-stats" and why == (
        f"refused: [environment].docker_image = '{HARBOR_IMAGE}': cannot run containers of "
        f"{HARBOR_IMAGE}: no container engine installed (docker or podman)")
    assert not (tmp_path / "store" / "looprl-tests-image-line-stats").exists()
