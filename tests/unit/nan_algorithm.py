"""An algorithm configs name by path (`algorithm.name: tests.unit.nan_algorithm:NaNAdvantage`): RLOO whose
advantages are all NaN, as a buggy plug-in's could be. Every update it makes has a NaN loss."""

from typing import Literal

import numpy as np

from agentrl.algorithms.policy_gradient import RLOO, RLOOOptions


class NaNOptions(RLOOOptions):
    name: Literal["tests.unit.nan_algorithm:NaNAdvantage"] = "tests.unit.nan_algorithm:NaNAdvantage"


class NaNAdvantage(RLOO):
    name = "nan"
    summary = "NaN advantages (a test plug-in)"
    Options = NaNOptions

    def episode_advantages(self, batch, valid):
        return np.full(len(batch["reward"]), np.nan, dtype=np.float32)
