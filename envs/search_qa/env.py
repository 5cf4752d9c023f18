"""Question answering over a generated encyclopedia, with a BM25 `search` tool and an `open` tool.

The world (people, towns, rivers, companies, inventions) is invented from `corpus_seed`, so the
answers are unknowable without searching. `reset(seed=...)` picks a question of the chosen split;
a turn without a tool call is the final answer, graded by normalised exact match (reward 1), or
with `partial_credit=True` by token F1 when not exact.
"""

from __future__ import annotations

from typing import Literal

from agentrl.env.heldout import DEFAULT_SEEDS, HeldoutSplit
from agentrl.env.tools import ToolEnv, tool
from agentrl.rewards import exact_match_score as exact_match
from agentrl.rewards import token_f1_score as token_f1
from envs.search_qa.library import Library, load_library
from envs.search_qa.questions import Question, expand_kinds

SPLITS = ("train", "test", "all", "seeds")
TEST_EVERY = 10  # every 10th question of the fixed order is held out as the test split
MAX_K = 10


class SearchQAEnv(ToolEnv):
    """Answer questions about a generated world with `search` and `open` tools.

    Args:
        corpus_seed: seed of the world, its passages and questions (shared by every env built with it)
        num_documents: passages in the corpus (one per entity), at least 20
        question_types: "one_hop", "two_hop" and/or single kinds such as "birth_year" (see questions.py)
        split: "train" (9 in 10 questions), "test" (every 10th), "all", or "seeds": test questions for the seeds in
            `heldout_seeds` (eval.seeds' default range), train questions for every other seed
        heldout_seeds: [first seed, count] of the seeds that draw test questions with split "seeds"
        k: passages `search` returns when the call gives no k
        snippet_chars: search results are cut to this many characters; `open` shows the whole passage
        max_steps: turns before the episode is truncated
        partial_credit: reward a wrong answer with its token F1 against the gold answer
        k1: BM25 term-frequency saturation
        b: BM25 length normalisation
        list_tools: describe the tools in the prompt; false leaves them out (the tools still run), for a model that
            learnt the calls from demonstrations (envs/search_qa/demos.py)
    """

    def __init__(
        self,
        corpus_seed: int = 0,
        num_documents: int = 300,
        question_types: list[str] | tuple[str, ...] = ("one_hop", "two_hop"),
        split: Literal["train", "test", "all", "seeds"] = "train",
        k: int = 3,
        snippet_chars: int = 200,
        max_steps: int = 6,
        partial_credit: bool = False,
        k1: float = 1.2,
        b: float = 0.75,
        list_tools: bool = True,
        heldout_seeds: tuple[int, int] | list[int] = DEFAULT_SEEDS,
    ):
        super().__init__(max_steps=max_steps)
        self.heldout: HeldoutSplit | None = None  # split "seeds": which seeds draw from test_questions
        self.test_questions: list[Question] = []
        if split not in SPLITS:
            raise ValueError(f"search_qa split must be one of {SPLITS}, got {split!r}")
        if not 1 <= k <= MAX_K:
            raise ValueError(f"search_qa needs 1 <= k <= {MAX_K}, got k={k}")
        if snippet_chars < 20:
            raise ValueError(f"search_qa snippet_chars must be >= 20 to show useful text, got {snippet_chars}")
        self.library: Library = load_library(corpus_seed, num_documents, float(k1), float(b))
        kinds = expand_kinds(question_types)
        questions = [(i, q) for i, q in enumerate(self.library.questions) if q.kind in kinds]
        if split == "seeds":
            self.heldout = HeldoutSplit(seeds=heldout_seeds)
            self.test_questions = [q for i, q in questions if in_split(i, "test")]
            split = "train"
        self.questions = [q for i, q in questions if in_split(i, split)]
        if not self.questions or (self.heldout is not None and not self.test_questions):
            raise ValueError(
                f"search_qa has no {split} questions of types {sorted(kinds)}; add types or use split='all'"
            )
        self.k, self.snippet_chars = k, snippet_chars
        self.partial_credit = partial_credit
        self.question: Question | None = None
        if not list_tools:
            self.tools = []

    @tool
    def search(self, query: str, k: int | None = None) -> str:
        """Search the encyclopedia and return the best-matching passages, each with its title.

        Args:
            query: keywords to look for, for example a name from the question
            k: how many passages to return, from 1 to 10 (default: the environment's setting, usually 3)
        """
        k = self.k if k is None else k
        if not 1 <= k <= MAX_K:
            raise ValueError(f"k must be between 1 and {MAX_K}, got {k}")
        hits = self.library.search(query, k)
        if not hits:
            return f"no passage matches {query!r}; search for names or other words from the question"
        return "\n".join(
            f"[{rank}] {doc.title}\n{_truncate(doc.text, self.snippet_chars)}" for rank, (doc, _) in enumerate(hits, 1)
        )

    @tool
    def open(self, title: str) -> str:
        """Read the whole passage with the given title.

        Args:
            title: a title exactly as a search result shows it, for example "Tesk River"
        """
        document = self.library.find(title)
        if document is None:
            nearest = ", ".join(repr(doc.title) for doc, _ in self.library.search(title, 3)) or "none"
            raise ValueError(f"no passage is titled {title!r}; use a title from a search result (nearest: {nearest})")
        return f"{document.title}\n{document.text}"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        pool = self.questions
        if self.heldout is not None and self.heldout.is_heldout_seed(seed):
            pool = self.test_questions
        self.question = pool[int(self.np_random.integers(len(pool)))]
        return self.question.text, {"answer": self.question.answer, "kind": self.question.kind}

    def answer(self, text):
        accepted = self.question.accepted()
        success = exact_match(text, accepted)
        reward = 1.0 if success else (token_f1(text, accepted) if self.partial_credit else 0.0)
        return ("correct" if success else "wrong"), reward, True, False, {"success": success}


def in_split(position: int, split: str) -> bool:
    """Whether the question at `position` of the library's fixed order belongs to `split`."""
    return split == "all" or (position % TEST_EVERY == 0) == (split == "test")


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
