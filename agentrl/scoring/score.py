"""What scoring an episode gives (Score) or why it gave nothing (ScoreFailed), and how a score meets the env's
reward (`reward_mode` / `reward.mode`: replace or add)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.trajectory import finite_reward


@dataclass(frozen=True)
class Score:
    reward: float
    success: bool | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # added to the episode's (episode/NAME_mean)


class ScoreFailed(Exception):
    """Why an episode got no score (a judge down, slow or unparsable); the episode fails with this reason."""


def combined_reward(mode: str, env_reward: float, score: Score, what: str) -> float:
    """The episode's reward: the score (`replace`) or the env's plus the score (`add`); RewardError when the sum
    leaves float32's range. `what` names the scorer in that error."""
    if mode == "replace":
        return score.reward
    return finite_reward(env_reward + score.reward, f"the env's reward plus {what}'s")
