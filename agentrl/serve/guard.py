"""Checks before any route runs (ASGI middleware): the API key, and the body's size while it arrives."""

from __future__ import annotations

import hmac
import json

from agentrl.serve.protocol import APIError

DEFAULT_MAX_BODY_BYTES = 4 << 20  # 8x the JSON of a 128k-token conversation
OPEN_PATHS = ("/health",)  # answered without the API key (load balancers and liveness probes)


class _BodyTooLarge(Exception):
    """Raised from `receive` inside a route, for the guard to answer (the route's own error handling never sees it)."""


class RequestGuard:
    """Refuses, in OpenAI's error shape and before any route reads a byte of the body:

    - with `api_key` set, a request to any path but OPEN_PATHS without `Authorization: Bearer <api_key>` (401);
    - a body over `max_body_bytes` (413): at once from its Content-Length, else as soon as the chunks received pass
      the limit. The ASGI server drops the rest of that body as it arrives, unbuffered, and the connection stays
      open: a client that sends its whole body before it reads (the openai client, curl) gets the 413, not a reset
      connection it would retry.
    """

    def __init__(self, app, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, api_key: str | None = None):
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = int(max_body_bytes)
        self.api_key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.api_key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            await _refuse(send, _key_error(scope), extra_headers=[(b"www-authenticate", b"Bearer")])
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await _refuse(send, self._too_large(f"its Content-Length is {declared} bytes"))
            return
        received = 0
        started = False

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyTooLarge
            return message

        async def watched_send(message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _BodyTooLarge:
            if started:
                raise
            await _refuse(send, self._too_large(f"more than {self.max_body_bytes} bytes arrived"))

    def _authorized(self, scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)
        return False

    def _too_large(self, what: str) -> APIError:
        return APIError(
            f"the request body is too large ({what}); this server takes at most {self.max_body_bytes} bytes "
            "(agentrl serve --max-body-bytes, the gateway's agent.max_body_bytes)",
            status=413,
            code="request_too_large",
        )


def _key_error(scope) -> APIError:
    if any(name == b"authorization" for name, _ in scope["headers"]):
        message, code = "invalid API key; send the server's key as 'Authorization: Bearer KEY'", "invalid_api_key"
    else:
        message, code = "missing API key: send 'Authorization: Bearer KEY' (the openai client's api_key)", "missing_key"
    return APIError(message, status=401, code=code)


def _content_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


async def _refuse(send, error: APIError, extra_headers: list | None = None) -> None:
    body = json.dumps(error.body(), separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})
