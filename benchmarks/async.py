"""Auto vs sync vs async GRPO schedules: wall time to the same steps, same model, tasks and settings.

    .venv/bin/python benchmarks/async.py --steps 8 --reps 1   # short form, 3 arms, ~5 min loaded
    .venv/bin/python benchmarks/async.py                      # 20 steps x 3 arms x 2 reps (must-show)
    .venv/bin/python benchmarks/async.py --pin 0:1            # rollouts and trainer on a core each
    .venv/bin/python benchmarks/async.py --engine-threads 2 --trainer-threads 1  # oversubscribed

Runs ``GRPOLoop`` three times on the real pieces — the default model (random init, cached under
LOOPRL_HOME), real inflection tasks in bubblewrap sandboxes, the harness, ``TorchEngine``,
``make_scorer`` (hidden tests + shaped reward) — with ``loop.experimental.schedule`` set to
``auto`` (the default: measures on the first steps whether overlap pays, keeps the faster),
``sync`` and ``async``, for the same number of optimizer steps. All start from the same weights.

Measured: the trainer's idle fraction (``LoopStats.idle_fraction``: time waiting for groups over
waiting + training), wall time, rollout tokens/s (sampled tokens of trained groups over wall) and
train tokens/s (model tokens over trainer busy time).

Honesty notes: a random model rarely passes tests, so most groups have equal rewards; the step is
run with ``skip_zero_variance=False`` so every step does its full forward/backward work (advantages
are then zero — the compute, which is what is measured here, is the same). The single-epoch sampler
needs more tasks than the 14 cached ones, so task copies get distinct ids (``<id>~k``).
An untimed sync run of an arm's whole workload goes first (``--no-warmup`` skips it): a run's
first pass is slow, and without it the first timed arm alone paid for it. The last line is
``speedup_auto_vs_sync=… speedup_async_vs_sync=… … wall_auto_s=… auto_kept=…``.

Two cases: by default every thread may run on every core, as a run does on one machine; with
``--pin 0:1`` rollouts (the decode thread, the event loop, grading subprocesses) keep to core 0
and the trainer's step to core 1, every arm alike — the case of rollouts on resources of their
own (nodes or cores), where sync leaves one side's core idle while the other works.

Baseline and fairness: the baseline is the sync schedule (roll out a step's groups, then
train: no overlap), the simplest correct loop and the one a sceptic would run instead; the
headline is what the default (``auto``) gains over it, probe steps included, and the async
arm's ratio (what overlap alone gives on this machine) is printed beside it. All three arms are
the same loop, code and settings but for ``schedule``, run in the same process, interleaved
(auto/sync/async, then reversed, ...) over ``--reps`` so other jobs' load falls on each alike;
each ratio is the median of the per-rep wall ratios (sync / arm) with its range.

Where the time goes (printed per run and summed up in the last line): the trainer step's wall
time split into CPU it got (``time.thread_time``), time runnable but waiting for a core
(``/proc/thread-self/schedstat``) and the rest, blocked (the GIL: the step does no I/O); the
weight hand-off (trainer busy time outside the step: clone, ``update_weights``, logging); the
decode thread's CPU per sampled token and mean batch; grading subprocesses' CPU; the cores the
run got (its CPU over wall) and how idle the machine was. When async loses, a ``why async
loses:`` line (before the last) says so with those figures. Async can only win by using cycles
the sync schedule leaves idle (``auto`` reads them on its sync steps and tries async only where
there are some, ``trainer.grpo.MIN_SPARE_CORES``):
on a machine whose cores other jobs already fill (``machine_idle`` ~0) there are none, and
running the trainer and the decode thread at once costs CPU (more tokens in flight, caches
shared by two hot threads), so there it loses; see docs/experiments.md (issue 55, stop 63).
Thread counts: ``--engine-threads`` is the decode thread's own (``TorchEngine(num_threads=)``),
``--trainer-threads`` the step worker's; 1 + 1 fills two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from looprl.chat import ChatFormat
from looprl.harness.agent import AgentConfig
from looprl.inference import TorchEngine
from looprl.models.loading import load_model
from looprl.models.tiny import default_model_dir
from looprl.rollout.config import RolloutConfig
from looprl.rollout.runner import RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.sandbox import SandboxPool
from looprl.trainer.batch import Credit
from looprl.trainer.config import GRPOConfig, GRPOExperimental, LoopConfig, LoopExperimental
from looprl.trainer.grpo import GRPOLoop, LoopStats
from looprl.trainer.losses import LossParams
from looprl.trainer.sampler import TaskSampler
from looprl.trainer.step import GRPOStep, StepMetrics
from looprl.types import Group, Task


def real_tasks(spec: str, max_tasks: int) -> list[Task]:
    """Cached real tasks of one package (fetched and built on first use)."""
    from looprl.tasks.build import BuildConfig, build_package_tasks
    from looprl.tasks.sources import fetch_package

    return build_package_tasks(fetch_package(spec), BuildConfig(max_tasks=max_tasks))


def repeat_tasks(tasks: list[Task], n: int) -> list[Task]:
    """``n`` tasks cycling over ``tasks``; copies get distinct ids so the single-epoch sampler
    treats them as different tasks."""
    return [dataclasses.replace(tasks[i % len(tasks)], id=f"{tasks[i % len(tasks)].id}~{i // len(tasks)}")
            for i in range(n)]


class ThreadedStep(GRPOStep):
    """``GRPOStep`` whose worker thread uses its own torch thread count (the engine keeps its own,
    ``TorchEngine(num_threads=)``), timing each step's wall and CPU time (``time.thread_time``:
    the CPU this thread got; wall over it is how long it waited for a core)."""

    def __init__(self, *args, threads: int | None = None, cores: set[int] | None = None,
                 rollout_cores: set[int] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.threads = threads
        self.cores, self.rollout_cores = cores, rollout_cores
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.runqueue_s = 0.0

    def on_groups(self, groups: list[Group], *, current_version: int | None = None) -> StepMetrics:
        if self.threads:
            torch.get_num_threads()  # this worker's lazy init first, so it keeps the count below
            torch.set_num_threads(self.threads)  # per OS thread: only this worker is affected
        if self.cores:  # Linux affinity is per thread: only this worker moves
            os.sched_setaffinity(0, self.cores)
        t, c, q = time.monotonic(), time.thread_time(), runqueue_wait_s()
        try:
            return super().on_groups(groups, current_version=current_version)
        finally:
            if self.cores and self.rollout_cores:  # the pool's thread may run rollout work next
                os.sched_setaffinity(0, self.rollout_cores)
            self.wall_s += time.monotonic() - t
            self.cpu_s += time.thread_time() - c
            self.runqueue_s += runqueue_wait_s() - q


def runqueue_wait_s() -> float:
    """Seconds the calling thread has been runnable but waiting for a core (/proc schedstat):
    a step's wall time less its CPU and this wait is time it was blocked (here: on the GIL)."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def thread_cpu_s(native_id: int | None) -> float:
    """CPU seconds (user + system) one thread of this process has used, from /proc."""
    if native_id is None:
        return 0.0
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_jiffies() -> tuple[int, int]:
    """(idle, total) jiffies of every CPU of the machine, from /proc/stat."""
    vals = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return vals[3] + vals[4], sum(vals[:8])


