from envs.guess_number.env import GuessNumberEnv

__all__ = ["GuessNumberEnv"]
