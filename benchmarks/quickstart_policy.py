"""What a quickstart checkpoint's policy does: its greedy guess, and how sure it is, in every game of 1..7.

    python benchmarks/quickstart_policy.py runs/quickstart/checkpoints/step_000400

Plays each secret with the greedy guess against `guess_number` itself, and prints
each state it reached as (lowest possible, highest possible) -> guess : probability. A wrong guess held with
probability near 1 is where a run stopped learning (docs/quickstart.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def play(model, tokenizer, env, secret: int) -> tuple[bool, list[str]]:
    """One game against `env` with the greedy guess; whether it was won and each state's guess and probability."""
    import torch

    prompt, _ = env.reset(seed=0)
    env.secret = secret
    messages = [{"role": "user", "content": prompt}]
    trace, done, won = [], False, False
    while not done:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            p = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
        top = int(p.argmax())
        guess = tokenizer.decode([top]).strip()
        trace.append(f"({env.possible[0]},{env.possible[1]}) -> {guess} : {float(p[top]):.2f}")
        reply, _, done, _, info = env.step(guess)
        won = info["success"]
        messages += [{"role": "assistant", "content": guess}, {"role": "user", "content": reply}]
    return won, trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint folder (full or LoRA adapter) of a quickstart run")
    parser.add_argument("--low", type=int, default=1)
    parser.add_argument("--high", type=int, default=7)
    parser.add_argument("--guesses", type=int, default=3)
    parser.add_argument("--name-the-last", action="store_true", help='the env\'s name_the_last ("it is 3")')
    args = parser.parse_args()
    from agentrl.trainer.lora import is_adapter_folder

    if not ((Path(args.checkpoint) / "config.json").is_file() or is_adapter_folder(args.checkpoint)):
        parser.error(
            f"{args.checkpoint} holds no model (no config.json or adapter_config.json); pass a run's "
            "checkpoints/step_NNNNNN folder"
        )

    from transformers import AutoTokenizer

    from agentrl.trainer.model import load_causal_lm
    from envs.guess_number.env import GuessNumberEnv

    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    model = load_causal_lm(args.checkpoint).eval()  # a LoRA checkpoint: its base with the adapter merged
    env = GuessNumberEnv(args.low, args.high, args.guesses, name_the_last=args.name_the_last)
    wins = 0
    for secret in range(args.low, args.high + 1):
        won, trace = play(model, tokenizer, env, secret)
        wins += won
        print(f"{secret}  {'win ' if won else 'lose'}  " + "   ".join(trace))
    print(f"greedy: {wins} of {args.high - args.low + 1} games won")


if __name__ == "__main__":
    main()
