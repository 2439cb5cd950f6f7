"""The harness tools: one file per tool, picked by name through ``TOOLS``.

    tools = make_tools(DEFAULT_TOOLS, test_command="python -m pytest")
    tools = make_tools(["read_file", "edit_file", "my_pkg.tools:CountLines"])   # a plugin

``make_tools`` passes each tool only the per-task resources its constructor names (a search
index, the task's test command, ...), so adding a tool is one import and one registry line, or
a plugin outside looprl (``looprl.plugins``: an entry point or ``module:attr``).
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
from looprl.plugins import find
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
    """Instantiate tools by name (built-in or plugin); each receives the ``resources`` its
    ``__init__`` accepts."""
    tools: list[Tool] = []
    for name in names:
        cls = find("tools", name, TOOLS)
        accepted = inspect.signature(cls).parameters
        tool = cls(**{k: v for k, v in resources.items() if k in accepted})
        if not isinstance(tool, Tool):
            raise ConfigError(f"tool {name!r} ({cls!r}) does not follow looprl.protocols.Tool: "
                              "it needs name, description, parameters, read_only and async run")
        tools.append(tool)
    seen = [t.name for t in tools]
    if len(set(seen)) != len(seen):
        raise ConfigError(f"two tools share a name in {seen}; each tool's name must be unique")
    return tools


def tool_schemas(tools: list[Tool]) -> list[dict[str, Any]]:
    """OpenAI function-calling schemas, the form chat templates render."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in tools]


__all__ = ["DEFAULT_TOOLS", "TOOLS", "ToolContext", "make_tools", "signature", "tool_schemas",
           "validate_args"]
