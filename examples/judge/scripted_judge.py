"""A scripted OpenAI-compatible judge for examples/judge/bandit.yaml: it scores by a rule, not a model.

Each rubric prompt holds the policy's reply after `Reply:`; the judge answers `Score: D`, D the largest digit in
that reply (0 when it has none). /v1/completions answers a whole batch of prompts in one response, as agentrl's
judge client sends them with reward.judge.api=completions; /v1/chat/completions answers one. It stands in for an
LLM judge whose preferences a tiny policy can learn in minutes; the client path (agentrl/scoring/judge.py) is the
real one. `app.state.requests` and `app.state.prompts` count what came.

    python examples/judge/scripted_judge.py --port 8123
"""

from __future__ import annotations

import argparse
import re

from fastapi import FastAPI, Request

REPLY = re.compile(r"Reply:(.*?)(?:\n[A-Z][a-z]+:|$)", re.S)


def score_of(prompt: str) -> int:
    """The largest digit in the prompt's reply; 0 when the prompt has no reply or the reply no digit."""
    found = REPLY.search(prompt)
    digits = re.findall(r"\d", found[1]) if found else []
    return max((int(digit) for digit in digits), default=0)


def build_app() -> FastAPI:
    app = FastAPI(title="scripted judge")
    app.state.requests = app.state.prompts = 0

    async def completions(request: Request) -> dict:
        body = await request.json()
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        app.state.requests += 1
        app.state.prompts += len(prompts)
        choices = [
            {"index": index, "text": f" Score: {score_of(prompt)}", "finish_reason": "stop"}
            for index, prompt in enumerate(prompts)
        ]
        return {"object": "text_completion", "model": body.get("model"), "choices": choices}

    async def chat(request: Request) -> dict:
        body = await request.json()
        app.state.requests += 1
        app.state.prompts += 1
        text = f"Score: {score_of(body['messages'][-1]['content'])}"
        message = {"role": "assistant", "content": text}
        return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])
    return app


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    uvicorn.run(build_app(), host="127.0.0.1", port=args.port, log_level="warning")
