"""The configured model scorer behind the episode loop's reward hook: an episode's arguments -> its text ->
the batcher -> a Score. It offers what a reward function offers the loop (`score`, `combine`, `path`). It runs on
the rollout rank, or on a scorer rank (agentrl/roles/scorer.py) that rollout ranks reach through
agentrl/scoring/remote.py."""

from __future__ import annotations

import time

from agentrl.config.schema import RewardConfig
from agentrl.scoring.batcher import ScoreBatcher
from agentrl.scoring.score import Score, combined_reward
from agentrl.scoring.transcript import conversation, fill


class ModelScorer:
    """Scores finished episodes with `reward.judge` or `reward.model`; a ScoreFailed from `score` fails the
    episode with its reason. Each Score carries metrics: `score_cached` (1: no call of its own) and
    `score_wait_s` (seconds from asking to the answer), reported as episode/score_cached_mean and
    episode/score_wait_s_mean."""

    def __init__(self, config: RewardConfig, device: str = "cpu"):
        self.config, self.mode = config, config.mode
        self.path = config.scorer_name
        self.judge = self.reward_model = None
        if config.judge is not None and config.judge.path is not None:
            from agentrl.scoring.local_judge import LocalJudge

            self.judge = LocalJudge(config.judge, device)
            score_batch, options = self.judge.score_batch, config.judge
        elif config.judge is not None:
            from agentrl.scoring.judge import JudgeClient

            self.judge = JudgeClient(config.judge)
            score_batch, options = self.judge.score_batch, config.judge
        else:
            from agentrl.scoring.reward_model import RewardModel

            self.reward_model = RewardModel(config.model, device)
            self.reward_model.check_chat_template()
            score_batch, options = self.reward_model.score_batch, config.model
        self.batcher = ScoreBatcher(score_batch, options.batch_size, options.batch_wait_s, options.cache_size)

    def text(self, arguments: dict) -> str:
        """What the scorer reads for this episode (also its cache key)."""
        if self.judge is not None:
            return fill(self.config.judge.rubric, arguments)
        if self.reward_model.uses_chat_template():
            return self.reward_model.text(conversation(arguments))
        return fill(self.config.model.prompt, arguments)

    async def score(self, **arguments) -> Score:
        return await self.score_text(self.text(arguments))

    async def score_text(self, text: str) -> Score:
        """The Score of a text `text` made (a ScoreFailed with the reason when it has none)."""
        started = time.perf_counter()
        value, cached = await self.batcher.score(text)
        success = None if self.config.success_at is None else value >= self.config.success_at
        metrics = {"score_cached": float(cached), "score_wait_s": time.perf_counter() - started}
        return Score(value, success, metrics)

    def combine(self, env_reward: float, score: Score) -> float:
        return combined_reward(self.mode, env_reward, score, self.path)


def make_scorer(config: RewardConfig, device: str = "cpu") -> ModelScorer | None:
    """The scorer `config` (the `reward` section) names, or None when it names none."""
    return ModelScorer(config, device) if config.enabled else None
