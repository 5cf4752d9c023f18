"""Reward functions that tests name in configs as `tests.unit.reward_fns:NAME`."""


def exact_answer(completion: str, answer: str | None) -> dict:
    success = answer is not None and completion.strip().endswith(answer)
    return {"reward": 2.0 if success else -1.0, "success": success}


def everything(**kwargs) -> float:
    everything.seen = kwargs
    return 0.5


def broken(completion: str) -> float:
    raise ZeroDivisionError("bug in the reward")


def needs_unknown(completion: str, gold_label: str) -> float:
    return 0.0


def returns_text(completion: str) -> str:
    return "high"


def turns_penalty(transcript: list, env_reward: float) -> float:
    return env_reward - 0.01 * len(transcript)


def nan_reward(completion: str) -> float:
    return float("nan")


def infinite_in_a_dict(completion: str) -> dict:
    return {"reward": float("inf"), "success": True}
