"""Which algorithms read an episode turn by turn (values per token, the env's states): not for agent programs."""

TURN_LEVEL_ALGORITHMS = ("ppo", "gigpo")
