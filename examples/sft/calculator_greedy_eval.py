"""Greedy held-out check of a model folder on the calculator env (until `agentrl eval` covers it):
success and tool-call rate on env seeds 1000000.. (held-out problems), and whether the model copies
the question's numbers into its call and a right tool result into its answer.

    python examples/sft/calculator_greedy_eval.py runs/calculator_sft/final --tasks 64
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM

from agentrl.env.tool_calls import parse_tool_calls
from agentrl.models.chat_format import ChatFormat
from agentrl.models.loading import load_tokenizer
from envs.calculator import CalculatorEnv
from envs.calculator.demos import call_text

KWARGS = {"max_value": 99, "max_steps": 4, "heldout_every": 10, "list_tools": False}  # calculator_rl.yaml's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    chat = ChatFormat(tokenizer)

    def generate(ids: list[int]) -> tuple[list[int], str]:
        prompt = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=40, do_sample=False, eos_token_id=chat.eos_id, pad_token_id=chat.eos_id
            )
        new = out[0, prompt.shape[1] :].tolist()
        new = new[:-1] if new and new[-1] == chat.eos_id else new
        return new, tokenizer.decode(new, skip_special_tokens=True)

    env = CalculatorEnv(**KWARGS)
    success = used_tool = exact_call = copied_answer = 0
    for task in range(args.tasks):
        question, info = env.reset(seed=1_000_000 + task)
        prompt = chat.prompt_ids(question)
        ids, reward, tool_turn = prompt, 0.0, False
        for turn in range(args.max_turns):
            new, text = generate(ids)
            parsed = parse_tool_calls(text)
            tool_turn = tool_turn or parsed.has_calls
            if turn == 0 and parsed.calls:
                exact_call += parsed.calls[0].arguments.get("expression") == info["expression"]
            observation, reward, terminated, truncated, _ = env.step(text)
            if terminated or truncated:
                break
            ids = ids + new + [chat.eos_id] + chat.observation_ids(observation)
        success += reward == 1.0
        used_tool += tool_turn
        # given the right call and its result, does the answer copy the result?
        ideal = tokenizer(call_text(info["expression"]), add_special_tokens=False)["input_ids"]
        result = chat.observation_ids(f"<tool_response>\n{info['answer']}\n</tool_response>")
        copied_answer += generate(prompt + ideal + [chat.eos_id] + result)[1].strip() == info["answer"]
    n = args.tasks
    print(
        f"{args.model}: success {success / n:.3f}, episodes with a tool call {used_tool / n:.3f}, "
        f"exact first call {exact_call}/{n}, answer copied from a right result {copied_answer}/{n} (greedy)"
    )


if __name__ == "__main__":
    main()
