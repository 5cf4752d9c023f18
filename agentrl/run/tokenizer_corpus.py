"""The tiny tokenizer's corpus: observations and random actions from a few episodes of the run's env."""

from __future__ import annotations

import random

from agentrl.config import Config
from agentrl.env.registry import make
from agentrl.models.chat_format import tools_as_text


def random_number(rng: random.Random) -> str:
    return str(rng.randint(0, 99))


def env_texts(config: Config, episodes: int = 64, turns: int | None = None, action=random_number) -> list[str]:
    """Observations and random actions (`action(rng)`, numbers to 99 by default) from a few env episodes of at most
    `turns` steps (rollout.max_turns by default), on data.train's first rows if set: the tiny tokenizer's corpus."""
    if config.env.id.startswith("verifiers:"):  # no TextEnv: the taskset's own text (agentrl/env/adapters/verifiers.py)
        from agentrl.env.adapters.verifiers import taskset_texts

        return taskset_texts(config.env.id, config.env.kwargs)
    rows = None
    if config.data.train:
        from agentrl.data.loading import load_rows

        rows = load_rows(config.data.train)
        episodes = min(episodes, len(rows))
    env = make(config.env.id, **config.env.kwargs)
    try:  # closed after: an env may hold a server's session (openenv:http://...) for as long as it is open
        texts = _episode_texts(env, episodes, rows, config.rollout.max_turns if turns is None else turns, action)
        tools = list(getattr(env, "tools", None) or [])
    finally:
        env.close()
    if config.env.system_prompt:
        texts.append(config.env.system_prompt)
    if tools:
        texts.append(tools_as_text(tools))
    return texts


def _episode_texts(env, episodes: int, rows: list[dict] | None, max_turns: int, action) -> list[str]:
    rng = random.Random(0)
    texts = []
    for seed in range(episodes):
        observation, _ = env.reset(seed=seed) if rows is None else env.reset(seed=seed, options=rows[seed])
        texts.append(observation)
        for _ in range(max_turns):
            taken = action(rng)
            observation, _, terminated, truncated, _ = env.step(taken)
            texts += [taken, observation]
            if terminated or truncated:
                break
    return texts