@dataclass(frozen=True)
class ModeResult:
    mode: str
    """The schedule asked for: auto, sync or async."""
    stats: LoopStats
    wall_s: float
    generated_tokens: int
    """Every token the engine sampled (also of groups dropped or unfinished at the end)."""
    step_wall_s: float
    """Wall time inside ``GRPOStep.on_groups`` (forward/backward/optimizer)."""
    step_cpu_s: float
    """CPU time the trainer's thread got for it."""
    step_runqueue_s: float
    """Time the trainer's thread was runnable but had no core (the other jobs, the engine)."""
    handoff_s: float
    """Trainer busy time outside the step: weight clone, hand-off to the engine, logging."""
    engine_cpu_s: float
    """CPU time of the engine's decode thread."""
    grading_cpu_s: float
    """CPU time of child processes (sandboxed tool calls and test runs)."""
    process_cpu_s: float
    """CPU time of this process, every thread."""
    machine_idle: float
    """Share of the machine's CPU time that was idle during the mode (other jobs included)."""
    decode_steps: int
    """Engine decode steps (generated tokens over them: the mean batch)."""

    @property
    def rollout_tok_s(self) -> float:
        return self.stats.rollout_tokens / max(self.wall_s, 1e-9)

    @property
    def train_tok_s(self) -> float:
        return self.stats.train_tokens / max(self.stats.trainer_busy_s, 1e-9)


