"""The HTTP routes: the OpenAI endpoints as a router any app can mount under its own prefix, and the server's app.

`openai_router(completions, hook_for)` holds POST /chat/completions, POST /completions and GET /models.
`hook_for(request)`, if given, runs before each call with the starlette Request (path parameters, headers) and
returns the `on_call` hook for it, or raises an APIError (401 for a wrong key, 404 for an unknown session):
the training gateway mounts the router at `/sessions/{sid}/v1` that way. `build_app` mounts it at `/v1`, behind
the `guard.RequestGuard` (API key, body size). A call whose client goes away stops generating (`_unless_client_leaves`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentrl.serve.completions import Completions, OnCall
from agentrl.serve.guard import DEFAULT_MAX_BODY_BYTES, RequestGuard
from agentrl.serve.protocol import APIError, check_content_type

HookFor = Callable[[Request], OnCall | None]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CLIENT_CLOSED = 499  # the status of a call whose client left (nginx's): sent to no one, seen in access logs
# A JSON escape of a UTF-16 surrogate: only then can a decoded string hold a lone one (raw UTF-8 cannot).
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def openai_router(completions: Completions, hook_for: HookFor | None = None) -> APIRouter:
    router = APIRouter()

    async def call(request: Request, handler) -> Response:
        started = time.perf_counter()
        on_call = hook_for(request) if hook_for is not None else None
        body = await _json_body(request)
        result = await _unless_client_leaves(request, handler(body, on_call))
        if result is None:
            return Response(status_code=CLIENT_CLOSED)
        if isinstance(result, dict):
            body = _dumps(result)
            # The call's time in this app, as W3C Server-Timing: a client's latency minus it is what the HTTP
            # layer (client library, connection, uvicorn, routing) took (benchmarks/bench_serve.py).
            timing = {"Server-Timing": f"app;dur={(time.perf_counter() - started) * 1e3:.3f}"}
            return Response(body, media_type="application/json", headers=timing)
        return StreamingResponse(result, media_type="text/event-stream", headers=SSE_HEADERS)

    async def chat_completions(request: Request) -> Response:
        return await call(request, completions.chat)

    async def text_completions(request: Request) -> Response:
        return await call(request, completions.complete)

    async def models(request: Request) -> Response:
        if hook_for is not None:
            hook_for(request)
        return Response(_dumps(completions.models()), media_type="application/json")

    async def model(request: Request) -> Response:
        if hook_for is not None:
            hook_for(request)
        return Response(_dumps(completions.card(request.path_params["model_id"])), media_type="application/json")

    # Starlette routes, not FastAPI path operations: each request skips FastAPI's parameter solving, which
    # these handlers do not use (they parse and check the body themselves), about 0.2 ms per call.
    router.add_route("/chat/completions", chat_completions, methods=["POST"])
    router.add_route("/completions", text_completions, methods=["POST"])
    router.add_route("/models", models, methods=["GET"])
    router.add_route("/models/{model_id:path}", model, methods=["GET"])
    return router


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal in OpenAI's error shape."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RecursionError)  # json.loads of a deep body in a route that parses its own (/reward)
    async def too_deep(request: Request, error: RecursionError) -> JSONResponse:
        return JSONResponse(_too_deep().body(), status_code=400)

    @app.exception_handler(Exception)
    async def server_error(request: Request, error: Exception) -> JSONResponse:
        # Any other failure: the traceback goes to the server's log (starlette re-raises it), not to the client.
        message = f"the server failed on this request ({type(error).__name__}); its log has the details"
        return JSONResponse(APIError(message, status=500, kind="server_error").body(), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(APIError(str(error)).body(), status_code=400)

    @app.exception_handler(404)
    async def not_found(request: Request, error) -> JSONResponse:
        message = (
            f"no route {request.method} {request.url.path}; this server has /v1/chat/completions, /v1/completions, "
            "/v1/models and /health"
        )
        return JSONResponse(APIError(message, status=404, code="not_found").body(), status_code=404)

    @app.exception_handler(405)
    async def wrong_method(request: Request, error) -> JSONResponse:
        message = f"{request.method} is not allowed on {request.url.path}"
        return JSONResponse(APIError(message, status=405).body(), status_code=405)


def build_app(
    completions: Completions, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, api_key: str | None = None
) -> FastAPI:
    """The server's app: the OpenAI routes at /v1, and GET /health with what the backend reports (its load).
    With `api_key`, every route but /health needs it as the Bearer token; bodies over `max_body_bytes` get 413."""
    app = FastAPI(title="agentrl serve", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.add_middleware(RequestGuard, max_body_bytes=max_body_bytes, api_key=api_key)
    app.include_router(openai_router(completions), prefix="/v1")

    async def health_check(request: Request) -> Response:
        body = {"status": "ok", "model": completions.model_name, **completions.backend.health()}
        return Response(_dumps(body), media_type="application/json")

    app.add_route("/health", health_check, methods=["GET"])

    return app


async def _unless_client_leaves(request: Request, work: Awaitable) -> object | None:
    """`work`'s result, or None once the client has closed its connection: `work` (the generation) is cancelled
    then, so its sequences leave the engine at the next decode step. (Starlette watches for that itself only while
    it streams a response.)"""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is cancelled
        gone.cancel()
        if not task.done():
            task.cancel()
    if not task.cancelled() and task.done():
        return task.result()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def _disconnected(receive) -> None:
    """Returns when the ASGI server reports the client gone (the body has been read before this runs)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json_body(request: Request) -> object:
    check_content_type(request.headers.get("content-type"))
    raw = await request.body()
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(
            f"the request body is not valid JSON ({error}); send a JSON object with Content-Type: application/json",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise _too_deep() from None
    if SURROGATE_ESCAPE.search(raw):
        _refuse_lone_surrogates(payload)
    return payload


def _too_deep() -> APIError:
    message = "the request body nests too deeply to read; send JSON nested a few hundred levels at most"
    return APIError(message, code="invalid_json")


def _refuse_lone_surrogates(payload: object) -> None:
    """An APIError naming a string with a lone UTF-16 surrogate (e.g. "\\ud800") in it: no text can encode it."""
    pending: list[tuple[str, object]] = [("", payload)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, dict):
            pending += [(f"{path}.{key}" if path else str(key), item) for key, item in value.items()]
            pending += [(f"{path} (a key)", key) for key in value]
        elif isinstance(value, list):
            pending += [(f"{path}.{index}" if path else str(index), item) for index, item in enumerate(value)]
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise APIError(
                    f"{path or 'the body'} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                    "which is no character; send valid Unicode",
                    param=path or None,
                    code="invalid_value",
                ) from None


def _dumps(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
