from agentrl.env.api import FreeText, TextEnv
from agentrl.env.registry import make, register, register_adapter, registered_ids
from agentrl.env.tools import Tool, ToolEnv, tool

__all__ = ["FreeText", "TextEnv", "Tool", "ToolEnv", "make", "register", "register_adapter", "registered_ids", "tool"]
