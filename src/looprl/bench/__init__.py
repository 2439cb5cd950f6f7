"""The CursorBench-like benchmark: a policy on held-out tasks through the real harness.

- ``run``: ``run_bench(tasks, "oracle" | "null" | "model:PATH" | "openai:URL", k)`` -> samples.
- ``report``: ``summarize`` (pass@1, unbiased pass@k, tokens, tool calls, turns, wall time,
  broken tool calls), ``write_report`` (JSON + markdown + PNG).
- ``gate``: ``compare`` two reports with paired bootstrap CIs; the checkpoint promotion gate.
- ``cli``: ``looprl bench run|compare``.
"""
