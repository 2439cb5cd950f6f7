"""The agent harness: the loop (``agent.py``), the chat/tool-call format (``format.py``), the
tools (``tools/``, one a file) and model-free engines (``policies.py``).

    from looprl.harness import AgentConfig, ChatFormat, make_tools, run_agent
    traj = await run_agent(task, sandbox, engine, ChatFormat(tok), make_tools(), AgentConfig(),
                           group_id="g0", trajectory_id="g0/0")
"""

from looprl.harness.agent import AgentConfig, AgentRun, ContextHook, run_agent
from looprl.harness.format import ChatFormat, ParsedTurn, parse_turn
from looprl.harness.policies import OracleAgent, ScriptedPolicy
from looprl.harness.tools import DEFAULT_TOOLS, TOOLS, ToolContext, make_tools, tool_schemas

__all__ = ["DEFAULT_TOOLS", "TOOLS", "AgentConfig", "AgentRun", "ChatFormat", "ContextHook",
           "OracleAgent", "ParsedTurn", "ScriptedPolicy", "ToolContext", "make_tools", "parse_turn",
           "run_agent", "tool_schemas"]
