"""Episode scores from models: an LLM judge over an OpenAI-compatible endpoint, or a sequence-classification reward
model, both batched and cached (docs/rewards.md). `make_scorer(reward_config, device)` builds the one configured."""

from __future__ import annotations

from agentrl.scoring.score import Score, ScoreFailed, combined_reward
from agentrl.scoring.scorer import ModelScorer, make_scorer

__all__ = ["ModelScorer", "Score", "ScoreFailed", "combined_reward", "make_scorer"]
