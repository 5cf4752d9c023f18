from envs.qa.env import QAEnv

__all__ = ["QAEnv"]
