"""How much a freshly built tiny model's next guess depends on the guess_number state, by `model.tiny.init_std`.

    python benchmarks/tiny_init.py                      # init_std 0.02 0.05 0.1 0.2, the quickstart's config

For each init_std it builds the quickstart's tiny model as `agentrl train` does (`ensure_model` on the env's
texts), plays binary search in the quickstart's env to reach states that need different answers, and prints the
total variation distance between the model's distributions over the digits 1..7 in those states. A policy-gradient
step can only tell states apart through such differences, so near 0 the policy starts on the plateau where every
state gets the same guess (benchmarks/results/quickstart-tuning.md, round 3).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECRETS_OF = {(1, 3): 2, (5, 7): 6, (1, 1): 1, (7, 7): 7, (1, 7): 4}  # a secret whose binary search reaches the state
PAIRS = [((1, 3), (5, 7)), ((1, 1), (7, 7)), ((1, 7), (1, 1))]


def chat_reaching(env, state: tuple[int, int]) -> list[dict]:
    """The chat, as the env writes it, of binary search on a secret until the possible range is `state`."""
    prompt, _ = env.reset(seed=0)
    env.secret = SECRETS_OF[state]
    messages = [{"role": "user", "content": prompt}]
    while env.possible != state:
        guess = str(sum(env.possible) // 2)
        messages += [{"role": "assistant", "content": guess}, {"role": "user", "content": env.step(guess)[0]}]
    return messages


def digit_distributions(path: Path, env) -> dict:
    """state -> the model's next-token distribution over the digits 1..7 there."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(1, 8)]
    out = {}
    for state in SECRETS_OF:
        chat = chat_reaching(env, state)
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            p = model(torch.tensor([ids])).logits[0, -1].softmax(-1)[digits]
        out[state] = p / p.sum()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init-std", default="0.02,0.05,0.1,0.2", help="comma-separated values to build")
    args = parser.parse_args()

    from agentrl.config import load_config
    from agentrl.env import make
    from agentrl.models.loading import ensure_model
    from agentrl.run.tokenizer_corpus import env_texts

    header = " | ".join(f"TV {a} vs {b}" for a, b in PAIRS)
    print(f"| init_std | {header} |")
    print("|---|" + "---|" * len(PAIRS))
    with tempfile.TemporaryDirectory() as tmp:
        for std in args.init_std.split(","):
            path = Path(tmp) / f"std{std}"
            overrides = [f"model.path={path}", f"model.tiny.init_std={std}"]
            config = load_config(ROOT / "launch" / "configs" / "quickstart.yaml", overrides)
            ensure_model(config.model, lambda config=config: env_texts(config))
            p = digit_distributions(path, make(config.env.id, **config.env.kwargs))
            cells = " | ".join(f"{0.5 * float((p[a] - p[b]).abs().sum()):.4f}" for a, b in PAIRS)
            print(f"| {std} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