async def run_mode(args: argparse.Namespace, schedule: str, tasks: list[Task]) -> ModeResult:
    lm = load_model(default_model_dir(args.size))
    tok = lm.tokenizer
    everything = os.sched_getaffinity(0)
    rollout_cores, trainer_cores = pinning(args.pin)
    if rollout_cores:  # the engine's thread, the event loop and grading subprocesses inherit it
        os.sched_setaffinity(0, rollout_cores)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.engine_threads)  # the decode thread inherits this count
    engine = TorchEngine(copy.deepcopy(lm.model), tok, max_len=args.context, seed=args.seed,
                         num_threads=args.engine_threads)
    torch.set_num_threads(args.trainer_threads)
    agent = AgentConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                        max_total_new_tokens=args.max_new_tokens * args.max_turns,
                        context_window=args.context)
    step = ThreadedStep(lm.model.train(), GRPOConfig(lr=1e-5, experimental=GRPOExperimental(
        micro_batch_tokens=args.micro_batch_tokens,
        objective=LossParams(norm_tokens=args.max_new_tokens * args.max_turns),
        credit=Credit(skip_zero_variance=False))), pad_id=tok.pad_token_id,
        threads=args.trainer_threads, cores=trainer_cores, rollout_cores=rollout_cores)
    pool = SandboxPool(max_running=args.max_in_flight)
    try:
        runner = RolloutRunner(engine, ChatFormat(tok), pool, make_scorer(), RolloutConfig(
            group_size=args.group_size, max_in_flight=args.max_in_flight, agent=agent,
            tools=tuple(args.tools.split(","))))
        loop = GRPOLoop(step, engine, runner, TaskSampler(tasks, seed=args.seed), LoopConfig(
            groups_per_step=args.groups_per_step, max_steps=args.steps, max_minutes=10.0,
            experimental=LoopExperimental(max_staleness=args.max_staleness,
                                          queue_size=args.queue_size, schedule=schedule)))
        t0, times0, jiffies0 = time.monotonic(), os.times(), machine_jiffies()
        stats = await loop.run(progress=lambda s: print(
            f"  [{schedule}] step {s.steps} t={time.monotonic() - t0:.1f}s "
            f"idle={s.idle_fraction:.2f}", flush=True))
        wall = time.monotonic() - t0
        times1, jiffies1 = os.times(), machine_jiffies()
        engine_cpu = thread_cpu_s(engine._thread.native_id)
    finally:
        await pool.close()
        engine.close()
        os.sched_setaffinity(0, everything)
    idle = (jiffies1[0] - jiffies0[0]) / max(jiffies1[1] - jiffies0[1], 1)
    return ModeResult(schedule, stats, wall, engine.stats.generated_tokens,
                      step.wall_s, step.cpu_s, step.runqueue_s, stats.trainer_busy_s - step.wall_s, engine_cpu,
                      (times1.children_user + times1.children_system)
                      - (times0.children_user + times0.children_system),
                      (times1.user + times1.system) - (times0.user + times0.system), idle,
                      engine.stats.decode_steps)


def pinning(spec: str) -> tuple[set[int] | None, set[int] | None]:
    """``--pin ROLLOUT:TRAINER`` (core lists, e.g. ``0:1``) as (rollout cores, trainer cores);
    (None, None) for no pinning."""
    if not spec:
        return None, None
    try:
        a, b = (set(map(int, part.split(","))) for part in spec.split(":"))
    except ValueError:
        raise SystemExit(f"--pin {spec!r}: give ROLLOUT_CORES:TRAINER_CORES, e.g. 0:1 or 0,1:2,3") from None
    if a & b or not (a | b) <= os.sched_getaffinity(0):
        raise SystemExit(f"--pin {spec!r}: the two sets must be disjoint cores of "
                         f"{sorted(os.sched_getaffinity(0))}")
    return a, b


def cores_used(r: ModeResult) -> float:
    """CPU time this run got (its process and its children) per wall second."""
    return (r.process_cpu_s + r.grading_cpu_s) / max(r.wall_s, 1e-9)


def blocked(r: ModeResult) -> float:
    """The trainer's step time neither on a core nor waiting for one: blocked (on the GIL)."""
    return max(r.step_wall_s - r.step_cpu_s - r.step_runqueue_s, 0.0)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def ratios(sync: list[ModeResult], arm: list[ModeResult]) -> list[float]:
    """Per-rep wall-time ratios, sync over ``arm`` (above 1: the arm is faster)."""
    return [x.wall_s / max(y.wall_s, 1e-9) for x, y in zip(sync, arm, strict=True)]


