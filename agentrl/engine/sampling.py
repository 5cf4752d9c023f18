"""Per-row token sampling for the torch engines: temperature, top-k, top-p, greedy rows and seeded rows in one batch.

Logprobs follow SGLang: log_softmax(logits / temperature) of the chosen token, not
renormalised after top-k/top-p filtering. Draws are inverse-CDF over the vocabulary in
token order, with one uniform number per row (from the row's own generator if seeded).
Rows with an output grammar draw only what it allows (agentrl/engine/grammar.py); their logprobs stay those of
the unconstrained distribution, the one the trainer recomputes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from agentrl.engine import grammar
from agentrl.engine.base import SamplingParams

# From this vocabulary size on, rows that all have a top-k draw among their candidates, and
# the probabilities and running sums go into buffers kept between steps: the whole-vocabulary
# work grows with the vocabulary, the extra ops do not. In the continuous engine at a
# vocabulary of 160 the whole-vocabulary draw was the faster (7% on the multi-turn
# benchmark); from 4000 on the candidates are faster, 4x at 32000 and more
# (benchmarks/bench_sampler.py).
LARGE_VOCAB = 2048
NON_FINITE = (
    "the model's next-token probabilities are not finite (NaN or inf), so no token can be drawn: its weights hold "
    "NaN or inf (or its logits overflow), e.g. after a training update with a learning rate far too high"
)


class NonFiniteLogits(ValueError):
    """The model's next-token distribution holds NaN or inf: its weights (or its input) are broken."""


