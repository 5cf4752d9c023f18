"""Environment plugins that ship with agentrl."""