def summary(runs: dict[str, list[ModeResult]], args: argparse.Namespace) -> tuple[str, str]:
    """(why, last line). The last line: auto's and async's wall-time ratios to sync (median over
    reps, with their range), what auto kept, then the breakdown that says where the async arm's
    time went; ``why`` says why async lost, when it did (empty otherwise)."""
    a, s, u = runs["async"], runs["sync"], runs["auto"]
    auto, rs = ratios(s, u), ratios(s, a)
    speedup = med(rs)
    kept = ",".join(sorted({x.stats.schedule for x in u}))
    # the CPU each arm's work needed; async can only win by using cores the sync arm left idle
    work_a = med([x.process_cpu_s + x.grading_cpu_s for x in a])
    work_s = med([x.process_cpu_s + x.grading_cpu_s for x in s])
    line = (f"speedup_auto_vs_sync={med(auto):.2f} speedup_async_vs_sync={speedup:.2f} "
            f"auto_min={min(auto):.2f} auto_max={max(auto):.2f} async_min={min(rs):.2f} "
            f"async_max={max(rs):.2f} reps={len(rs)} wall_auto_s={med([x.wall_s for x in u]):.1f} "
            f"wall_sync_s={med([x.wall_s for x in s]):.1f} wall_async_s={med([x.wall_s for x in a]):.1f} "
            f"auto_kept={kept} "
            f"trainer_idle_async={med([x.stats.idle_fraction for x in a]):.3f} "
            f"trainer_idle_sync={med([x.stats.idle_fraction for x in s]):.3f} "
            f"step_s_async={med([x.step_wall_s / max(x.stats.steps, 1) for x in a]):.2f} "
            f"step_s_sync={med([x.step_wall_s / max(x.stats.steps, 1) for x in s]):.2f} "
            f"step_cpu_share_async={med([x.step_cpu_s / max(x.step_wall_s, 1e-9) for x in a]):.2f} "
            f"step_cpu_share_sync={med([x.step_cpu_s / max(x.step_wall_s, 1e-9) for x in s]):.2f} "
            f"step_runqueue_share_async={med([x.step_runqueue_s / max(x.step_wall_s, 1e-9) for x in a]):.2f} "
            f"step_runqueue_share_sync={med([x.step_runqueue_s / max(x.step_wall_s, 1e-9) for x in s]):.2f} "
            f"step_blocked_share_async={med([blocked(x) / max(x.step_wall_s, 1e-9) for x in a]):.2f} "
            f"step_blocked_share_sync={med([blocked(x) / max(x.step_wall_s, 1e-9) for x in s]):.2f} "
            f"handoff_s_per_step={med([x.handoff_s / max(x.stats.steps, 1) for x in a + s]):.3f} "
            f"engine_cpu_ms_per_tok_async={med([1e3 * x.engine_cpu_s / max(x.generated_tokens, 1) for x in a]):.2f} "
            f"engine_cpu_ms_per_tok_sync={med([1e3 * x.engine_cpu_s / max(x.generated_tokens, 1) for x in s]):.2f} "
            f"batch_async={med([x.generated_tokens / max(x.decode_steps, 1) for x in a]):.1f} "
            f"batch_sync={med([x.generated_tokens / max(x.decode_steps, 1) for x in s]):.1f} "
            f"cpu_s_async={work_a:.1f} cpu_s_sync={work_s:.1f} "
            f"cores_used_async={med([cores_used(x) for x in a]):.2f} "
            f"cores_used_sync={med([cores_used(x) for x in s]):.2f} "
            f"machine_idle_sync={med([x.machine_idle for x in s]):.2f} "
            f"wasted_tokens_async={med([x.generated_tokens - x.stats.rollout_tokens for x in a]):.0f} "
            f"stale_async={med([x.stats.groups_stale for x in a]):.0f} steps={args.steps} "
            f"threads=engine:{args.engine_threads},trainer:{args.trainer_threads} "
            f"pin={args.pin or 'none'} "
            f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    why = ""
    if speedup < 1.0:
        why = (f"why async loses: the async arm needed {work_a:.0f} CPU-s against the sync arm's {work_s:.0f} "
                 f"and got {med([cores_used(x) for x in a]):.2f} cores against "
                 f"{med([cores_used(x) for x in s]):.2f}; overlap can only hide what the sync arm "
                 f"leaves idle, and the machine was {med([x.machine_idle for x in s]):.0%} idle "
                 f"during the sync arm; the trainer's step took "
                 f"{med([x.step_wall_s / max(x.stats.steps, 1) for x in a]):.2f}s async against "
                 f"{med([x.step_wall_s / max(x.stats.steps, 1) for x in s]):.2f}s sync, "
                 f"{med([x.step_runqueue_s / max(x.step_wall_s, 1e-9) for x in a]):.0%} of it waiting "
                 f"for a core and {med([blocked(x) / max(x.step_wall_s, 1e-9) for x in a]):.0%} "
                 f"blocked (the GIL it shares with the decode thread and the event loop)")
    return why, line


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20,
                   help="optimizer steps per arm (auto probes 1 + 2 steps per schedule)")
    p.add_argument("--size", default="small", help="default model size (looprl.models.tiny.SIZES)")
    p.add_argument("--package", default="inflection==0.5.1")
    p.add_argument("--tasks-file", default="",
                   help="a task JSONL to use (e.g. a set cached under LOOPRL_HOME/tasks) instead of "
                        "building --package's; building screens mutations under a time budget, "
                        "which a loaded machine can spend before any task is kept")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--queue-size", type=int, default=2)
    p.add_argument("--max-in-flight", type=int, default=4)
    p.add_argument("--max-staleness", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--engine-threads", type=int, default=1)
    p.add_argument("--trainer-threads", type=int, default=1)
    p.add_argument("--tools", default="read_file,grep,edit_file,run_tests,finish",
                   help="harness tools offered (all 11 make a ~1.8k-token prompt, these ~0.6k)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reps", type=int, default=2, help="runs of each arm, interleaved ABBA")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="an untimed sync run of an arm's whole workload first")
    p.add_argument("--pin", default="",
                   help="ROLLOUT:TRAINER core lists (e.g. 0:1): rollouts (decode thread, event "
                        "loop, grading) and the trainer's step each on cores of their own, every "
                        "arm alike (the separate-resources case); empty: no pinning")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    pinning(args.pin)  # a malformed --pin stops here, before any task is built
    try:
        base = ([Task.from_json(line) for line in Path(args.tasks_file).read_text().splitlines()
                 if line.strip()] if args.tasks_file else real_tasks(args.package, 20))
    except Exception as e:  # noqa: BLE001 — no network / no bwrap: say so, don't fake a number
        print(f"could not build real tasks from {args.package}: {e}\n(needs the package cached "
              f"under LOOPRL_HOME or PyPI access, and bubblewrap)", file=sys.stderr)
        return 2
    # Enough tasks for the steps plus what the async producer has in flight when it stops.
    need = (args.steps + 2) * args.groups_per_step + args.queue_size + args.max_in_flight
    tasks = repeat_tasks(base, need)
    print(f"{len(base)} real tasks ({args.package}) -> {len(tasks)} with copies; model {args.size}; "
          f"threads engine={args.engine_threads} trainer={args.trainer_threads}", flush=True)
    if args.warmup:
        # Without it the first timed arm (auto, in rep 0) ran ~1.6x the others: a run's first
        # pass over its workload is slow, and a warm-up over only the distinct tasks (not the
        # arm's own ids, steps and order) still left most of that to the first arm.
        r = asyncio.run(run_mode(args, "sync", tasks))
        print(f"warm-up (untimed): {r.stats.steps} sync steps, the arms' workload, in "
              f"{r.wall_s:.1f}s", flush=True)
    runs: dict[str, list[ModeResult]] = {"auto": [], "sync": [], "async": []}
    for rep in range(args.reps):  # ABCCBA: each arm sees the other jobs' load early and late alike
        for schedule in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
            r = asyncio.run(run_mode(args, schedule, tasks))
            runs[r.mode].append(r)
            s = r.stats
            if s.schedule_decision:
                print(f"  [{schedule}] {s.schedule_decision}", flush=True)
            print(f"{r.mode:>5} rep {rep}: kept={s.schedule} steps={s.steps} wall={r.wall_s:.1f}s idle={s.idle_fraction:.3f} "
                  f"(idle {s.trainer_idle_s:.1f}s busy {s.trainer_busy_s:.1f}s) step={r.step_wall_s:.1f}s "
                  f"wall/{r.step_cpu_s:.1f}s cpu/{r.step_runqueue_s:.1f}s runqueue/"
                  f"{blocked(r):.1f}s blocked handoff={r.handoff_s:.2f}s engine_cpu={r.engine_cpu_s:.1f}s "
                  f"grading_cpu={r.grading_cpu_s:.1f}s "
                  f"engine_cpu_ms/tok={1e3 * r.engine_cpu_s / max(r.generated_tokens, 1):.2f} "
                  f"batch={r.generated_tokens / max(r.decode_steps, 1):.1f} cores_used={cores_used(r):.2f} "
                  f"machine_idle={r.machine_idle:.2f} rollout_tok/s={r.rollout_tok_s:.0f} "
                  f"engine_tok/s={r.generated_tokens / r.wall_s:.0f} wasted_tokens="
                  f"{r.generated_tokens - s.rollout_tokens} stale={s.groups_stale} "
                  f"dropped={s.groups_dropped}", flush=True)
    why, line = summary(runs, args)
    if why:
        print(why)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
