"""A third-party algorithm as a user's package would ship it: +1 / -1 advantages around the group mean."""

from typing import Literal

import numpy as np
from pydantic import Field

from agentrl.algorithms import PolicyGradient, PolicyGradientOptions


class SignOptions(PolicyGradientOptions):
    name: Literal["sign", "sign_algorithm:SignAdvantage"] = "sign"
    scale: float = Field(1.0, gt=0, description="Size of the +/- advantage.")


class SignAdvantage(PolicyGradient):
    """Advantage = scale * sign(reward - group mean): only the direction of the group-relative advantage."""

    name = "sign"
    summary = "sign of the group-relative reward (a test plug-in)"
    Options = SignOptions

    def episode_advantages(self, batch, valid):
        advantages = np.zeros(len(batch["reward"]), dtype=np.float32)
        for group in np.unique(batch["group"]):
            members = (batch["group"] == group) & valid
            if members.any():
                centred = batch["reward"][members] - batch["reward"][members].mean()
                advantages[members] = self.options.scale * np.sign(centred)
        return advantages
