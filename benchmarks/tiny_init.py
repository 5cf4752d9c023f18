"""How much a freshly built tiny model's next guess depends on the guess_number state, by `model.tiny.init_std`.

    python benchmarks/tiny_init.py                      # init_std 0.02 0.05 0.1 0.2, the quickstart's shape

For each init_std it builds the quickstart's tiny model (texts from random games, as `agentrl train` does), renders
the binary-search states as the quickstart's chat does, and prints the total variation distance between the
model's distributions over the digits 1..7 in two states that need different answers. A policy-gradient step can
only tell states apart through such differences, so near 0 the policy starts on the plateau where every state
gets the same guess (docs/quickstart.md).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

PAIRS = [((1, 3), (5, 7)), ((1, 1), (7, 7)), ((1, 7), (1, 1))]
HISTORY = {  # the binary-search turns that lead to each state of 1..7 in 3 guesses
    (1, 7): [],
    (1, 3): [("4", "lower, between 1 and 3")],
    (5, 7): [("4", "higher, between 5 and 7")],
    (1, 1): [("4", "lower, between 1 and 3"), ("2", "lower, between 1 and 1")],
    (7, 7): [("4", "higher, between 5 and 7"), ("6", "higher, between 7 and 7")],
}


def game_texts(games: int) -> list[str]:
    from envs.guess_number.env import GuessNumberEnv

    env, rng, texts = GuessNumberEnv(1, 7, 3, progress_reward=0.2), random.Random(0), []
    for seed in range(games):
        texts.append(env.reset(seed=seed)[0])
        for _ in range(3):
            observation, _, terminated, _, _ = env.step(str(rng.randint(1, 7)))
            texts.append(observation)
            if terminated:
                break
    return texts


def digit_distributions(path: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(1, 8)]
    out = {}  # state -> its distribution over the digits 1..7
    for state, turns in HISTORY.items():
        messages = [{"role": "user", "content": "You have 3 guesses. The number is between 1 and 7"}]
        for guess, reply in turns:
            messages += [{"role": "assistant", "content": guess}, {"role": "user", "content": reply}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            p = model(torch.tensor([ids])).logits[0, -1].softmax(-1)[digits]
        out[state] = p / p.sum()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init-std", default="0.02,0.05,0.1,0.2", help="comma-separated values to build")
    args = parser.parse_args()

    from agentrl.models.tiny import build_tiny_model

    texts = game_texts(200)
    header = " | ".join(f"TV {a} vs {b}" for a, b in PAIRS)
    print(f"| init_std | {header} |")
    print("|---|" + "---|" * len(PAIRS))
    with tempfile.TemporaryDirectory() as tmp:
        for std in (float(s) for s in args.init_std.split(",")):
            path = build_tiny_model(Path(tmp) / f"std{std}", texts, vocab_size=128, init_std=std)
            p = digit_distributions(path)
            cells = " | ".join(f"{0.5 * float((p[a] - p[b]).abs().sum()):.4f}" for a, b in PAIRS)
            print(f"| {std} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
