"""The bench end to end on a real (small) task: oracle and null policies through the harness,
graded in sandboxes; then reports, pass@k and the promotion gate."""

import json
import random
import statistics
import sys

import pytest
from typer.testing import CliRunner

from looprl.bench.gate import Precision, RunsPrecision, compare, load, precision, runs_precision
from looprl.bench.report import pass_at_k, summarize, write_report
from looprl.bench.run import PolicyFactory, Sample, run_bench
from looprl.commands.bench import app
from looprl.diffs import unified_diff
from looprl.errors import ConfigError
from looprl.tasks.taskset import write_tasks
from looprl.types import Grader, Task
from tests.example_package import write_example_package

CMD = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=src python -m "
       "pytest -p no:cacheprovider -q -rA --tb=short --color=no -o addopts=")
CORE = "src/minicalc/core.py"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    repo = write_example_package(tmp_path_factory.mktemp("b") / "minicalc")
    core = repo / CORE
    original = core.read_text()
    core.write_text(original.replace("acc = acc + v", "acc = acc - v"))
    t = Task("minicalc-running-total", str(repo), "running_total is off", venv=sys.prefix,
             gold_patch=unified_diff(CORE, core.read_text(), original),
             grader=Grader(CMD, ("tests/test_core.py::test_running_total",
                                 "tests/test_core.py::test_running_total_start"),
                           ("tests/test_core.py::test_mean",), ("tests/test_core.py",)),
             metadata={"source_kind": "mutation", "package": "minicalc"})
    return [t]


@pytest.fixture(scope="module")
def reports(tasks, tmp_path_factory):
    d = tmp_path_factory.mktemp("reports")
    out = {}
    for policy in ("oracle", "null"):
        samples = run_bench(tasks, policy, k=2)
        out[policy] = write_report(summarize(samples, 2, policy, "t.jsonl"), d / f"{policy}.json")[0]
    return out


@pytest.mark.slow
def test_oracle_solves_and_null_does_not(reports):
    oracle, null = load(reports["oracle"]), load(reports["null"])
    assert oracle["metrics"]["pass@1"] == 1.0 and oracle["metrics"]["pass@2"] == 1.0
    assert null["metrics"]["pass@1"] == 0.0 and null["infra_errors"] == 0
    assert oracle["metrics"]["mean_tool_calls"] >= 3 > null["metrics"]["mean_tool_calls"]
    assert oracle["n_samples"] == 2 and oracle["pass@1_by_kind"] == {"mutation": 1.0}
    assert reports["oracle"].with_suffix(".png").stat().st_size > 1000
    assert "| pass@1 | 1 |" in reports["oracle"].with_suffix(".md").read_text()


@pytest.mark.slow
def test_compare_gate_exit_codes(reports):
    runner = CliRunner()
    up = runner.invoke(app, ["compare", str(reports["null"]), str(reports["oracle"])])
    assert up.exit_code == 0, up.output
    assert "gate PASSED" in up.output and "| pass@1 | 0 | 1 | +1 |" in up.output
    down = runner.invoke(app, ["compare", str(reports["oracle"]), str(reports["null"])])
    assert down.exit_code == 1 and "gate FAILED" in down.output


