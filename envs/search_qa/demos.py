"""Demonstrations of the search_qa env for SFT: Hugging Face messages transcripts, some of them imperfect.

A demonstration is played through the env itself (reset from a seed, the tool calls and the answer sent with
`step`), so every passage and reward is the env's own. Two kinds:

- `tool`: `open` each passage the question needs, in order: the one named in the question, then for a two-hop
  question the one the first passage names (the founder, the inventor, the town, the river). Then answer with the
  gold answer, which the last passage states. Always right (reward 1).
- `direct`: answer at once, without the tool, as a guess: the answer of another question of the same kind, or
  with probability `direct_correct` the right one.

The demonstrator skips the tools more often on the one-hop questions, so a model that imitates it guesses those;
RL with the env's reward has to learn to read there too.

    python -m envs.search_qa.demos launch/data/search_qa_sft_train.jsonl --seeds 0:3000 --no-tool-list
    python -m envs.search_qa.demos launch/data/search_qa_sft_val.jsonl --seeds 1000000:1000128 --seed 1 --no-tool-list
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agentrl.sft import demos
from envs.search_qa.env import SearchQAEnv
from envs.search_qa.questions import ONE_HOP_KINDS


@dataclasses.dataclass(frozen=True)
class Demonstrator(demos.Demonstrator):
    direct_easy: float = 0.4
    direct_correct: float = 0.1
    easy: frozenset = frozenset(ONE_HOP_KINDS)


def guess(env: SearchQAEnv, rng: np.random.Generator) -> str:
    """The answer of another question of the same kind: a year, a town or a name that sounds right."""
    same_kind = [q.answer for q in env.questions if q.kind == env.question.kind and q.answer != env.question.answer]
    return same_kind[int(rng.integers(len(same_kind)))]


def demonstration(env: SearchQAEnv, seed: int, kind: str, rng: np.random.Generator, direct_correct: float = 0.1):
    """One transcript of `kind` ("tool" or "direct") for the env's task of `seed`, and its reward."""
    question, info = env.reset(seed=seed)

    def direct() -> str:
        return info["answer"] if rng.random() < direct_correct else guess(env, rng)

    calls = [("open", {"title": title}) for title in env.question.gold_titles]
    return demos.play(env, question, kind, calls, direct, answer=info["answer"])


def demonstrations(seeds, demonstrator: Demonstrator, env_kwargs: dict, seed: int = 0):
    """(transcript, kind, reward) for each env seed; the demonstrator's choices drawn from `seed`."""
    env = SearchQAEnv(**env_kwargs)
    rng = np.random.default_rng(seed)
    yield from demos.play_all(env, seeds, demonstrator, lambda info: info["kind"], demonstration, lambda _: rng)


def main() -> None:
    parser = demos.demonstration_parser(__doc__, "0:3000", Demonstrator())
    parser.add_argument("--split", default="seeds", help="the env's split; seeds: test questions from seed 1000000 on")
    args = parser.parse_args()
    demonstrator = demos.demonstrator_from(args, Demonstrator.easy)
    env_kwargs = demos.env_kwargs_from(args, split=args.split)
    rows = demonstrations(demos.seed_range(args), demonstrator, env_kwargs, args.seed)
    print(demos.write_demonstrations(args.out, rows))


if __name__ == "__main__":
    main()
