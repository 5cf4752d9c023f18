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
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

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

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Gymnasium's reset, but a seed's generator is built when `np_random` is first used: many text envs draw
        nothing at reset (a dataset row is the task), and building it is most of such a reset's cost. The draws are
        Gymnasium's: the same seed, the same stream."""
        if seed is not None:
            if not isinstance(seed, int) or seed < 0:
                seeding.np_random(seed)  # raises Gymnasium's error for a seed it would refuse
            self._np_random, self._np_random_seed = None, None
            self.__dict__["_unbuilt_seed"] = seed

    @property
    def np_random(self) -> np.random.Generator:
        if self._np_random is None:
            self._np_random, self._np_random_seed = seeding.np_random(self.__dict__.pop("_unbuilt_seed", None))
        return self._np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self.__dict__.pop("_unbuilt_seed", None)
        self._np_random, self._np_random_seed = value, -1  # as Gymnasium's setter: the seed is unknown

    @property
    def np_random_seed(self) -> int:
        if self._np_random_seed is None:
            _ = self.np_random
        return self._np_random_seed
