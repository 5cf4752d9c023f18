from agentrl.env.api import TextEnv
from agentrl.env.registry import make, register, registered_ids
from agentrl.env.tools import Tool, ToolEnv, tool

__all__ = ["TextEnv", "Tool", "ToolEnv", "make", "register", "registered_ids", "tool"]
