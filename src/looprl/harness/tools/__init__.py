"""The harness tools: one file per tool, picked by name through ``TOOLS``.

    tools = make_tools(DEFAULT_TOOLS, test_command="python -m pytest")

``make_tools`` passes each tool only the per-task resources its constructor names (a search
index, the task's test command, ...), so adding a tool is one import and one registry line.
"""

from __future__ import annotations

import inspect
from typing import Any

from looprl.errors import ConfigError
from looprl.harness.tools.base import ToolContext, signature, validate_args
from looprl.harness.tools.edit_file import EditFile
from looprl.harness.tools.finish import Finish
from looprl.harness.tools.glob_files import Glob
from looprl.harness.tools.grep import Grep
from looprl.harness.tools.list_dir import ListDir
from looprl.harness.tools.memory import Memory
from looprl.harness.tools.read_file import ReadFile
from looprl.harness.tools.read_lints import ReadLints
from looprl.harness.tools.run_terminal import RunTerminal
from looprl.harness.tools.run_tests import RunTests
from looprl.harness.tools.semantic_search import SemanticSearch
from looprl.harness.tools.write_file import WriteFile
from looprl.protocols import Tool

TOOLS: dict[str, type] = {
    "read_file": ReadFile,
    "list_dir": ListDir,
    "glob": Glob,
    "grep": Grep,
    "edit_file": EditFile,
    "write_file": WriteFile,
    "run_terminal": RunTerminal,
    "read_lints": ReadLints,
    "run_tests": RunTests,
    "memory": Memory,
    "finish": Finish,
    "semantic_search": SemanticSearch,
}

DEFAULT_TOOLS: tuple[str, ...] = tuple(n for n in TOOLS if n != "semantic_search")
"""semantic_search needs a trained embedding model and an index (``search_index`` resource), so it
is offered only when a run configures one."""


def make_tools(names: tuple[str, ...] | list[str] = DEFAULT_TOOLS, **resources: Any) -> list[Tool]:
    """Instantiate tools by name; each receives the ``resources`` its ``__init__`` accepts."""
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise ConfigError(f"unknown tool(s) {unknown}; available: {sorted(TOOLS)}")
    tools = []
    for name in names:
        cls = TOOLS[name]
        accepted = inspect.signature(cls.__init__).parameters
        tools.append(cls(**{k: v for k, v in resources.items() if k in accepted}))
    return tools


def tool_schemas(tools: list[Tool]) -> list[dict[str, Any]]:
    """OpenAI function-calling schemas, the form chat templates render."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in tools]


__all__ = ["DEFAULT_TOOLS", "TOOLS", "ToolContext", "make_tools", "signature", "tool_schemas",
           "validate_args"]
