from envs.python_tool.env import PythonToolEnv
from envs.python_tool.grading import is_correct
from envs.python_tool.problems import FAMILIES, Problem, generate

__all__ = ["FAMILIES", "Problem", "PythonToolEnv", "generate", "is_correct"]
