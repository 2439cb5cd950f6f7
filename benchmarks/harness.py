"""Harness benchmark: the token-in/token-out observation path vs re-rendering and re-tokenizing
the whole conversation every turn (what a text-in/text-out harness does), plus the loop's own
overhead per turn with a scripted policy and cheap tools — side by side, one run.

    .venv/bin/python benchmarks/harness.py [--turns 3] [--long-turns 60] [--reps 200]

Workload: conversations of N turns, each a model turn with two tool calls and two ~1 KB tool
results, through the default chat template and a trained 2,048-entry BPE tokenizer. Every tool
result differs (it names its turn and conversation), as real ones do: the observation path keeps
a small cache of encoded observations, and identical results every turn would time that cache.

Baseline: re-rendering the whole conversation through the chat template and re-tokenizing it
after every turn, as a text-in/text-out harness does; the same conversations go through both
paths, one conversation of each in turn. The headline is at the quickstart's turn count
(``[rollout] max_turns = 3``); the ratio grows with the turn count (re-rendering is quadratic in
it), so the ``--long-turns`` figure beside it is named flattering.

The last line is machine-readable: ``speedup=… delta_ms_per_turn=… rerender_ms_per_turn=…
turns=… flattering: speedup_long=… long_turns=… loop_ms_per_turn=…``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from looprl.chat import ChatFormat
from looprl.harness import AgentConfig, ScriptedPolicy, make_tools, run_agent
from looprl.models.tokenizer import build_tokenizer
from looprl.types import Grader, Task


def call(name: str, **args: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def conversation(turns: int, conv: int = 0) -> list[list[dict]]:
    steps = []
    for t in range(turns):
        reply = f"Step {t}." + call("read_file", path=f"m{t}.py") + call("grep", pattern=f"f{t}")
        tools = [{"role": "tool", "tool_call_id": f"c{t}_{k}", "name": "read_file",
                  "content": f"# m{conv}_{t}_{k}.py\n" + "\n".join(
                      f"{i:>6}\tdef f{i}_{t}(x):  return x * {i + conv}  # some code"
                      for i in range(24))}
                 for k in range(2)]
        steps.append([{"role": "assistant", "content": reply}] + tools)
    return steps


def bench_observations(fmt: ChatFormat, turns: int, reps: int) -> tuple[float, float]:
    """ms per turn of (the observation path, re-rendering), over ``reps`` distinct conversations."""
    head = [{"role": "user", "content": "Fix the failing test in m0.py."}]
    delta = rerender = 0.0
    for conv in range(reps):
        steps = conversation(turns, conv)
        t0 = time.perf_counter()
        ids = fmt.prompt_ids(head)
        for step in steps:
            ids += fmt.encode(step[0]["content"]) + [fmt.eot_id] + fmt.observation_ids(step[1:])
        delta += time.perf_counter() - t0
        t0 = time.perf_counter()
        msgs = list(head)
        for step in steps:
            msgs += step
            full = fmt.encode(fmt.render(msgs))
        rerender += time.perf_counter() - t0
        assert full == ids, "the delta path must produce the same tokens for this template"
    return delta / turns / reps * 1e3, rerender / turns / reps * 1e3


def bench_loop(tok, fmt: ChatFormat, turns: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        repo = Path(d) / "repo"
        repo.mkdir()
        for i in range(20):
            (repo / f"m{i}.py").write_text("".join(f"def f{j}(x):\n    return x * {j}\n" for j in range(30)))
        from looprl.sandbox import create_sandbox

        async def go() -> float:
            sb = await create_sandbox(repo)
            script = [call("read_file", path=f"m{t % 20}.py", limit=40) + call("grep", pattern="f1")
                      for t in range(turns)] + [call("finish")]
            task = Task(id="bench", repo=str(repo), prompt="bench", grader=Grader("true"))
            t0 = time.perf_counter()
            traj = await run_agent(task, sb, ScriptedPolicy(tok, script), fmt, make_tools(),
                                   AgentConfig(max_turns=turns + 1, context_window=10**7,
                                               max_total_new_tokens=10**7),
                                   group_id="b", trajectory_id="b/0")
            dt = time.perf_counter() - t0
            await sb.close()
            assert traj.stop_reason.value == "finished", traj.error
            return dt / (turns + 1) * 1e3

        return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3, help="the quickstart's max_turns")
    ap.add_argument("--long-turns", type=int, default=60)
    ap.add_argument("--reps", type=int, default=200, help="distinct conversations timed")
    args = ap.parse_args()
    corpus = [Path(__file__).read_text(), *(p.read_text() for p in Path("src/looprl/harness").rglob("*.py"))]
    tok = build_tokenizer(corpus * 4, vocab_size=2048)
    fmt = ChatFormat(tok)
    delta, rerender = bench_observations(fmt, args.turns, args.reps)
    long_delta, long_rerender = bench_observations(fmt, args.long_turns,
                                                   max(1, args.reps * args.turns // args.long_turns))
    loop = bench_loop(tok, fmt, args.long_turns)
    for n, d, r in ((args.turns, delta, rerender), (args.long_turns, long_delta, long_rerender)):
        print(f"{n} turns: observation delta {d:.3f} ms/turn, full re-render+re-tokenize "
              f"{r:.3f} ms/turn ({r / d:.2f}x)")
    print(f"agent loop (bwrap sandbox, 2 tools a turn, scripted policy, {args.long_turns} turns) "
          f"{loop:.1f} ms/turn")
    print(f"speedup={rerender / delta:.2f} delta_ms_per_turn={delta:.3f} "
          f"rerender_ms_per_turn={rerender:.3f} turns={args.turns} "
          f"flattering: speedup_long={long_rerender / long_delta:.2f} long_turns={args.long_turns} "
          f"loop_ms_per_turn={loop:.2f}")


if __name__ == "__main__":
    main()
