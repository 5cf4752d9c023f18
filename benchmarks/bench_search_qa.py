"""Print search_qa's retrieval numbers: build times, search latency and recall of the first gold passage.

python benchmarks/bench_search_qa.py [--num-documents 300] [--seed 0] [--queries 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from envs.search_qa.bm25 import BM25Index
from envs.search_qa.corpus import render_corpus
from envs.search_qa.library import load_library
from envs.search_qa.questions import make_questions
from envs.search_qa.world import make_world


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-documents", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--queries", type=int, default=1000)
    args = parser.parse_args()

    started = time.perf_counter()
    world = make_world(args.seed, args.num_documents)
    documents = render_corpus(world, args.seed)
    questions = make_questions(world)
    generated = time.perf_counter()
    BM25Index([document.indexed_text() for document in documents])
    indexed = time.perf_counter()
    print(f"{len(documents)} documents, {len(questions)} questions")
    print(f"generate world + passages + questions: {1000 * (generated - started):.1f} ms")
    print(f"build BM25 index: {1000 * (indexed - generated):.1f} ms")

    library = load_library(args.seed, args.num_documents, 1.2, 0.75)
    queries = [questions[i % len(questions)].text for i in range(args.queries)]
    latencies = []
    for query in queries:
        begin = time.perf_counter()
        library.search(query, 3)
        latencies.append(time.perf_counter() - begin)
    median_us = 1e6 * statistics.median(latencies)
    print(f"search latency (question text, k=3) over {len(queries)} queries: median {median_us:.0f} us")

    for hops in (1, 2):
        subset = [question for question in questions if question.hops == hops]
        for k in (1, 3, 5):
            hits = sum(
                question.gold_titles[0] in [document.title for document, _ in library.search(question.text, k)]
                for question in subset
            )
            print(f"{hops}-hop recall@{k} of the first gold passage (question text as query): {hits / len(subset):.3f}")
        if hops == 2:
            answer_passage = sum(
                question.gold_titles[-1] in [document.title for document, _ in library.search(question.text, 3)]
                for question in subset
            )
            print(f"2-hop: answer passage in the top 3 for the question text: {answer_passage / len(subset):.3f}")
            both = sum(
                set(question.gold_titles) <= {document.title for document, _ in library.search(question.text, 3)}
                for question in subset
            )
            print(f"2-hop: both gold passages in the top 3 for the question text: {both / len(subset):.3f}")


if __name__ == "__main__":
    main()
