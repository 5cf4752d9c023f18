"""Constrained decoding in the torch engines: a request's output grammar, matched token by token with llguidance.

A `Grammar` is plain text (a Lark grammar in llguidance's dialect, or a JSON schema), so a request carries it
anywhere, pickled to another rank included. The engine turns it into an llguidance matcher per row
(`GrammarVocab.matcher`); at each step `allowed_logprobs` leaves a constrained row only the tokens its grammar
accepts next, and `advance` feeds the matcher the token drawn. Where the grammar may end, the row may draw its
stop ids (and only them once the grammar is complete), so a finished grammar ends the row as any reply ends.

llguidance is an optional dependency (`pip install 'agentrl[grammar]'`); it is imported only for a constrained
request, and a batch with no constrained row takes none of these steps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

INSTALL_HINT = "pip install 'agentrl[grammar]'"


@dataclass(frozen=True)
class Grammar:
    """What a request's output must match: a Lark grammar (llguidance's dialect, JSON schemas inline as
    `%json {...}`), or, where the output is one JSON value, its JSON schema (as JSON text)."""

    lark: str | None = None
    json_schema: str | None = None

    def __post_init__(self):
        if (self.lark is None) == (self.json_schema is None):
            raise ValueError("a Grammar takes a lark grammar or a json_schema, exactly one")

    def llguidance_text(self) -> str:
        """The grammar as llguidance's matchers take it."""
        llguidance = import_llguidance("constrained decoding")
        if self.lark is not None:
            return llguidance.LLMatcher.grammar_from_lark(self.lark)
        return llguidance.LLMatcher.grammar_from_json_schema(self.json_schema)

    def sglang_fields(self) -> dict:
        """SGLang's sampling_params for this grammar: `json_schema`, or the Lark text as `ebnf` (which SGLang's
        llguidance grammar backend reads: `--grammar-backend llguidance`)."""
        return {"json_schema": self.json_schema} if self.json_schema is not None else {"ebnf": self.lark}


class GrammarUnavailable(ImportError):
    """llguidance is not installed."""


def import_llguidance(what: str):
    """The llguidance module, or GrammarUnavailable naming `what` needs it and how to install it."""
    try:
        import llguidance
    except ImportError:
        raise GrammarUnavailable(f"{what} needs llguidance, which is not installed; {INSTALL_HINT}") from None
    return llguidance


def check_grammar(grammar: Grammar) -> str:
    """Why llguidance refuses `grammar` (a bad schema, a bad Lark rule), or "" where it takes it."""
    llguidance = import_llguidance("constrained decoding")
    return llguidance.LLMatcher.validate_grammar(grammar.llguidance_text())


