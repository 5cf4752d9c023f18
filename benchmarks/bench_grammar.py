"""What an output grammar costs a sampling step of the torch engines: llguidance's masks, the renormalised draw
and the matchers' advance, against the same rows drawing freely.

    python benchmarks/bench_grammar.py --vocabs 160,151936 --rows 1,8,32 --device cpu

Each row follows a JSON schema (an enum, a free string, an integer), the way agentrl serve writes JSON; each step
draws from random logits, so the rows wander through the schema's states as a weak model would. The vocabulary is
synthetic (random letter strings, byte-level, no merges): what llguidance's masks cost depends on the token trie,
which this gives at a real size without a download; it does not tokenize text. Columns: ms per step, median over
the steps of one JSON value (or --steps), and what making one matcher costs (the first one also builds
llguidance's view of the tokenizer, once per engine).
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time

import torch

from agentrl.engine.base import SamplingParams
from agentrl.engine.grammar import Grammar, GrammarVocab
from agentrl.engine.sampling import RowSampling, sample_tokens
from agentrl.serve.constraints import json_styled

SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["higher", "lower", "correct"]},
        "why": {"type": "string"},
        "guess": {"type": "integer"},
    },
    "required": ["verdict", "why", "guess"],
    "additionalProperties": False,
}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocabs", default="160,151936")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    return parser.parse_args()


def synthetic_tokenizer(size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    rng = random.Random(0)
    letters = string.ascii_letters + string.digits + '{}":,[] '
    while len(vocab) < size - len(SPECIAL):
        vocab.setdefault("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))).replace(" ", "Ġ"), len(vocab))
    for token in SPECIAL:
        vocab[token] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def one_case(vocab: GrammarVocab, grammar: Grammar, rows: int, args) -> tuple[float, float, float]:
    device = torch.device(args.device)
    eos = vocab.tokenizer.eos_token_id
    started = time.perf_counter()
    matchers = [vocab.matcher(grammar) for _ in range(rows)]
    made_ms = (time.perf_counter() - started) / rows * 1e3
    params = [SamplingParams(args.steps, stop_token_ids=(eos,), seed=row, grammar=grammar) for row in range(rows)]
    constrained = RowSampling(params, vocab.vocab_size, device, matchers=matchers, grammars=vocab)
    free = RowSampling([SamplingParams(args.steps, seed=row) for row in range(rows)], vocab.vocab_size, device)
    generator = torch.Generator(device=device).manual_seed(0)
    times: dict[str, list[float]] = {"free": [], "constrained": []}
    for _ in range(args.steps):
        logits = torch.randn(rows, vocab.vocab_size, device=device)
        for name, sampling in (("free", free), ("constrained", constrained)):
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            sample_tokens(logits, sampling, generator)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - started) * 1e3)
        if any(matcher.is_stopped() for matcher in matchers):  # a value ended: later steps would only be eos
            break
    median = {name: sorted(values)[len(values) // 2] for name, values in times.items()}
    return made_ms, median["free"], median["constrained"]


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    grammar = Grammar(json_schema=json.dumps(json_styled(SCHEMA)))
    print(f"one sampling step, ms, device={args.device}, threads={args.threads}, median over up to {args.steps} steps")
    print("| vocab | rows | matcher, ms | free, ms | constrained, ms | constrained/free |")
    print("|---|---|---|---|---|---|")
    for size in map(int, args.vocabs.split(",")):
        tokenizer = synthetic_tokenizer(size)
        vocab = GrammarVocab(tokenizer, max(size, len(tokenizer)))  # its 256 bytes and 3 specials at least
        started = time.perf_counter()
        vocab.matcher(grammar)
        first_ms = (time.perf_counter() - started) * 1e3
        size = vocab.vocab_size
        print(f"| {size} | first matcher (llguidance's tokenizer) | {first_ms:.0f} | | | |")
        for rows in map(int, args.rows.split(",")):
            made, free, constrained = one_case(vocab, grammar, rows, args)
            print(f"| {size} | {rows} | {made:.2f} | {free:.3f} | {constrained:.3f} | {constrained / free:.2f} |")


if __name__ == "__main__":
    main()
