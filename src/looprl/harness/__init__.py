"""The agent harness: the loop (``agent.py``), the chat/tool-call format (``format.py``), the
tools (``tools/``, one a file) and model-free engines (``policies.py``).

    from looprl.harness import AgentConfig, ChatFormat, make_tools, run_agent
    traj = await run_agent(task, sandbox, engine, ChatFormat(tok), make_tools(), AgentConfig(),
                           group_id="g0", trajectory_id="g0/0")
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (its cli.py) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "agent": ["AgentConfig", "AgentRun", "ContextHook", "run_agent"],
    "format": ["ChatFormat", "ParsedTurn", "parse_turn"],
    "policies": ["OracleAgent", "ScriptedPolicy"],
    "tools": ["DEFAULT_TOOLS", "TOOLS", "ToolContext", "make_tools", "tool_schemas"],
})
