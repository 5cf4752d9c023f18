from envs.search_qa.bm25 import BM25Index, tokenize
from envs.search_qa.env import SearchQAEnv
from envs.search_qa.library import load_library

__all__ = ["BM25Index", "SearchQAEnv", "load_library", "tokenize"]
