"""A cooperative two-policy game: a proposer poses a problem whose answer is a target, a solver solves it."""

from envs.relay.env import RelayEnv

__all__ = ["RelayEnv"]
