"""What a quickstart checkpoint's policy does: its greedy guess, and how sure it is, in every game of 1..7.

    python benchmarks/quickstart_policy.py runs/quickstart/checkpoints/step_000400

Plays each secret with the greedy guess, the env's replies rendered as `guess_number` writes them, and prints
each state it reached as (lowest possible, highest possible) -> guess : probability. A wrong guess held with
probability near 1 is where a run stopped learning (docs/quickstart.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def play(model, tokenizer, secret: int, low: int, high: int, guesses: int) -> tuple[bool, list[str]]:
    import torch

    messages = [{"role": "user", "content": f"You have {guesses} guesses. The number is between {low} and {high}"}]
    lo, hi, trace = low, high, []
    for _ in range(guesses):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            p = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
        top = int(p.argmax())
        text = tokenizer.decode([top]).strip()
        trace.append(f"({lo},{hi}) -> {text} : {float(p[top]):.2f}")
        if not text.isdigit():
            return False, trace
        guess = int(text)
        if guess == secret:
            return True, trace
        reply = "higher" if guess < secret else "lower"
        lo, hi = (max(lo, guess + 1), hi) if guess < secret else (lo, min(hi, guess - 1))
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"{reply}, between {lo} and {hi}"},
        ]
    return False, trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint folder (or any model folder) of a quickstart run")
    parser.add_argument("--low", type=int, default=1)
    parser.add_argument("--high", type=int, default=7)
    parser.add_argument("--guesses", type=int, default=3)
    args = parser.parse_args()
    if not (Path(args.checkpoint) / "config.json").is_file():
        parser.error(f"{args.checkpoint} holds no model (no config.json); pass a run's checkpoints/step_NNNNNN folder")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint).eval()
    wins = 0
    for secret in range(args.low, args.high + 1):
        won, trace = play(model, tokenizer, secret, args.low, args.high, args.guesses)
        wins += won
        print(f"{secret}  {'win ' if won else 'lose'}  " + "   ".join(trace))
    print(f"greedy: {wins} of {args.high - args.low + 1} games won")


if __name__ == "__main__":
    main()
