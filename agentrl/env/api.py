"""The environment API: Gymnasium's, with text observations and text actions.

    obs, info = env.reset(seed=..., options=...)
    obs, reward, terminated, truncated, info = env.step(action_text)

`obs` is the message the model sees next (the first one is the task prompt);
`action_text` is the assistant's decoded turn. `terminated` means the task ended
(solved or failed); `truncated` means the env cut the episode off.
"""

from __future__ import annotations

import string
from typing import ClassVar

import gymnasium as gym
from gymnasium import spaces

MAX_TEXT = 100_000


class FreeText(spaces.Text):
    """Any string up to `max_length` characters (Gymnasium's Text only holds its charset); samples printable text."""

    def __init__(self, max_length: int = MAX_TEXT, seed=None):
        super().__init__(max_length=max_length, charset=string.printable, seed=seed)

    def contains(self, x) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText(max_length={self.max_length})"


class _FreeTextSpace:
    """A FreeText space made on first access and kept on the instance: an env made per episode skips building
    two Gymnasium spaces (half its construction time) unless something asks for them. Assigning the attribute
    replaces it, as for any attribute."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, env, owner=None):
        if env is None:
            return self
        space = env.__dict__[self.name] = FreeText()
        return space


class TextEnv(gym.Env):
    """Base class for text environments; subclasses implement `reset` (calling super().reset(seed=seed)) and `step`.

    `reusable = True`, set in a class itself (it is not inherited: a subclass may add state its reset does not set),
    says that `reset` sets all of an episode's state, so one instance may play episode after episode: the env host
    then keeps a closed episode's instance for the next episode's reset instead of closing it and building another
    (env.reuse_instances), and `agentrl check-env` checks that a used instance resets as a new one does.
    """

    metadata: ClassVar[dict] = {"render_modes": []}
    reusable: ClassVar[bool] = False
    observation_space = _FreeTextSpace()
    action_space = _FreeTextSpace()
