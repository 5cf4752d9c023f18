"""The environment API: Gymnasium's, with text observations and text actions.

    obs, info = env.reset(seed=..., options=...)
    obs, reward, terminated, truncated, info = env.step(action_text)

`obs` is the message the model sees next (the first one is the task prompt);
`action_text` is the assistant's decoded turn. `terminated` means the task ended
(solved or failed); `truncated` means the env cut the episode off.
"""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
from gymnasium import spaces

MAX_TEXT = 100_000


class TextEnv(gym.Env):
    """Base class for text environments; subclasses implement `reset` (calling super().reset(seed=seed)) and `step`."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Text(max_length=MAX_TEXT)
        self.action_space = spaces.Text(max_length=MAX_TEXT)
