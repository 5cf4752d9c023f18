"""TRL's side of benchmarks/vs_trl.py: GRPOTrainer on the digit task or the guess-the-number game, in the TRL venv.

    .venv-trl/bin/python benchmarks/vs_trl_side.py --task digit --model MODEL --rows ROWS.jsonl --work W --out RUN.json
    .venv-trl/bin/python benchmarks/vs_trl_side.py --task guess --model MODEL --game KWARGS_JSON --work W --out RUN.json

Run by benchmarks/vs_trl.py (which makes the venv, the model folder and the rows); it imports only TRL, its
dependencies, the digit task's reward and the game's env class (gymnasium; the repository on PYTHONPATH), never
agentrl's trainer. The settings that differ from GRPOConfig's defaults are `TRL_CHANGES`, each with its reason;
vs_trl.py prints them and docs/performance.md lists them.

- digit: one turn, TRL's own generation (`model.generate`), `benchmarks.tasks.digit.digit_reward`.
- guess: several turns through TRL's multi-turn hook for custom environments, `rollout_func` (its `tools=` and
  `environment_factory` need a model that writes JSON tool calls). The function plays every game of the batch turn
  by turn with `model.generate` on the whole history, and returns the tokens after the prompt with an `env_mask`
  (1 on sampled tokens, 0 on the env's replies and on the end-of-turn token the loop adds), as agentrl's episode
  has them; the reward is the env's, summed over the turns.

The output JSON: per step the wall clock at its end, the rewards and successes of its episodes, its sampled and
total token counts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# GRPOConfig fields set away from their defaults, with the reason; shared by both tasks (`task_changes` adds theirs).
TRL_CHANGES = {
    "per_device_train_batch_size": (64, "8 prompts x 8 completions per step, one optimizer step per batch"),
    "num_generations": (8, "the group size (the default, stated)"),
    "learning_rate": (None, "agentrl's optimizer.lr in both configs (--lr)"),
    "lr_scheduler_type": ("constant", "agentrl's lr_scheduler.decay default (TRL's: linear to 0)"),
    "adam_beta2": (0.99, "agentrl's optimizer.betas default (0.9, 0.99); TRL's: 0.999"),
    "epsilon_high": (0.28, "agentrl's clip-higher default (0.2 / 0.28); inert here: one update per batch"),
    "bf16": (False, "float32 like agentrl (TRL's default bf16=True casts on CPU too)"),
    "gradient_checkpointing": (False, "agentrl recomputes no activations (TRL's default: True)"),
    "max_steps": (None, "the benchmark's --steps"),
    "seed": (None, "the run's seed"),
    "save_strategy": ("no", "no checkpoint inside the timed steps (agentrl: checkpoint.every 0)"),
    "report_to": ("none", "no tracking service; agentrl writes TensorBoard only"),
    "disable_tqdm": (True, "no progress bar (agentrl: logging.progress false)"),
}


def task_changes(task: str, max_new_tokens: int) -> dict:
    """The changes one task adds to TRL_CHANGES."""
    changes = {"max_completion_length": (max_new_tokens, "rollout.max_new_tokens (per turn)")}
    if task == "guess":
        changes["rollout_func"] = ("play_games", "the multi-turn game loop (TRL has no env loop without tool calls)")
    return changes


def observation_ids(tokenizer, observation: str) -> list[int]:
    """The chat template's tokens after an assistant turn's end-of-turn token up to the next generation prompt,
    the observation as a user message: what a user writes to continue a conversation by hand."""
    base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    closed = tokenizer.apply_chat_template(base, tokenize=False)
    full = tokenizer.apply_chat_template(
        [*base, {"role": "user", "content": observation}], tokenize=False, add_generation_prompt=True
    )
    cut = closed.rfind("a" + tokenizer.eos_token) + 1 + len(tokenizer.eos_token)
    return tokenizer.encode(full[cut:], add_special_tokens=False)


def prompt_ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


class StepLog:
    """What each step did, filled by the reward function (or the rollout) and a callback at each step's end."""

    def __init__(self):
        self.steps: list[dict] = []
        self.pending: dict = {}

    def episodes(self, rewards, successes, sampled_tokens: int, total_tokens: int) -> None:
        self.pending = {
            "rewards": [float(r) for r in rewards],
            "success": [bool(s) for s in successes],
            "sampled_tokens": int(sampled_tokens),
            "tokens": int(total_tokens),
        }

    def step_end(self) -> None:
        self.steps.append({"end": time.time(), **self.pending})
        self.pending = {}


def digit_setup(args, log: StepLog, tokenizer):
    from datasets import Dataset

    from benchmarks.tasks.digit import digit_reward

    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": row["prompt"]}], "answer": row["answer"]} for row in rows]
    )
    prompt_len = {row["prompt"]: len(prompt_ids(tokenizer, row["prompt"])) for row in rows}

    def reward(prompts, completions, completion_ids, answer, **_):
        texts = [completion[0]["content"] for completion in completions]
        rewards = [digit_reward(text, truth) for text, truth in zip(texts, answer, strict=True)]
        sampled = sum(len(ids) for ids in completion_ids)
        total = sampled + sum(prompt_len[prompt[-1]["content"]] for prompt in prompts)
        log.episodes(
            rewards, [text.strip() == truth for text, truth in zip(texts, answer, strict=True)], sampled, total
        )
        return rewards

    return dataset, reward, None


