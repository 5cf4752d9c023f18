from agentrl.env.api import TextEnv
from agentrl.env.registry import make, register, registered_ids

__all__ = ["TextEnv", "make", "register", "registered_ids"]
