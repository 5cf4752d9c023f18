"""An example agentrl environment plugin: tiny Wordle with a word-search tool."""

from agentrl_wordle.env import WordleEnv, find_guess
from agentrl_wordle.game import score, shipped_words

__all__ = ["WordleEnv", "find_guess", "score", "shipped_words"]
