"""`env.id: skyrl_gym:NAME`: a SkyRL-Gym environment (gsm8k, gsm8k_multi_turn, text2sql, aime, search, ...) as an
agentrl TextEnv, one dataset row per episode in SkyRL's own row format.

    data: {train: rows.jsonl}   # {"prompt": [{"role": "user", "content": ...}], "reward_spec": {"ground_truth": ...}}
    env:
      id: skyrl_gym:gsm8k
      kwargs: {env_config: {}, max_steps: 16}   # env_config: SkyRL's per-env config (text2sql: {db_path: ...})

Each reset builds `skyrl_gym.make(NAME, env_config=..., extras=row)` (the row less its prompt and env_class, as
SkyRL's generator passes it) and `init`s it with the row's prompt; each step maps SkyRL's
`{"observations": [messages], "reward", "done", "metadata"}` onto (observation, reward, terminated, False, info).
"""

from __future__ import annotations

import math
from typing import Any

from agentrl.env.api import TextEnv

INSTALL = "pip install 'agentrl[skyrl-gym]'"
ROW_KEYS_NOT_EXTRAS = ("prompt", "env_class")  # the rest of a SkyRL row reaches the env as `extras`


def make(name: str, **kwargs) -> SkyRLGymEnv:
    """The adapter behind the `skyrl_gym` prefix (the `agentrl.env_adapters` entry point)."""
    return SkyRLGymEnv(name, **kwargs)


def skyrl_gym_module():
    try:
        import skyrl_gym
    except ImportError:
        raise ImportError(f"env ids skyrl_gym:NAME need the skyrl-gym package: {INSTALL}") from None
    return skyrl_gym


class SkyRLGymEnv(TextEnv):
    """SkyRL-Gym's environment `name`, one per episode, built from the episode's dataset row.

    Args:
        name: a SkyRL-Gym id (`skyrl_gym.pprint_registry()` lists them): gsm8k, gsm8k_multi_turn, text2sql, ...
        env_config: SkyRL's config of that env (an OmegaConf mapping there), e.g. text2sql's {db_path: ...}
        max_steps: steps after which an episode the SkyRL env never ends fails, naming the env
        success_reward: the last step's reward at or above which the episode counts as a success
    """

    required_columns = ("prompt",)

    def __init__(
        self, name: str, env_config: dict | None = None, max_steps: int = 32, success_reward: float = 1.0
    ) -> None:
        super().__init__()
        skyrl_gym = skyrl_gym_module()
        if name not in skyrl_gym.registry:
            known = ", ".join(sorted(skyrl_gym.registry))
            raise ValueError(f"skyrl_gym:{name} is not a SkyRL-Gym environment; the registered ones: {known}")
        if max_steps < 1:
            raise ValueError(f"env.kwargs.max_steps={max_steps} must be at least 1")
        self.name, self.max_steps, self.success_reward = name, max_steps, success_reward
        self.env_config = dict(env_config or {})
        self.env = None
        self.steps = 0
        self.done = True

    def check_row(self, row: dict) -> str | None:
        """None when the row can start an episode, else what is wrong with it (agentrl checks data.train with it)."""
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            return None if prompt.strip() else "its prompt is empty"
        if not isinstance(prompt, list) or not prompt:
            return "its prompt must be a non-empty list of chat messages (SkyRL's row format) or a string"
        if problem := _message_problem(prompt, "its prompt"):
            return problem
        if prompt[-1]["role"] != "user":
            return f"its prompt must end with a user message, not {prompt[-1]['role']!r}"
        return None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options is None:
            raise ValueError(
                f"skyrl_gym:{self.name} serves dataset rows in SkyRL's format ({{'prompt': [messages], "
                "'reward_spec': {'ground_truth': ...}, ...}): set data.train to a .jsonl/.parquet file of them "
                f"(`agentrl check-env skyrl_gym:{self.name} --data FILE`)"
            )
        if problem := self.check_row(options):
            raise ValueError(f"skyrl_gym:{self.name} cannot serve this row: {problem}")
        self.close()
        from omegaconf import OmegaConf

        prompt = options["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        extras = {key: value for key, value in options.items() if key not in ROW_KEYS_NOT_EXTRAS}
        self.env = skyrl_gym_module().make(self.name, env_config=OmegaConf.create(self.env_config), extras=extras)
        conversation, metadata = self.env.init([dict(message) for message in messages])
        if problem := _message_problem(conversation, f"skyrl_gym:{self.name} init()"):
            raise ValueError(problem)
        if not conversation or conversation[-1]["role"] != "user":
            raise ValueError(f"skyrl_gym:{self.name} init() must return messages ending with a user message")
        self.steps, self.done = 0, False
        info: dict[str, Any] = {"answer": _ground_truth(options)}
        if len(conversation) > 1:
            info["prompt_messages"] = [{"role": m["role"], "content": m["content"]} for m in conversation[:-1]]
        if metadata:
            info["skyrl_metadata"] = metadata
        return conversation[-1]["content"], info

    def step(self, action: str):
        if self.env is None or self.done:
            raise RuntimeError(f"skyrl_gym:{self.name}: the episode has ended (or never started); call reset()")
        self.steps += 1
        output = self.env.step(action)
        if not isinstance(output, dict) or not {"observations", "reward", "done"} <= output.keys():
            raise ValueError(
                f"skyrl_gym:{self.name} step() returned {output!r:.200}, not SkyRL's "
                "{'observations': [...], 'reward': float, 'done': bool, 'metadata': {...}}"
            )
        observations = output["observations"] or []
        if problem := _message_problem(observations, f"skyrl_gym:{self.name} step() observations", allow_empty=True):
            raise ValueError(problem)
        reward = output["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ValueError(f"skyrl_gym:{self.name} step() returned reward {reward!r}, not a finite number")
        self.done = bool(output["done"])
        if not self.done and self.steps >= self.max_steps:
            raise RuntimeError(
                f"skyrl_gym:{self.name} did not end its episode within env.kwargs.max_steps={self.max_steps} steps"
            )
        info: dict[str, Any] = {"skyrl_metadata": output.get("metadata") or {}}
        if self.done:
            info["success"] = float(reward) >= self.success_reward
        text = "\n\n".join(message["content"] for message in observations)
        return text, float(reward), self.done, False, info

    def close(self):
        if self.env is not None:
            self.env.close()
            self.env = None


def _ground_truth(row: dict):
    for key in ("reward_spec", "reward_model"):  # aime's rows say reward_model
        spec = row.get(key)
        if isinstance(spec, dict) and "ground_truth" in spec:
            return spec["ground_truth"]
    return None


def _message_problem(messages, where: str, allow_empty: bool = False) -> str | None:
    """What is wrong with a list of chat messages, or None."""
    if not isinstance(messages, list) or (not messages and not allow_empty):
        return f"{where} must be a {'' if allow_empty else 'non-empty '}list of chat messages, got {messages!r:.200}"
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return f"{where}: message {position} is not a {{'role': ..., 'content': str}} mapping: {message!r:.200}"
        if not isinstance(message.get("role"), str):
            return f"{where}: message {position} has no role: {message!r:.200}"
    return None