def guess_setup(args, log: StepLog, tokenizer):
    import torch
    from datasets import Dataset

    from envs.guess_number.env import GuessNumberEnv

    game = json.loads(args.game)
    first, _ = GuessNumberEnv(**game).reset(seed=0)
    # Every row is the game's opening (the secret is drawn per group by the rollout), as many as a run needs.
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": first}]}] * max(64, 8 * args.steps))
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    pad = tokenizer.pad_token_id
    replies: dict[str, list[int]] = {}
    draw = random.Random(args.seed)

    def play_games(prompts, trainer):
        group = trainer.num_generations
        envs, starts = [], []
        for index in range(len(prompts)):
            if index % group == 0:
                secret_seed = draw.randrange(2**31)
            env = GuessNumberEnv(**game)
            observation, _ = env.reset(seed=secret_seed)
            envs.append(env)
            starts.append(prompt_ids(tokenizer, observation))
        completions = [[] for _ in prompts]
        masks = [[] for _ in prompts]
        rewards = [0.0] * len(prompts)
        wins = [False] * len(prompts)
        live = list(range(len(prompts)))
        model = trainer.accelerator.unwrap_model(trainer.model)
        for _turn in range(args.max_turns):
            if not live:
                break
            rows = [starts[i] + completions[i] for i in live]
            width = max(len(row) for row in rows)
            input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
            attention = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
            with torch.no_grad():
                out = model.generate(
                    input_ids=input_ids, attention_mask=attention, generation_config=trainer.generation_config
                )
            still = []
            for row, i in enumerate(live):
                new = out[row, width:].tolist()
                if eos in new:
                    new = new[: new.index(eos) + 1]
                completions[i] += new
                masks[i] += [1] * len(new)
                if new[-1] != eos:
                    completions[i].append(eos)
                    masks[i].append(0)
                observation, reward, terminated, truncated, info = envs[i].step(
                    tokenizer.decode(new, skip_special_tokens=True)
                )
                rewards[i] += reward
                wins[i] = wins[i] or bool(info.get("success"))
                if terminated or truncated:
                    continue
                if observation not in replies:
                    replies[observation] = observation_ids(tokenizer, observation)
                completions[i] += replies[observation]
                masks[i] += [0] * len(replies[observation])
                still.append(i)
            live = still
        log.episodes(
            rewards,
            wins,
            sum(sum(mask) for mask in masks),
            sum(len(s) + len(c) for s, c in zip(starts, completions, strict=True)),
        )
        return {
            "prompt_ids": starts,
            "completion_ids": completions,
            "logprobs": None,
            "env_mask": masks,
            "env_reward": rewards,
        }

    def reward(env_reward, **_):
        return list(env_reward)

    return dataset, reward, play_games


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=("digit", "guess"), required=True)
    parser.add_argument("--model", help="the model folder agentrl built (save_pretrained)")
    parser.add_argument("--rows", help="digit: the task rows (jsonl)")
    parser.add_argument("--game", help="guess: the env's kwargs (JSON)")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-3, help="learning_rate (agentrl's optimizer.lr)")
    parser.add_argument("--work", help="TRL's output_dir (nothing is saved there)")
    parser.add_argument("--out")
    parser.add_argument("--print-changes", action="store_true", help="print the GRPOConfig changes as JSON, exit")
    args = parser.parse_args()
    changes = {**TRL_CHANGES, **task_changes(args.task, args.max_new_tokens)}
    changes["learning_rate"] = (args.lr, changes["learning_rate"][1])
    if args.print_changes:
        print(json.dumps({name: [value, why] for name, (value, why) in changes.items()}))
        return
    missing = [name for name in ("model", "work", "out") if getattr(args, name) is None]
    if missing:
        parser.error(f"--{' --'.join(missing)} needed to train")
    started = time.time()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    log = StepLog()
    dataset, reward, rollout = (digit_setup if args.task == "digit" else guess_setup)(args, log, tokenizer)
    values = {name: value for name, (value, _) in changes.items() if name != "rollout_func"}
    values.update(max_steps=args.steps, seed=args.seed)
    config = GRPOConfig(output_dir=args.work, **values)

    class EachStep(TrainerCallback):
        def on_step_end(self, *_, **__):
            log.step_end()

    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[EachStep()],
        rollout_func=rollout,
    )
    ready = time.time()
    trainer.train()
    import transformers
    import trl

    Path(args.out).write_text(
        json.dumps(
            {
                "side": "trl",
                "task": args.task,
                "seed": args.seed,
                "started": started,
                "ready": ready,
                "finished": time.time(),
                "steps": log.steps,
                "threads": torch.get_num_threads(),
                "versions": {
                    "trl": trl.__version__,
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                },
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
