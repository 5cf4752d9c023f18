"""agentrl: MPI-native multi-turn agentic RL for language models."""

__version__ = "0.1.0"
