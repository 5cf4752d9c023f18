"""`env.id: reasoning_gym:NAME`: a reasoning-gym dataset (countdown, basic_arithmetic, ...) as an agentrl env.

Each episode asks one of the dataset's questions; the model's answer (the text inside `<answer>...</answer>`, or
its whole turn with `answer_tag: null`) is graded by the dataset's own `score_answer`, which is the reward. env.kwargs
are the dataset's config fields (`min_numbers`, `max_terms`, ...), plus the adapter's own: `answer_tag`, `tries`,
`success_score`, `heldout_every`, `heldout_seeds`.

The dataset is built once per process with the config's `seed` (default 0, not reasoning-gym's random one, so every
rank holds the same problems) and `size` (the dataset's default); the episode seed picks the problem, so a GRPO
group shares it, and with `heldout_every` seeds in `heldout_seeds` (the evaluation's) draw only held-out problems.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading

from agentrl.env.api import TextEnv
from agentrl.env.heldout import DEFAULT_SEEDS, HeldoutSplit
from agentrl.plugins import did_you_mean

INSTALL = "pip install 'agentrl[reasoning-gym]'"
ADAPTER_KEYS = ("answer_tag", "tries", "success_score", "heldout_every", "heldout_seeds")
_build_lock = threading.Lock()


def reasoning_gym_module():
    """The `reasoning_gym` package, or an ImportError that says how to install it."""
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(f"env ids 'reasoning_gym:NAME' need the reasoning-gym package: {INSTALL}") from error
    return reasoning_gym


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def build_dataset(name: str, config: dict):
    """The dataset `name` with `config` (seed 0 unless given), built once per process and shared by its episodes."""
    reasoning_gym = reasoning_gym_module()
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        raise ValueError(
            f"reasoning-gym has no dataset {name!r}{did_you_mean(name, DATASETS)}; env.id must be "
            f"reasoning_gym:NAME with NAME one of {len(DATASETS)}: {', '.join(sorted(DATASETS))}"
        )
    fields = {field.name for field in dataclasses.fields(DATASETS[name][1])}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise ValueError(
            f"env.kwargs {unknown[0]!r}{did_you_mean(unknown[0], fields)} is not a config field of reasoning-gym's "
            f"{name!r} (its fields: {', '.join(sorted(fields))}; the adapter's: {', '.join(ADAPTER_KEYS)})"
        )
    key = json.dumps({"seed": 0, **config}, sort_keys=True, default=repr)
    with _build_lock:
        return _cached_dataset(reasoning_gym, name, key)


@functools.lru_cache(maxsize=32)
def _cached_dataset(reasoning_gym, name: str, key: str):
    config = json.loads(key)
    try:
        return reasoning_gym.create_dataset(name, **config)
    except (AssertionError, TypeError, ValueError) as error:  # reasoning-gym validates configs with asserts
        raise ValueError(
            f"reasoning-gym's {name!r} rejects env.kwargs {config}: {error or type(error).__name__}"
        ) from None


def extract_answer(text: str, tag: str | None) -> str | None:
    """The answer in the turn: inside the last `<tag>...</tag>` (None when there is none), or the whole turn."""
    if tag is None:
        return text.strip()
    from reasoning_gym.utils import extract_answer as extract_tagged

    return extract_tagged(text, tag_name=tag)


class ReasoningGymEnv(TextEnv):
    """One question of a reasoning-gym dataset per episode; its `score_answer` grades each answer."""

    def __init__(
        self,
        name: str,
        answer_tag: str | None = "answer",
        tries: int = 1,
        success_score: float = 1.0,
        heldout_every: int = 0,
        heldout_seeds: tuple[int, int] | list[int] = DEFAULT_SEEDS,
        **config,
    ):
        super().__init__()
        if not isinstance(tries, int) or tries < 1:
            raise ValueError(f"env.kwargs.tries must be an int >= 1 (answers allowed per question), got {tries!r}")
        if answer_tag is not None and (not isinstance(answer_tag, str) or not answer_tag.isidentifier()):
            raise ValueError(f"env.kwargs.answer_tag must be a tag name such as 'answer', or null, got {answer_tag!r}")
        self.name = name
        self.dataset = build_dataset(name, config)
        self.answer_tag, self.tries, self.success_score = answer_tag, tries, float(success_score)
        self.split = HeldoutSplit(heldout_every, heldout_seeds)
        self.entry: dict | None = None
        self.answers = 0
        self.done = True

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        size = len(self.dataset)
        self.entry = self.split.draw(
            seed, lambda: self.dataset[int(self.np_random.integers(size))], text_of=lambda entry: entry["question"]
        )
        self.answers, self.done = 0, False
        question = self.entry["question"]
        if not isinstance(question, str) or not question:
            raise TypeError(
                f"reasoning-gym's {self.name!r} gave a question that is not a non-empty str: {question!r:.80}"
            )
        return question, {"answer": str(self.entry["answer"]), "state_key": question}

    def step(self, action: str):
        if self.done:
            raise RuntimeError(f"reasoning_gym:{self.name}: the episode is over; call reset() before step()")
        self.answers += 1
        answer = extract_answer(action, self.answer_tag)
        score = float(self.dataset.score_answer(answer, self.entry))
        success = score >= self.success_score
        self.done = success or self.answers >= self.tries
        info = {"success": success, "score": score, "metrics": {"score": score}, "state_key": self.answers}
        if self.done:
            return "", score, True, False, info
        missing = "" if answer is not None else f" Put the answer inside <{self.answer_tag}></{self.answer_tag}>."
        observation = f"Not right (score {score:.2f}).{missing} Try again: {self.tries - self.answers} left."
        return observation, 0.0, False, False, info


def make(name: str, **kwargs) -> ReasoningGymEnv:
    """The adapter registered for the `reasoning_gym` prefix."""
    return ReasoningGymEnv(name, **kwargs)
