"""Relay played by an agent program through the training gateway (launch/configs/relay_coop_agent.yaml): the
program holds the game (the relay's rules, envs/relay/rules.py), asks the proposer and then the solver by model name
in one session, and posts each policy's own reward to the session's /reward. Run once per episode: the task
({"seed": N}) on stdin, OPENAI_BASE_URL and OPENAI_API_KEY set to the session's. Standard library only (run as a
script, not as part of the envs package, which imports gymnasium), so a run starts fast.

    python envs/relay/agent.py [NUMBERS]      # NUMBERS: targets 2 to NUMBERS + 1, problems 1 to NUMBERS (3)
"""

from __future__ import annotations

import http.client
import json
import os
import random
import sys
from urllib.parse import urlsplit

from rules import outcome, posed_problem  # beside this script


class Session:
    """The episode's session on the gateway: chat calls by model name, and rewards."""

    def __init__(self, base_url: str, key: str):
        url = urlsplit(base_url)
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
        self.root = url.path.removesuffix("/v1")  # /sessions/ID
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def post(self, path: str, body: dict) -> dict:
        self.connection.request("POST", self.root + path, json.dumps(body), self.headers)
        response = self.connection.getresponse()
        answer = json.loads(response.read() or b"{}")
        if response.status != 200:
            raise SystemExit(f"{path}: HTTP {response.status}: {answer.get('error', {}).get('message', answer)}")
        return answer

    def ask(self, model: str, text: str) -> str:
        body = {"model": model, "messages": [{"role": "user", "content": text}]}
        return self.post("/v1/chat/completions", body)["choices"][0]["message"]["content"] or ""


def main() -> None:
    task = json.load(sys.stdin)
    numbers = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rng = random.Random(int(task["seed"]))
    target = rng.randint(2, numbers + 1)
    session = Session(os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"])
    posed = posed_problem(session.ask("proposer", f"pose a problem for {target}"), numbers)
    problem = posed if posed is not None else rng.randint(1, numbers)  # nonsense: a drawn problem, nothing earned
    answer = session.ask("solver", f"add one to {problem}")
    rewards, successes = outcome(target, problem, posed is not None, answer)
    for policy, reward in rewards.items():
        session.post("/reward", {"reward": reward, "policy": policy, "success": successes[policy]})


if __name__ == "__main__":
    main()
