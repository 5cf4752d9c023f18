"""Scripted OpenAI-compatible judges for the judge tests: one that answers late, one that scores by a rule.

The real judge endpoint of the tests is `agentrl serve` over a tiny model (test_judge.py); these stand in only
where a test needs a judge that is slow on purpose, or whose scores a tiny policy can learn
(examples/judge/scripted_judge.py is the learning run's)."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request


def slow_judge(delay_s: float) -> FastAPI:
    """Answers `Score: 5` to every chat or completions request, `delay_s` seconds late (`app.state.calls`: how
    many came)."""
    app = FastAPI()
    app.state.calls = 0

    async def answer(request: Request) -> dict:
        body = await request.json()
        app.state.calls += 1
        await asyncio.sleep(delay_s)
        prompts = body.get("prompt", [None])
        return {
            "choices": [
                {"index": index, "text": "Score: 5", "message": {"role": "assistant", "content": "Score: 5"}}
                for index, _ in enumerate(prompts)
            ]
        }

    app.add_api_route("/v1/chat/completions", answer, methods=["POST"])
    app.add_api_route("/v1/completions", answer, methods=["POST"])
    return app
