"""An LLM judge over any OpenAI-compatible endpoint: rubric prompts in, rewards in [0, 1] out.

api=completions sends a whole batch as one /completions request (its `prompt` is the list of rubric prompts, and
each choice's `index` says which prompt it answers); api=chat sends one /chat/completions request per prompt,
`concurrency` at once. Requests that cannot connect, time out or get a 5xx are tried again `retries` times; then
every prompt of the request fails with the reason (ScoreFailed), as does a reply without a readable score.
"""

from __future__ import annotations

import asyncio
import os

import httpx

from agentrl.config.schema import JudgeConfig
from agentrl.errors import UserError
from agentrl.scoring.parse import reply_reward
from agentrl.scoring.score import ScoreFailed

SHOWN_BODY_CHARS = 300  # of an error response quoted in a failure


class JudgeClient:
    """`await client.score_batch(prompts)`: a reward or a ScoreFailed per rubric prompt."""

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.headers = {}
        if config.api_key_env:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise UserError(
                    f"reward.judge.api_key_env={config.api_key_env} names an environment variable that is not set; "
                    f"export {config.api_key_env}=YOUR_KEY before starting, or set api_key_env to null for a judge "
                    "without a key"
                )
            self.headers["Authorization"] = f"Bearer {key}"
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None

    async def score_batch(self, prompts: list[str]) -> list[float | ScoreFailed]:
        if self.config.api == "completions":
            try:
                replies = await self._completions(prompts)
            except ScoreFailed as failure:
                return [failure] * len(prompts)
        else:
            replies = await asyncio.gather(*(self._chat(prompt) for prompt in prompts), return_exceptions=True)
        return [self._reward(reply) for reply in replies]

    def _reward(self, reply: str | BaseException) -> float | ScoreFailed:
        return reply_reward(reply, self.config, "asking the judge raised")

    async def _completions(self, prompts: list[str]) -> list[str]:
        body = {
            "model": self.config.model,
            "prompt": prompts,
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
            **self.config.request_extra,
        }
        reply = await self._post("/completions", body)
        texts: list[str | None] = [None] * len(prompts)
        for choice in _choices(reply, "/completions"):
            index, text = choice.get("index"), choice.get("text")
            if isinstance(index, int) and 0 <= index < len(prompts) and isinstance(text, str):
                texts[index] = text
        missing = [index for index, text in enumerate(texts) if text is None]
        if missing:
            raise ScoreFailed(
                f"the judge's /completions reply has no text for {len(missing)} of its {len(prompts)} prompts; an "
                "endpoint that takes one prompt per request needs reward.judge.api=chat"
            )
        return texts

    async def _chat(self, prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        if self.config.system_prompt:
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        body = {
            "model": self.config.model,
            "messages": messages,
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
            **self.config.request_extra,
        }
        choices = _choices(await self._post("/chat/completions", body), "/chat/completions")
        content = (choices[0].get("message") or {}).get("content") if choices else None
        if not isinstance(content, str):
            raise ScoreFailed("the judge's /chat/completions reply has no message content in its first choice")
        return content

    async def _post(self, route: str, body: dict) -> dict:
        """The endpoint's JSON answer to `body`, tried 1 + retries times; ScoreFailed with the last reason."""
        client, slots = self._bound()
        url, timeout = self.config.base_url + route, self.config.timeout_s
        tries = self.config.retries + 1
        for _ in range(tries):
            try:
                async with slots:
                    response = await asyncio.wait_for(client.post(url, json=body, headers=self.headers), timeout)
            except (TimeoutError, httpx.TimeoutException):
                problem = f"the judge at {url} did not answer within reward.judge.timeout_s={timeout:g} s"
                continue
            except httpx.TransportError as error:
                problem = f"cannot reach the judge at {url} ({type(error).__name__}: {error}); is it running there?"
                continue
            if response.status_code >= 500:
                problem = f"the judge at {url} answered HTTP {response.status_code}: {response.text[:SHOWN_BODY_CHARS]}"
                continue
            if response.status_code != 200:
                raise ScoreFailed(
                    f"the judge at {url} refused the request with HTTP {response.status_code}; check "
                    "reward.judge.model, api, api_key_env and request_extra.\n"
                    f"It said: {response.text[:SHOWN_BODY_CHARS]}"
                )
            try:
                return response.json()
            except ValueError:
                raise ScoreFailed(
                    f"the judge at {url} answered with something that is not JSON: {response.text[:SHOWN_BODY_CHARS]!r}"
                ) from None
        raise ScoreFailed(problem if tries == 1 else f"{problem} (each of {tries} tries)")

    def _bound(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The HTTP client and request slots of the running event loop (made on first use in it)."""
        loop = asyncio.get_running_loop()
        if self._client_loop is not loop:
            limits = httpx.Limits(max_connections=self.config.concurrency)
            self._client = httpx.AsyncClient(limits=limits, timeout=self.config.timeout_s)
            self._slots = asyncio.Semaphore(self.config.concurrency)
            self._client_loop = loop
        return self._client, self._slots


def _choices(reply, route: str) -> list[dict]:
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not all(isinstance(choice, dict) for choice in choices):
        raise ScoreFailed(f"the judge's {route} reply is not an OpenAI response (no `choices` list): {reply!r:.300}")
    return choices
