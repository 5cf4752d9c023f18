from envs.toy_text.actions import parse_action
from envs.toy_text.env import BlackjackEnv, CliffWalkingEnv, FrozenLakeEnv, TaxiEnv, ToyTextEnv
from envs.toy_text.renderers import decode_taxi

__all__ = ["BlackjackEnv", "CliffWalkingEnv", "FrozenLakeEnv", "TaxiEnv", "ToyTextEnv", "decode_taxi", "parse_action"]
