from envs.calculator.arithmetic import evaluate
from envs.calculator.env import CalculatorEnv

__all__ = ["CalculatorEnv", "evaluate"]
