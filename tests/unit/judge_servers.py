"""Scripted OpenAI-compatible judges for the judge tests: one that answers late, one that scores by a rule.

The real judge endpoint of the tests is `agentrl serve` over a tiny model (test_judge.py); these stand in only
where a test needs a judge that is slow on purpose, or whose scores a tiny policy can learn
(examples/judge/scripted_judge.py is the learning run's)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from fastapi import FastAPI, Request

from tests.unit.serve_server import ThreadServer, build_serve_model

MODEL = "tiny-judge"


@contextlib.contextmanager
def served_tiny_judge(folder: Path):
    """`agentrl serve`'s app over a tiny random model (printable characters) on the continuous engine, on a free
    port of 127.0.0.1; the server's `records` holds every generated choice with its request id."""
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.models.loading import load_causal_lm, load_tokenizer
    from agentrl.serve.app import build_app
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend

    model_dir = build_serve_model(folder / "tiny")
    tokenizer = load_tokenizer(str(model_dir))
    engine = ContinuousTorchEngine(load_causal_lm(str(model_dir)), pad_token_id=tokenizer.pad_token_id, seed=0)
    records = []
    completions = Completions(LocalBackend(engine, tokenizer), tokenizer, MODEL, 2048, on_call=records.append)
    try:
        with ThreadServer(build_app(completions)) as server:
            server.records = records
            yield server
    finally:
        engine.shutdown()


def slow_judge(delay_s: float) -> FastAPI:
    """Answers `Score: 5` to every chat or completions request, `delay_s` seconds late (`app.state.calls`: how
    many came; `app.state.authorization`: the last one's Authorization header)."""
    app = FastAPI()
    app.state.calls = 0
    app.state.authorization = None

    async def answer(request: Request) -> dict:
        body = await request.json()
        app.state.calls += 1
        app.state.authorization = request.headers.get("authorization")
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
