"""Real tasks from real packages.

- ``sources``: ``fetch_package("NAME==VERSION")`` -> ``PackageSnapshot`` (sdist, test venv,
  passing tests recorded twice in the sandbox; cached under LOOPRL_HOME/packages).
- ``mutate``: AST-located bug injection (``MUTATORS``), multi-site ``combine``, feature deletion.
- ``coverage``: which tests call which function (one traced suite run) -> ``CallMap``.
- ``build``: screening, task repos and validation -> ``build_package_tasks``.
- ``releases``: tasks from tests a newer release added -> ``build_release_tasks``.
- ``prompts``: terse user-like prompts in several styles (``STYLES``).
- ``taskset``: JSONL task files (``write_tasks`` / ``load_tasks``), splits, the summary table.
- ``timing``: seconds per build stage (``benchmarks/tasks.py`` prints the breakdown).
- ``cli``: ``looprl tasks fetch|build|show``.

    snap = fetch_package("inflection==0.5.1")
    tasks = build_package_tasks(snap, BuildConfig(max_tasks=40))
    write_tasks(tasks, "tasks.jsonl")
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "build": ["BuildConfig", "build_package_tasks"],
    "releases": ["build_release_tasks"],
    "sources": ["PackageSnapshot", "fetch_package"],
    "taskset": ["load_tasks", "split_by_function", "split_by_package", "write_tasks"],
})
