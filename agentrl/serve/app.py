"""The HTTP routes: the OpenAI endpoints as a router any app can mount under its own prefix, and the server's app.

`openai_router(completions, hook_for)` holds POST /chat/completions, POST /completions and GET /models.
`hook_for(request)`, if given, runs before each call with the starlette Request (path parameters, headers) and
returns the `on_call` hook for it, or raises an APIError (401 for a wrong key, 404 for an unknown session):
the training gateway mounts the router at `/sessions/{sid}/v1` that way. `build_app` mounts it at `/v1`.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentrl.serve.completions import Completions, OnCall
from agentrl.serve.protocol import APIError

HookFor = Callable[[Request], OnCall | None]
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def openai_router(completions: Completions, hook_for: HookFor | None = None) -> APIRouter:
    router = APIRouter()

    async def call(request: Request, handler) -> Response:
        on_call = hook_for(request) if hook_for is not None else None
        result = await handler(await _json_body(request), on_call)
        if isinstance(result, dict):
            return Response(_dumps(result), media_type="application/json")
        return StreamingResponse(result, media_type="text/event-stream", headers=SSE_HEADERS)

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await call(request, completions.chat)

    @router.post("/completions")
    async def text_completions(request: Request) -> Response:
        return await call(request, completions.complete)

    @router.get("/models")
    async def models(request: Request) -> Response:
        if hook_for is not None:
            hook_for(request)
        return Response(_dumps(completions.models()), media_type="application/json")

    @router.get("/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        if hook_for is not None:
            hook_for(request)
        if model_id != completions.model_name:
            raise APIError(f"The model `{model_id}` does not exist", status=404, param="model", code="model_not_found")
        return Response(_dumps(completions.model_card()), media_type="application/json")

    return router


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal in OpenAI's error shape."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

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


def build_app(completions: Completions) -> FastAPI:
    """The server's app: the OpenAI routes at /v1, and GET /health with what the backend reports (its load)."""
    app = FastAPI(title="agentrl serve", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.include_router(openai_router(completions), prefix="/v1")

    @app.get("/health")
    async def health_check() -> Response:
        body = {"status": "ok", "model": completions.model_name, **completions.backend.health()}
        return Response(_dumps(body), media_type="application/json")

    return app


async def _json_body(request: Request) -> object:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError(
            f"the request body is not valid JSON ({error}); send a JSON object with Content-Type: application/json",
            code="invalid_json",
        ) from None


def _dumps(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
