"""Nim for two players: take 1 to `max_take` from one pile; whoever takes the last wins."""

from envs.nim.env import NimEnv, random_move, take_one

__all__ = ["NimEnv", "random_move", "take_one"]