def test_bench_cli_runs_a_task_file(tasks, tmp_path):
    f = write_tasks(tasks, tmp_path / "t.jsonl")
    r = CliRunner().invoke(app, ["run", "--policy", "null", "--tasks", str(f), "--out",
                                 str(tmp_path / "n.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "n.json").read_text())["metrics"]["pass@1"] == 0.0


def test_pass_at_k_and_infra_samples_are_excluded():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - (7 * 6 * 5 * 4 * 3) / (10 * 9 * 8 * 7 * 6))
    samples = [Sample("a", 0, 1.0, "finished"), Sample("a", 1, None, "infra_error"),
               Sample("b", 0, 0.0, "finished"), Sample("b", 1, 1.0, "finished")]
    rep = summarize(samples, 2)
    assert rep["infra_errors"] == 1 and rep["per_task"]["a"]["n"] == 1
    assert rep["metrics"]["pass@1"] == pytest.approx((1.0 + 0.5) / 2)
    assert rep["metrics"]["pass@2"] == pytest.approx(1.0)


def test_gate_needs_common_tasks_and_tolerates_noise():
    def rep(vals):
        return {"per_task": {f"t{i}": {"pass@1": v, "output_tokens": 10, "tool_calls": 1,
                                       "turns": 1, "wall_s": 1, "broken_tool_calls": 0}
                             for i, v in enumerate(vals)}}
    same = compare(rep([1, 0] * 20), rep([1, 0] * 20))
    assert same.passed and same.diffs[0].diff == 0
    worse = compare(rep([1] * 40), rep([1] * 20 + [0] * 20))
    assert not worse.passed and worse.diffs[0].hi < 0
    with pytest.raises(ConfigError, match="share no task ids"):
        compare(rep([1]), {"per_task": {"other": {}}})


def test_precision_predicts_the_spread_of_repeated_evaluations():
    """Evaluations of fresh task draws (true per-task lift uniform on -0.1 .. 0.3, variance
    0.0133; k = 3 samples per task and arm): the spread estimated from one evaluation matches the
    spread of the mean difference over many."""
    rng = random.Random(0)

    def evaluation(n: int = 100, k: int = 3) -> tuple[dict, dict]:
        a, b = {}, {}
        for i in range(n):
            pa = rng.uniform(0.1, 0.5)
            pb = pa + rng.uniform(-0.1, 0.3)
            for rep, p in ((a, pa), (b, pb)):
                rep[f"t{i}"] = {"n": k, "pass@1": sum(rng.random() < p for _ in range(k)) / k}
        return {"per_task": a}, {"per_task": b}

    runs = [evaluation() for _ in range(400)]
    diffs = [statistics.fmean(b["per_task"][t]["pass@1"] - a["per_task"][t]["pass@1"]
                              for t in a["per_task"]) for a, b in runs]
    observed = 1.96 * statistics.stdev(diffs)
    est = [precision(a, b) for a, b in runs]
    assert all(e is not None and e.n_tasks == 100 and e.k == 3 for e in est)
    assert statistics.fmean(e.half_width() for e in est) == pytest.approx(observed, rel=0.1)
    large = precision(*evaluation(n=5000))
    assert large is not None and large.between == pytest.approx(0.4 ** 2 / 12, rel=0.15)
    # The sizes it proposes reach the target, one fewer does not.
    e = est[0]
    n = e.tasks_for(0.03)
    assert e.half_width(n_tasks=n) <= 0.03 < e.half_width(n_tasks=n - 1)
    k = e.samples_for(0.05)
    assert k is not None and e.half_width(k=k) <= 0.05 < e.half_width(k=max(k - 1, 1e-9))


def test_runs_precision_splits_each_runs_own_spread_from_the_shared_one():
    """Seeds of one config on the same tasks: a task's true lift (uniform on -0.1 .. 0.3,
    variance 0.0133) is shared, each run adds its own (uniform on -0.15 .. 0.15, variance
    0.0075), k = 3 samples a task and arm. The parts are recovered, and the pooled interval it
    predicts matches the spread of pooled differences over many fresh task draws."""
    rng = random.Random(0)

    def seeds(runs: int, n: int = 100, k: int = 3) -> list[tuple[dict, dict]]:
        tasks = [(rng.uniform(0.25, 0.45), rng.uniform(-0.1, 0.3)) for _ in range(n)]
        out = []
        for _ in range(runs):
            a, b = {}, {}
            for i, (pa, lift) in enumerate(tasks):
                pb = pa + lift + rng.uniform(-0.15, 0.15)
                for rep, p in ((a, pa), (b, pb)):
                    rep[f"t{i}"] = {"n": k, "pass@1": sum(rng.random() < p for _ in range(k)) / k}
            out.append(({"per_task": a}, {"per_task": b}))
        return out

    large = runs_precision(seeds(3, n=5000))
    assert large is not None and (large.runs, large.k, large.n_tasks) == (3, 3, 5000)
    assert large.shared == pytest.approx(0.4 ** 2 / 12, rel=0.2)
    assert large.own == pytest.approx(0.3 ** 2 / 12, rel=0.2)

    draws = [seeds(2) for _ in range(300)]
    pooled = [statistics.fmean(statistics.fmean(b["per_task"][t]["pass@1"] - a["per_task"][t]["pass@1"]
                                                for a, b in d) for t in d[0][0]["per_task"])
              for d in draws]
    est = [runs_precision(d) for d in draws]
    assert all(e is not None for e in est)
    assert statistics.fmean(e.half_width() for e in est) == pytest.approx(
        1.96 * statistics.stdev(pooled), rel=0.1)
    # The number of runs it proposes reaches the target, one fewer does not.
    n = large.runs_for(0.01)
    assert n is not None and large.half_width(runs=n) <= 0.01 < large.half_width(runs=n - 1)
    assert RunsPrecision(100, 2, 3, shared=0.03, own=0.02, sampling=0.4).runs_for(0.03) is None
    assert runs_precision(seeds(1)) is None  # one run cannot tell its own spread from the shared


def test_precision_says_when_no_sample_count_is_enough():
    wide = Precision(n_tasks=100, k=3, between=0.05, sampling=0.12)
    assert wide.samples_for(0.03) is None
    assert "no k on these 100 tasks (±4.4 at best)" in wide.markdown()
    assert "takes 385 tasks at k = 3" in wide.markdown()
    one_sample = {"per_task": {"t0": {"n": 1, "pass@1": 1.0}, "t1": {"n": 1, "pass@1": 0.0}}}
    assert precision(one_sample, one_sample) is None  # no task tells noise from spread


def test_policy_specs_are_checked():
    with pytest.raises(ConfigError, match="unknown policy"):
        PolicyFactory("gpt")
    with pytest.raises(ConfigError, match="needs an argument"):
        PolicyFactory("model")


def test_pool_runs_pools_seeds_into_one_paired_interval(tmp_path):
    """``scripts/pool_runs.py``: two runs' per-task pass@1, averaged by samples, go through the
    same paired bootstrap as one run's; runs with other held-out tasks are refused."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "pool_runs.py"
    rng = random.Random(0)

    def report(p: list[float]) -> dict:
        rows = {}
        for i, q in enumerate(p):
            c = sum(rng.random() < q for _ in range(3))
            rows[f"t{i}"] = {"n": 3, "pass@1": c / 3, "output_tokens": 10.0, "tool_calls": 2.0,
                             "turns": 2.0, "wall_s": 1.0, "broken_tool_calls": 0.0}
        return {"per_task": rows}

    runs = []
    for seed in range(2):
        run = tmp_path / f"run{seed}"
        run.mkdir()
        (run / "eval_start.json").write_text(json.dumps(report([0.2] * 100)))
        (run / "eval_rl.json").write_text(json.dumps(report([0.4] * 100)))
        runs.append(run)

    def line(*dirs: Path) -> dict[str, float]:
        out = subprocess.run([sys.executable, str(script), *map(str, dirs)], capture_output=True,
                             text=True, check=True).stdout.splitlines()[0]
        return {k: float(v) for k, v in (w.split("=") for w in out.split()) if k != "set"}

    one, two = (line(r) for r in runs)
    advice = subprocess.run([sys.executable, str(script), *map(str, runs)], capture_output=True,
                            text=True, check=True).stdout.splitlines()[1]
    assert "from 2 runs on 100 tasks x 3" in advice and "runs at k = 3" in advice
    both = line(*runs)
    assert both["samples"] == 600 and both["tasks"] == 100 and both["runs"] == 2
    assert both["delta"] == pytest.approx((one["delta"] + two["delta"]) / 2, abs=1e-4)
    # independent samples of the same tasks: the pooled interval is narrower than either run's
    assert both["half_width"] < min(one["half_width"], two["half_width"])
    assert both["ci_low"] < both["delta"] < both["ci_high"]

    # a run kept by --record (samples dropped) pools as the run itself does
    (runs[0] / "config.json").write_text(json.dumps({"seed": 0}))
    (runs[0] / "tasks").mkdir()
    (runs[0] / "tasks" / "heldout.jsonl").write_text("{}\n")
    rep = json.loads((runs[0] / "eval_rl.json").read_text())
    (runs[0] / "eval_rl.json").write_text(json.dumps({**rep, "samples": [{"text": "x" * 1000}]}))
    kept = tmp_path / "kept"
    subprocess.run([sys.executable, str(script), "--record", str(kept), str(runs[0])], check=True,
                   capture_output=True)
    assert "samples" not in json.loads((kept / "eval_rl.json").read_text())
    assert json.loads((kept / "run.json").read_text())["task_files_sha256"]["heldout.jsonl"]
    assert line(kept, runs[1]) == both
    # a run and its own record share the start's evaluation: one seed, not two
    same = subprocess.run([sys.executable, str(script), str(kept), str(runs[0])],
                          capture_output=True, text=True)
    assert same.returncode != 0 and "share their start's evaluation" in same.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    unconfigured = subprocess.run([sys.executable, str(script), "--record", str(kept), str(empty)],
                                  capture_output=True, text=True)
    assert unconfigured.returncode != 0 and "has no config.json" in unconfigured.stderr
    (empty / "config.json").write_text("{}")
    unfinished = subprocess.run([sys.executable, str(script), "--record", str(kept), str(empty)],
                                capture_output=True, text=True)
    assert unfinished.returncode != 0 and "holds no evaluations" in unfinished.stderr

    other = tmp_path / "other"
    other.mkdir()
    for name in ("eval_start.json", "eval_rl.json"):
        rep = json.loads((runs[0] / name).read_text())
        rep["per_task"]["t100"] = rep["per_task"].pop("t0")
        (other / name).write_text(json.dumps(rep))
    bad = subprocess.run([sys.executable, str(script), str(runs[0]), str(other)],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "held-out tasks differ" in bad.stderr


def test_kept_runs_are_in_the_repository_and_pool():
    """``docs/runs/``: the evaluations kept by ``pool_runs.py --record`` reach a clone (an ignore
    rule once kept them out) and pool, since the kept seeds share their task files."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    kept = {p.name: p for p in (root / "docs" / "runs").iterdir() if (p / "run.json").is_file()}
    assert {"q48", "q48_walk1", "q49"} <= set(kept)
    hashes = {n: json.loads((p / "run.json").read_text())["task_files_sha256"]
              for n, p in kept.items()}
    assert hashes["q48_walk1"] == hashes["q49"]
    out = subprocess.run([sys.executable, str(root / "scripts" / "pool_runs.py"),
                          str(kept["q48_walk1"]), str(kept["q49"])],
                         capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("set=")]
    assert [ln.split()[:3] for ln in lines] == [["set=functions", "runs=2", "tasks=200"],
                                                ["set=packages", "runs=2", "tasks=160"]]


@pytest.mark.slow
def test_injected_infrastructure_failures_are_reported_beside_pass_at_k(tasks, tmp_path):
    """The grader crashes on purpose at 60% of gradings: retried, the samples still lost are
    counted by class beside pass@k, never as the oracle's failures."""
    from looprl import faults
    from looprl.faults import FaultInjector, FaultsConfig

    before = faults.install(FaultInjector(FaultsConfig({"grader_crash": 0.6}, seed=5)))
    try:
        samples = run_bench(tasks, "oracle", k=6)
    finally:
        faults.install(before)
    rep = summarize(samples, 6, "oracle", "t.jsonl")
    lost = [s for s in samples if s.score is None]
    assert lost and rep["infra_by_kind"] == {"grader_crash": len(lost)}
    assert rep["metrics"]["infra_share"] == pytest.approx(len(lost) / 6)
    assert rep["metrics"]["pass@1"] == 1.0  # what was graded passed: lost ones do not count
    md = write_report(rep, tmp_path / "o.json")[1].read_text()
    assert f"| infra failures | {len(lost)} of 6 samples: grader_crash {len(lost)} |" in md


def _report(passes: list[int], lost: int, kind: str = "sandbox_create") -> dict:
    samples = [Sample(f"t{i}", 0, float(v), "finished") for i, v in enumerate(passes)]
    samples += [Sample(f"t{i}", 1, None, "infra_error", infra_kind=kind) for i in range(lost)]
    return summarize(samples, 2)


def test_gate_refuses_to_judge_above_the_infrastructure_share(tmp_path):
    base, good = _report([0] * 20 + [1] * 20, 1), _report([1] * 40, 1)
    assert compare(base, good).passed  # 1 of 41 samples lost by each: judged
    flaky = _report([1] * 40, 8, "grader_crash")  # 8 of 48: 16.7%
    c = compare(base, flaky)
    assert c.refused and not c.passed and "grader_crash 8" in c.reason
    assert "refused" in c.reason and c.infra_shares[1] == pytest.approx(8 / 48)
    judged = compare(base, flaky, max_infra_share=0.2)  # judged, then fails on the increase
    assert not judged.refused and not judged.passed and "not promoted" in judged.reason
    assert compare(base, flaky, max_infra_share=0.2, max_infra_increase=0.2).passed
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(base))
    b.write_text(json.dumps(flaky))
    out = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert out.exit_code == 1 and "gate REFUSED" in out.output


def test_a_candidate_that_fails_more_as_infrastructure_is_not_promoted():
    parent, child = _report([0] * 20 + [1] * 20, 0), _report([1] * 40, 2, "grader_crash")
    c = compare(parent, child)  # pass@1 up by 0.5, but 2 samples lost where the parent lost 0
    assert not c.passed and not c.refused and "not promoted" in c.reason
    assert compare(parent, child, max_infra_increase=0.05).passed
    assert compare(child, parent).passed is False  # the parent's pass@1 is lower: a real fail


def test_gate_never_passes_a_difference_it_cannot_tell_from_zero():
    nothing = _report([0] * 20, 0)
    both_zero = compare(nothing, _report([0] * 20, 0))
    assert not both_zero.passed and "no evidence" in both_zero.reason
    assert both_zero.diffs[0].lo == both_zero.diffs[0].hi == 0
    noisy = compare(_report([0, 1] * 10, 0), _report([1, 0] * 10, 0), min_gain=0.01)
    assert noisy.diffs[0].lo < 0 < noisy.diffs[0].hi and not noisy.passed
    assert compare(nothing, _report([1] * 20, 0), min_gain=0.01).passed  # a real gain still does
