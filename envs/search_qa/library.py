"""The passages, their BM25 index and the questions for one corpus, built once per process and cached."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from envs.search_qa.bm25 import BM25Index
from envs.search_qa.corpus import Document, render_corpus
from envs.search_qa.questions import Question, make_questions
from envs.search_qa.world import make_world


@dataclass(frozen=True)
class Library:
    documents: list[Document]
    index: BM25Index
    questions: list[Question]
    titles: dict[str, int]  # lowercased title -> position in documents

    def search(self, query: str, k: int) -> list[tuple[Document, float]]:
        return [(self.documents[doc_id], score) for doc_id, score in self.index.search(query, k)]

    def find(self, title: str) -> Document | None:
        position = self.titles.get(" ".join(title.lower().split()))
        return None if position is None else self.documents[position]


@functools.lru_cache(maxsize=8)
def load_library(seed: int, num_documents: int, k1: float, b: float) -> Library:
    """The library for these parameters; every env in the process with the same ones shares it."""
    world = make_world(seed, num_documents)
    documents = render_corpus(world, seed)
    index = BM25Index([document.indexed_text() for document in documents], k1=k1, b=b)
    titles = {document.title.lower(): position for position, document in enumerate(documents)}
    return Library(documents, index, make_questions(world), titles)
