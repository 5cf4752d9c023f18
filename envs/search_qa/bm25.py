"""Okapi BM25 over a list of documents: a word tokenizer, an inverted index and top-k search."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

WORD = re.compile(r"[a-z0-9]+")
STOPWORD_TEXT = """
a an and are as at be by did does for from has have he her his how in is it its of on or she that the their
they this to was were what when where which who whom whose why with
"""
STOPWORDS = frozenset(STOPWORD_TEXT.split())


def tokenize(text: str) -> list[str]:
    """Lowercase alphanumeric runs of `text`, stopwords removed."""
    return [word for word in WORD.findall(text.lower()) if word not in STOPWORDS]


class BM25Index:
    """An inverted index scoring documents for a query with Okapi BM25.

    score(D, Q) = sum over distinct terms q of Q of
        idf(q) * tf(q, D) * (k1 + 1) / (tf(q, D) + k1 * (1 - b + b * |D| / avgdl))
    with idf(q) = ln(1 + (N - n(q) + 0.5) / (n(q) + 0.5)), which stays positive for common terms.
    """

    def __init__(self, documents: list[str], k1: float = 1.2, b: float = 0.75):
        if not documents:
            raise ValueError("BM25Index needs at least one document")
        if k1 < 0:
            raise ValueError(f"BM25 k1 must be >= 0, got {k1}")
        if not 0 <= b <= 1:
            raise ValueError(f"BM25 b must be in [0, 1], got {b}")
        self.k1, self.b = k1, b
        postings: dict[str, tuple[list[int], list[int]]] = {}
        lengths = []
        for doc_id, text in enumerate(documents):
            counts = Counter(tokenize(text))
            lengths.append(sum(counts.values()))
            for term, count in counts.items():
                ids, tfs = postings.setdefault(term, ([], []))
                ids.append(doc_id)
                tfs.append(count)
        self.num_documents = len(documents)
        self.lengths = np.array(lengths, dtype=np.float64)
        average = self.lengths.mean() or 1.0
        self._length_norm = k1 * (1 - b + b * self.lengths / average)
        self._postings = {
            term: (np.array(ids, dtype=np.int64), np.array(tfs, dtype=np.float64))
            for term, (ids, tfs) in postings.items()
        }

    def idf(self, term: str) -> float:
        found = len(self._postings[term][0]) if term in self._postings else 0
        return math.log(1 + (self.num_documents - found + 0.5) / (found + 0.5))

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every document for `query` (zeros where no query term occurs)."""
        scores = np.zeros(self.num_documents)
        for term in dict.fromkeys(tokenize(query)):
            if term not in self._postings:
                continue
            ids, tfs = self._postings[term]
            scores[ids] += self.idf(term) * tfs * (self.k1 + 1) / (tfs + self._length_norm[ids])
        return scores

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Up to `k` (doc_id, score) pairs, best first, ties by lower id; documents scoring 0 are left out."""
        scores = self.scores(query)
        order = np.argsort(-scores, kind="stable")[:k]
        return [(int(doc_id), float(scores[doc_id])) for doc_id in order if scores[doc_id] > 0]
