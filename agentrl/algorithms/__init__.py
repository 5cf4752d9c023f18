"""RL algorithms as plug-ins: pick one with `algorithm.name`, list them with `agentrl algorithms`.

Write your own by subclassing `PolicyGradient` (or `Algorithm`) and naming it in the config
as `algorithm.name: package.module:Class`, registering it with `register`, or declaring it
under the `agentrl.algorithms` entry point group of your package (docs/algorithms.md).
"""

from collections.abc import Callable

from agentrl.algorithms.base import (
    Algorithm,
    AlgorithmContext,
    AlgorithmOptions,
    CorrectionOptions,
    LossInputs,
    PolicyGradient,
    PolicyGradientOptions,
    Reduce,
)
from agentrl.algorithms.registry import register, registered_names, resolve


def make_algorithm(config, context: AlgorithmContext) -> Algorithm:
    """The algorithm the config names, built with its validated options."""
    return resolve(config.algorithm.name)(config.algorithm, context)


def algorithm_of(config) -> Callable[[Reduce], Algorithm]:
    """The config's algorithm as PolicyTrainer and RolloutWorker take it: built once they supply the reduce.
    Algorithms see the whole config (`AlgorithmContext.config`, their plug-in API)."""
    return lambda reduce: make_algorithm(config, AlgorithmContext(config=config, reduce=reduce))


__all__ = [
    "Algorithm",
    "AlgorithmContext",
    "AlgorithmOptions",
    "CorrectionOptions",
    "LossInputs",
    "PolicyGradient",
    "PolicyGradientOptions",
    "algorithm_of",
    "make_algorithm",
    "register",
    "registered_names",
    "resolve",
]