class RowSampling:
    """Per-row sampling settings of the running batch, as tensors aligned with its rows."""

    TENSORS = ("greedy", "temperature", "top_k", "top_p", "max_new_tokens", "unfiltered")

    def __init__(
        self,
        params: Sequence[SamplingParams],
        vocab_size: int,
        device: torch.device,
        generators=None,
        matchers=None,
        grammars: grammar.GrammarVocab | None = None,
    ):
        """`matchers`: each row's grammar matcher, or None for a row drawing freely (`grammars` made them)."""
        self.params = list(params)
        self.vocab_size = vocab_size
        if self.params and all(p is self.params[0] for p in self.params):  # one settings object (a training step)
            self._fill_alike(self.params[0], len(self.params), device)
        else:
            greedy = [p.temperature <= 0 for p in params]
            top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
            self.greedy = torch.tensor(greedy, device=device)
            self.temperature = torch.tensor(
                [[1.0 if g else float(p.temperature)] for g, p in zip(greedy, params, strict=True)], device=device
            )
            self.top_k = torch.tensor(top_k, device=device)
            self.top_p = torch.tensor([p.top_p if p.top_p < 1.0 else float("inf") for p in params], device=device)
            self.max_new_tokens = torch.tensor([p.max_new_tokens for p in params], device=device)
            widest = max(len(p.stop_token_ids) for p in params)
            stop_ids = [list(p.stop_token_ids) + [-1] * (widest - len(p.stop_token_ids)) for p in params]
            self.stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=device) if widest else None
        self.unfiltered = (self.top_k >= self.vocab_size) & ~torch.isfinite(self.top_p)
        if generators is None:
            generators = [seeded_generator(p.seed, device) if p.seed is not None else None for p in params]
        self.generators = list(generators)
        self.matchers = list(matchers) if matchers is not None else [None] * len(self.params)
        if grammars is None and any(matcher is not None for matcher in self.matchers):
            raise ValueError("rows with grammar matchers need the GrammarVocab that made them")
        self.grammars = grammars
        self._scratch: dict[torch.dtype, torch.Tensor] = {}
        self._summarise()

    def _fill_alike(self, params: SamplingParams, rows: int, device: torch.device) -> None:
        """The tensors for `rows` rows that all sample as `params`, the same as built row by row."""
        greedy = params.temperature <= 0
        top_k = params.top_k if 0 < params.top_k < self.vocab_size else self.vocab_size
        self.greedy = torch.full((rows,), greedy, dtype=torch.bool, device=device)
        self.temperature = torch.full((rows, 1), 1.0 if greedy else float(params.temperature), device=device)
        self.top_k = torch.full((rows,), top_k, dtype=torch.long, device=device)
        self.top_p = torch.full((rows,), params.top_p if params.top_p < 1.0 else float("inf"), device=device)
        self.max_new_tokens = torch.full((rows,), params.max_new_tokens, dtype=torch.long, device=device)
        stop_ids = list(params.stop_token_ids)
        self.stop_ids = (
            torch.tensor([stop_ids], dtype=torch.long, device=device).expand(rows, -1).clone() if stop_ids else None
        )

    def _summarise(self) -> None:
        """Batch-wide facts that let a step skip work no row needs."""
        params = self.params
        self.all_greedy = all(p.temperature <= 0 for p in params)
        self.any_greedy = any(p.temperature <= 0 for p in params)
        self.unit_temperature = all(p.temperature <= 0 or p.temperature == 1.0 for p in params)
        self.any_top_p = any(p.top_p < 1.0 for p in params)
        self.largest_top_k = max((p.top_k for p in params if 0 < p.top_k < self.vocab_size), default=None)
        self.every_row_top_k = not self.any_top_p and all(0 < p.top_k < self.vocab_size for p in params)
        self.seeded_rows = [(row, gen) for row, gen in enumerate(self.generators) if gen is not None]
        self.constrained = [row for row, matcher in enumerate(self.matchers) if matcher is not None]

    def select(self, keep: torch.Tensor, order: list[int] | None = None) -> None:
        """Keep only the rows at positions `keep` (`order`: the same as a list, where the caller has it)."""
        for name in self.TENSORS:
            setattr(self, name, getattr(self, name)[keep])
        if self.stop_ids is not None:
            self.stop_ids = self.stop_ids[keep]
        order = keep.tolist() if order is None else order
        self.params = [self.params[row] for row in order]
        self.generators = [self.generators[row] for row in order]
        self.matchers = [self.matchers[row] for row in order]
        self._summarise()

    def extend(self, more: RowSampling) -> None:
        """Append the rows of `more` after these."""
        for name in self.TENSORS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(more, name)]))
        if self.stop_ids is not None or more.stop_ids is not None:
            parts = [self.stop_ids, more.stop_ids]
            counts = [len(self.params), len(more.params)]
            widest = max(part.shape[1] for part in parts if part is not None)
            device = self.greedy.device
            self.stop_ids = torch.cat(
                [
                    F.pad(part, (0, widest - part.shape[1]), value=-1)
                    if part is not None
                    else torch.full((count, widest), -1, dtype=torch.long, device=device)
                    for part, count in zip(parts, counts, strict=True)
                ]
            )
        self.params += more.params
        self.generators += more.generators
        self.matchers += more.matchers
        self.grammars = self.grammars or more.grammars
        self._summarise()

    def scratch(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A buffer of `shape` (rows, vocabulary) and `dtype`, kept between steps, for the probabilities
        (float32) or the draw's running sums (float64).

        At a real vocabulary fresh memory costs more than the work itself: 32 rows of 151,936
        tokens take 55 ms to convert and sum into new tensors, 8 ms into a kept buffer (the
        pages of new tensors are faulted in at every step).
        """
        rows, columns = shape
        kept = self._scratch.get(dtype)
        if kept is None or kept.shape[0] < rows or kept.shape[1] != columns:
            kept = self._scratch[dtype] = torch.empty((rows, columns), dtype=dtype, device=self.greedy.device)
        return kept[:rows]

    def stopped(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """Which rows just generated one of their stop ids (None when no row has any)."""
        if self.stop_ids is None:
            return None
        return (tokens[:, None] == self.stop_ids).any(dim=1)


def seeded_generator(seed: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def filter_top_k_top_p(probs: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """Zero the probabilities outside each row's top-k and top-p sets (not renormalised), in place.

    Each row keeps the tokens at least as probable as its last kept token in sorted
    order, so a tie at the boundary keeps every tied token.
    """
    if rows.any_top_p:
        sorted_probs = probs.sort(dim=-1, descending=True).values
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        kept = torch.minimum((mass_before <= rows.top_p[:, None]).sum(dim=-1), rows.top_k).clamp_min_(1)
    else:
        sorted_probs = probs.topk(rows.largest_top_k, dim=-1).values
        kept = rows.top_k.clamp_max(rows.largest_top_k)
    threshold = sorted_probs.gather(1, (kept - 1)[:, None])
    threshold.masked_fill_(rows.unfiltered[:, None], 0.0)
    return probs.masked_fill_(probs < threshold, 0.0)


def sample_tokens(
    logits: torch.Tensor, rows: RowSampling, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return the tokens and their logprobs under softmax(logits / T).

    A constrained row draws from that distribution renormalised over the tokens its grammar allows, and its
    matcher takes the token drawn; the logprob returned is still the unconstrained one."""
    scaled = logits.float() if rows.unit_temperature else logits.float() / rows.temperature
    logprobs = torch.log_softmax(scaled, dim=-1)
    drawn = grammar.allowed_logprobs(logprobs, rows) if rows.constrained else logprobs
    if rows.all_greedy:
        tokens = drawn.argmax(dim=-1)
    else:
        large = rows.vocab_size >= LARGE_VOCAB
        probs = torch.exp(drawn, out=rows.scratch(drawn.shape, drawn.dtype)) if large else drawn.exp()
        # On CPU drawing among the top-k candidates is faster; on a GPU the whole-vocabulary draw is cheap and needs
        # no host sync (the candidates' tie check reads a flag back), so a step never waits for the device there.
        candidates = (
            top_k_candidates(probs, rows) if large and rows.every_row_top_k and probs.device.type == "cpu" else None
        )
        if candidates is not None:
            kept_probs, kept_tokens = candidates
            tokens = kept_tokens.gather(1, draw_from_unnormalised(kept_probs, rows, generator)[:, None]).squeeze(1)
        else:
            if rows.any_top_p or rows.largest_top_k is not None:
                probs = filter_top_k_top_p(probs, rows)
            cdf = rows.scratch(probs.shape, torch.float64) if large else None
            tokens = draw_from_unnormalised(probs, rows, generator, cdf)
        if rows.any_greedy:
            tokens = torch.where(rows.greedy, drawn.argmax(dim=-1), tokens)
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
    if chosen.device.type == "cpu" and not bool(torch.isfinite(chosen).all()):  # on a GPU the check would sync
        raise NonFiniteLogits(NON_FINITE)
    if rows.constrained:
        grammar.advance(tokens, rows)
    return tokens, chosen


def top_k_candidates(probs: torch.Tensor, rows: RowSampling) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The tokens each row may draw under its top-k (rows, largest k), in token order, and their probabilities,
    zero past the row's own k; None where a row has more tokens tied at its k-th probability than fit.

    Drawing among these gives the token a draw over the whole filtered vocabulary gives with
    the same uniform number: the tokens left out have zero probability, and adding zeros to a
    running sum changes it by nothing. It only saves the whole-vocabulary filter and sum.
    """
    largest = rows.largest_top_k
    kept_probs, kept_tokens = probs.topk(largest + 1, dim=-1)  # one past the largest k: is it tied?
    threshold = kept_probs.gather(1, (rows.top_k - 1)[:, None])
    if bool((kept_probs[:, largest:] >= threshold).any()):
        return None
    kept_tokens, order = kept_tokens[:, :largest].sort(dim=-1)
    kept_probs = kept_probs.gather(1, order)
    return kept_probs.masked_fill_(kept_probs < threshold, 0.0), kept_tokens  # kept_probs is gather's own copy


def draw_from_unnormalised(
    probs: torch.Tensor, rows: RowSampling, generator: torch.Generator, cdf: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse-CDF sampling: one uniform number per row, from the row's own generator if seeded.

    `cdf`, if given, is a float64 buffer of `probs`' shape to sum into (`RowSampling.scratch`).
    """
    uniform = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device)
    for row, row_generator in rows.seeded_rows:
        uniform[row] = torch.rand(1, generator=row_generator, device=probs.device)
    # float64 keeps the draw strictly below the total mass, so zero-probability tokens never win.
    cdf = probs.double() if cdf is None else cdf.copy_(probs)
    cdf.cumsum_(dim=-1)
    if cdf.device.type == "cpu" and not bool(torch.isfinite(cdf[:, -1]).all()):  # else the draw falls off the end
        raise NonFiniteLogits(NON_FINITE)
    return torch.searchsorted(cdf, uniform.double() * cdf[:, -1:], right=True).squeeze(1)
