"""The agent harness: the loop (``agent.py``), the state one run carries (``run_state.py``),
self-summarization (``summarize.py``), the tools (``tools/``, one a file) and two model-free
engines: the scripted test double (``scripted.py``) and the gold-patch oracle (``oracle.py``). The chat/tool-call format it speaks is ``looprl.chat``.

    from looprl.chat import ChatFormat
    from looprl.harness import AgentConfig, make_tools, run_agent
    traj = await run_agent(task, sandbox, engine, ChatFormat(tok), make_tools(), AgentConfig(),
                           group_id="g0", trajectory_id="g0/0")
"""

from looprl.lazy import lazy_exports

# Imported on first use: importing one module of the package (a command's, say) stays light.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "agent": ["run_agent"],
    "run_state": ["AgentConfig", "AgentExperimental", "AgentRun", "ContextHook"],
    "oracle": ["OracleAgent"],
    "scripted": ["ScriptedPolicy"],
    "tools": ["DEFAULT_TOOLS", "TOOLS", "ToolContext", "make_tools", "tool_schemas"],
})
