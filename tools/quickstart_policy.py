"""What a quickstart checkpoint's policy does: its greedy guess, and how sure it is, in every game.

    python tools/quickstart_policy.py runs/quickstart/checkpoints/step_000400

The game is the one the run's own config.yaml (two folders up) set: its range, guesses and wording; the flags
override it, and without a config.yaml it is launch/configs/quickstart.yaml's.
Plays each secret with the greedy guess against `guess_number` itself, and prints
each state it reached as (lowest possible, highest possible) -> guess : probability. A wrong guess held with
probability near 1 is where a run stopped learning (docs/quickstart.md#read-it).
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


GAME_KEYS = ("low", "high", "max_guesses", "name_the_last")
QUICKSTART_CONFIG = Path(__file__).resolve().parent.parent / "launch" / "configs" / "quickstart.yaml"


def run_game(checkpoint: Path) -> dict:
    """The guess_number settings of the run that wrote `checkpoint` (its config.yaml), else the quickstart's."""
    import yaml

    config = checkpoint.parent.parent / "config.yaml"
    kwargs = yaml.safe_load((config if config.is_file() else QUICKSTART_CONFIG).read_text())["env"]["kwargs"]
    return {key: kwargs[key] for key in GAME_KEYS if key in kwargs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint folder (full or LoRA adapter) of a quickstart run")
    parser.add_argument("--low", type=int)
    parser.add_argument("--high", type=int)
    parser.add_argument("--guesses", type=int, dest="max_guesses")
    parser.add_argument(
        "--name-the-last", action=argparse.BooleanOptionalAction, help='the env\'s name_the_last ("it is 3")'
    )
    args = parser.parse_args()
    flags = {key: getattr(args, key) for key in GAME_KEYS if getattr(args, key) is not None}
    game = {**run_game(Path(args.checkpoint)), **flags}
    from agentrl.models.adapters import is_adapter_folder

    if not ((Path(args.checkpoint) / "config.json").is_file() or is_adapter_folder(args.checkpoint)):
        parser.error(
            f"{args.checkpoint} holds no model (no config.json or adapter_config.json); pass a run's "
            "checkpoints/step_NNNNNN folder"
        )

    from transformers import AutoTokenizer

    from agentrl.models.loading import load_causal_lm
    from envs.guess_number.env import GuessNumberEnv

    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    model = load_causal_lm(args.checkpoint).eval()  # a LoRA checkpoint: its base with the adapter merged
    env = GuessNumberEnv(**game)
    print(f"game: {game}")
    wins = 0
    for secret in range(game["low"], game["high"] + 1):
        won, trace = play(model, tokenizer, env, secret)
        wins += won
        print(f"{secret}  {'win ' if won else 'lose'}  " + "   ".join(trace))
    print(f"greedy: {wins} of {game['high'] - game['low'] + 1} games won")


if __name__ == "__main__":
    main()