class GrammarVocab:
    """llguidance's view of one tokenizer (its token bytes and eos), built on first use; the matchers made with
    it, and the masks they give. `vocab_size` is the model's: masks cover it (a model may have more rows than
    the tokenizer has tokens). Matchers may be made on any thread; masks are computed on the engine's worker."""

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.words = (max(self.vocab_size, len(tokenizer)) + 31) // 32  # int32 words of one row's bitmask
        self._llg_tokenizer = None
        self._lock = threading.Lock()
        self._bitmask = torch.zeros((0, self.words), dtype=torch.int32)
        self._shifts: dict[torch.device, torch.Tensor] = {}

    def _tokenizer(self):
        with self._lock:
            if self._llg_tokenizer is None:
                if len(self.tokenizer) > self.vocab_size:
                    raise ValueError(
                        f"the tokenizer has {len(self.tokenizer)} tokens, more than the model's {self.vocab_size} "
                        "output rows: a grammar could ask for a token the model cannot write; serve a matching pair"
                    )
                llguidance = import_llguidance("constrained decoding")
                from llguidance.hf import from_tokenizer

                self.executor = llguidance.LLExecutor()
                self._llg_tokenizer = from_tokenizer(self.tokenizer, n_vocab=self.words * 32)
            return self._llg_tokenizer

    def matcher(self, grammar: Grammar):
        """A fresh matcher at the start of `grammar`; ValueError with llguidance's reason where it is invalid."""
        llguidance = import_llguidance("constrained decoding")
        matcher = llguidance.LLMatcher(self._tokenizer(), grammar.llguidance_text(), log_level=0)
        if matcher.is_error():
            raise ValueError(f"the output grammar is invalid: {matcher.get_error()}")
        return matcher

    def allowed(self, matchers: list, stop_ids: list[tuple[int, ...]], vocab: int, device) -> torch.Tensor:
        """(rows, vocab) bool: the tokens each matcher accepts next. llguidance's eos bit, set where the grammar
        may end, becomes the row's own stop ids (each row has at least one); a matcher in error leaves only
        those, so its row ends (`grammar_error` says why)."""
        rows = len(matchers)
        if self._bitmask.shape[0] < rows:
            self._bitmask = torch.zeros((rows, self.words), dtype=torch.int32)
        bitmask = self._bitmask[:rows]
        eos = self._tokenizer().eos_token
        pairs = [(matcher, row) for row, matcher in enumerate(matchers)]
        self.executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), self.words * 4, rows)
        allowed = self._unpack(bitmask, torch.device(device))[:, :vocab]
        may_end = allowed[:, eos].clone()
        allowed[:, eos] = False
        failed = [row for row, matcher in enumerate(matchers) if matcher.is_error()]
        if failed:
            allowed[failed] = False
            may_end[failed] = True
        at_row, token = torch.tensor([(row, token) for row, ids in enumerate(stop_ids) for token in ids]).unbind(1)
        allowed[at_row, token] = may_end[at_row.to(device)]
        return allowed

    def _unpack(self, bitmask: torch.Tensor, device: torch.device) -> torch.Tensor:
        """One bool per token from the bitmask (bit i of word w: token 32w + i), on `device`. On a GPU the words
        go over and are unpacked there; on the host numpy unpacks them (torch's shifts take 30 times longer)."""
        if device.type == "cpu":
            bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
            return torch.from_numpy(bits).view(torch.bool)
        shifts = self._shifts.get(device)
        if shifts is None:
            shifts = self._shifts[device] = torch.arange(32, dtype=torch.int32, device=device)
        words = bitmask.to(device)
        return ((words[:, :, None] >> shifts) & 1).bool().reshape(bitmask.shape[0], -1)


def allowed_logprobs(logprobs: torch.Tensor, rows) -> torch.Tensor:
    """`logprobs` (rows, vocab) with each constrained row renormalised over the tokens its grammar allows:
    what such a row draws from (its top-p and top-k apply to this distribution)."""
    index = rows.constrained
    matchers = [rows.matchers[row] for row in index]
    stops = [rows.params[row].stop_token_ids for row in index]
    allowed = rows.grammars.allowed(matchers, stops, logprobs.shape[1], logprobs.device)
    if len(index) == logprobs.shape[0]:  # every row constrained: no copy of the unconstrained rows to keep
        return torch.log_softmax(logprobs.masked_fill(~allowed, float("-inf")), dim=-1)
    drawn = logprobs.clone()
    drawn[index] = torch.log_softmax(logprobs[index].masked_fill(~allowed, float("-inf")), dim=-1)
    return drawn


def advance(tokens: torch.Tensor, rows) -> None:
    """Feed each constrained row's matcher the token it drew (a stop id ends the row and is not fed)."""
    index = rows.constrained
    drawn = tokens[index].tolist()
    for row, token in zip(index, drawn, strict=True):
        if token not in rows.params[row].stop_token_ids:
            rows.matchers[row].consume_token(token)


def grammar_error(matcher) -> str | None:
    """Why `matcher` stopped following its grammar (it left the row only its stop ids), or None."""
    if matcher is None or not matcher.is_error():
        return None
    return matcher.get_error()
