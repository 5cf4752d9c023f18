"""Task rows for the calculator agent from the calculator env's problems: {"id", "question", "answer"}.

    python examples/openai_agent/make_tasks.py examples/openai_agent/tasks_train.jsonl --seeds 0:3000
    python examples/openai_agent/make_tasks.py examples/openai_agent/tasks_val.jsonl --seeds 1000000:1000128

With heldout_every=10 (as in the calculator RL config) seeds from 1000000 draw only held-out problems and
the others never do, so the agent is never trained on a problem its evaluation asks.
"""

import argparse
import json

from envs.calculator import CalculatorEnv

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--seeds", default="0:3000", help="first:end (end excluded)")
    args = parser.parse_args()
    first, end = (int(part) for part in args.seeds.split(":"))
    env = CalculatorEnv(max_value=99, heldout_every=10)
    with open(args.out, "w") as out:
        for seed in range(first, end):
            question, info = env.reset(seed=seed)
            out.write(json.dumps({"id": str(seed), "question": question, "answer": info["answer"]}) + "\n")
    print(f"{args.out}: {end - first} tasks")
