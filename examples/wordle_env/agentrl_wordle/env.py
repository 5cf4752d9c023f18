"""Tiny Wordle as an agentrl tool environment.

Each turn is either a guess (a turn without a tool call, graded by `answer`) or a call
to the `words_matching` tool, which searches the word list and costs no guess. After a
guess the model reads one mark per letter: G (right place), Y (elsewhere in the word),
. (not in the word).
"""

from __future__ import annotations

import re

from agentrl.env.tools import ToolEnv, tool

from agentrl_wordle.game import GREEN, check_word_list, matches, score, shipped_words

WORD = re.compile(r"[A-Za-z]+")


def find_guess(text: str, words: set[str]) -> str | None:
    """The first word in `text` (any case) that is in `words`, lower-cased; None when there is none."""
    for candidate in WORD.findall(text):
        if candidate.lower() in words:
            return candidate.lower()
    return None


class WordleEnv(ToolEnv):
    """Guess a secret word drawn from a word list, reading per-letter marks after each guess.

    Args:
        words: the word list (one length, letters only); None uses the list shipped in the package.
        max_guesses: guesses before the episode terminates unsolved.
        max_turns: turns of any kind (guesses and tool calls) before the episode is truncated;
            None allows two per guess.
        show_words: list the words in the first observation.
        valid_reward: reward for each unsolved guess that is a word from the list (shaping).
    """

    def __init__(
        self,
        words: list[str] | None = None,
        max_guesses: int = 6,
        max_turns: int | None = None,
        show_words: bool = True,
        valid_reward: float = 0.0,
    ):
        if max_guesses < 1:
            raise ValueError(f"wordle needs max_guesses >= 1, got {max_guesses}")
        max_turns = 2 * max_guesses if max_turns is None else max_turns
        if max_turns < max_guesses:
            raise ValueError(f"wordle needs max_turns >= max_guesses ({max_guesses}), got {max_turns}")
        super().__init__(max_steps=max_turns)  # ToolEnv truncates after max_turns turns of any kind
        self.words = check_word_list(shipped_words() if words is None else words)
        self.max_guesses = max_guesses
        self.show_words, self.valid_reward = show_words, valid_reward
        self.secret: str | None = None
        self.guesses = 0
        self.solved = False

    @tool
    def words_matching(self, pattern: str, exclude: str = "") -> str:
        """List the words of this game that fit a pattern; searching does not use up a guess.

        Args:
            pattern: one character per letter, "?" for any letter, for example "c?t"
            exclude: letters the word must not contain, for example "ao"
        """
        length = len(self.words[0])
        if len(pattern) != length:
            raise ValueError(f"pattern {pattern!r} must have {length} characters, one per letter, '?' for any")
        found = [word for word in self.words if matches(word, pattern, exclude)]
        return ", ".join(found) if found else "no word fits"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = self.words[int(self.np_random.integers(len(self.words)))]
        self.guesses = 0
        self.solved = False
        prompt = f"Guess the secret {len(self.secret)}-letter word in {self.max_guesses} guesses."
        if self.show_words:
            prompt += f" It is one of: {', '.join(self.words)}."
        prompt += " After each guess: G = right place, Y = elsewhere in the word, . = not in the word."
        return prompt, {"answer": self.secret}

    def answer(self, text: str):
        self.guesses += 1
        left = self.max_guesses - self.guesses
        guess = find_guess(text, set(self.words))
        if guess is None:
            observation, reward = "invalid guess: answer with one word from the list", 0.0
        else:
            marks = score(guess, self.secret)
            self.solved = marks == GREEN * len(self.secret)
            observation = f"{guess} {marks}"
            reward = 1.0 if self.solved else self.valid_reward
        terminated = self.solved or left == 0
        if self.solved:
            observation += ", solved"
        elif left == 0:
            observation += f"; out of guesses, the word was {self.secret}"
        else:
            observation += f"; {left} guess{'es' if left > 1 else ''} left"
        return observation, reward, terminated, False, {"guesses": self.guesses, "success": self.solved}
