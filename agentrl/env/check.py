"""`agentrl check-env`: does an environment follow the API? Returns a list of problems."""

from __future__ import annotations

import random

from agentrl.env.registry import make


def check_env(env_id: str, kwargs: dict, episodes: int = 3, max_steps: int = 50) -> list[str]:
    problems: list[str] = []
    try:
        env = make(env_id, **kwargs)
    except Exception as error:  # report, do not crash: this is a checker
        return [f"constructing {env_id}: {type(error).__name__}: {error}"]
    first = env.reset(seed=123)
    if not (isinstance(first, tuple) and len(first) == 2 and isinstance(first[0], str) and isinstance(first[1], dict)):
        return [f"reset() must return (str, dict), got {first!r:.80}"]
    again = make(env_id, **kwargs).reset(seed=123)
    if again[0] != first[0]:
        problems.append("reset(seed=123) twice gave different observations: seed the env via super().reset(seed=seed)")
    rng = random.Random(0)
    for episode in range(episodes):
        env.reset(seed=episode)
        for _ in range(max_steps):
            out = env.step(str(rng.randint(0, 20)))
            if not (isinstance(out, tuple) and len(out) == 5):
                problems.append(f"step() must return (obs, reward, terminated, truncated, info), got {out!r:.80}")
                return problems
            obs, reward, terminated, truncated, info = out
            if not isinstance(obs, str):
                problems.append(f"step() observation must be str, got {type(obs).__name__}")
            if not isinstance(reward, int | float):
                problems.append(f"step() reward must be a number, got {type(reward).__name__}")
            if not isinstance(info, dict):
                problems.append(f"step() info must be a dict, got {type(info).__name__}")
            if terminated or truncated:
                break
        else:
            problems.append(f"episode {episode} did not end within {max_steps} random steps")
    return problems
