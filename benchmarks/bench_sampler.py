"""What one sampling step of the torch engines costs, by vocabulary size: the draw over the whole
filtered vocabulary, the engines' `sample_tokens` (which draws among each row's top-k candidates
when every row has a top-k, none a top-p, and the vocabulary is large), and `model.generate`'s
sampling, side by side.

    python benchmarks/bench_sampler.py --vocabs 160,4000,32000,151936 --top-ks 50,-1 --rows 32 --threads 1

Each column times one step for `--rows` rows of random logits, median of the repeats, interleaved;
top-k -1 is no top-k (the rollout default: RL samples from the whole distribution):

- `whole vocabulary`: log-softmax, the top-k filter over the vocabulary, the inverse-CDF draw
  summing the whole filtered vocabulary in float64, all into new tensors (the engines' draw
  before `sample_tokens` learnt the two shortcuts below);
- `sample_tokens`: what the engines run, the same tokens from the same seed. From
  `LARGE_VOCAB` (2048) tokens on, rows that all have a top-k draw among their top-k
  candidates, and the probabilities and running sums go into buffers kept between steps
  (`RowSampling.scratch`); no division where the temperature is 1;
- `generate`: transformers' temperature and top-k warpers, softmax and `torch.multinomial`
  (no logprobs, which generate does not return by default).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

from agentrl.engine.base import SamplingParams
from agentrl.engine.sampling import RowSampling, draw_from_unnormalised, filter_top_k_top_p, sample_tokens


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocabs", default="160,32000,151936")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--top-ks", default="50,-1", help="top-k settings; -1: none")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    return parser.parse_args()


def whole_vocabulary(logits: torch.Tensor, rows: RowSampling, generator: torch.Generator):
    logprobs = torch.log_softmax(logits.float() / rows.temperature, dim=-1)
    probs = logprobs.exp()
    if rows.largest_top_k is not None:
        probs = filter_top_k_top_p(probs, rows)
    tokens = draw_from_unnormalised(probs, rows, generator)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def generate_sampling(args, top_k: int):
    warpers = [TemperatureLogitsWarper(args.temperature)] + ([TopKLogitsWarper(top_k)] if top_k > 0 else [])

    def run(logits: torch.Tensor, rows, generator: torch.Generator) -> torch.Tensor:
        scores = logits
        for warper in warpers:
            scores = warper(None, scores)
        return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator).squeeze(1)

    return run


def timed(step, logits, rows, calls: int) -> float:
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(calls):
        step(logits, rows, generator)
    return (time.perf_counter() - start) / calls


def bench_vocab(vocab: int, top_k: int, args) -> None:
    logits = torch.randn(args.rows, vocab) * 3
    params = [SamplingParams(1, temperature=args.temperature, top_k=top_k)] * args.rows
    rows = RowSampling(params, vocab, torch.device("cpu"))
    same = [step(logits, rows, torch.Generator().manual_seed(1))[0] for step in (whole_vocabulary, sample_tokens)]
    assert torch.equal(*same), "the two draws must give the same tokens"
    steps = {"whole": whole_vocabulary, "sample_tokens": sample_tokens, "generate": generate_sampling(args, top_k)}
    calls = max(3, int(2e6 / vocab))
    times = {name: [] for name in steps}
    with torch.inference_mode():
        for step in steps.values():
            timed(step, logits, rows, 2)
        for _ in range(args.repeats):
            for name, step in steps.items():
                times[name].append(timed(step, logits, rows, calls))
    ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    print(
        f"| {vocab} | {top_k} | {ms['whole']:.3f} | {ms['sample_tokens']:.3f} | {ms['generate']:.3f} "
        f"| {ms['whole'] / ms['sample_tokens']:.2f} | {ms['generate'] / ms['sample_tokens']:.2f} |"
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"one sampling step, ms: {args.rows} rows, temperature={args.temperature}, "
        f"threads={torch.get_num_threads()}, median of {args.repeats} repeats"
    )
    print(
        "| vocab | top-k | whole vocabulary | sample_tokens | generate | whole/sample_tokens | generate/sample_tokens |"
    )
    print("|---|---|---|---|---|---|---|")
    for top_k in args.top_ks.split(","):
        for vocab in args.vocabs.split(","):
            bench_vocab(int(vocab), int(top_k), args)


if __name__ == "__main__":
    main()
