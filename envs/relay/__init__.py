"""A cooperative two-policy game: a proposer hints at a secret, a solver names it from the hint alone."""

from envs.relay.env import RelayEnv

__all__ = ["RelayEnv"]
