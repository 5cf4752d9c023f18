"""The OpenAI wire format agentrl serve speaks: request and response models, and the error shape."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """A request the server refuses: becomes `{"error": {message, type, param, code}}` with `status`."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = message, status, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Request(BaseModel):
    """Fields the OpenAI clients send that agentrl does not use are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")


class FunctionCall(_Request):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallItem(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
        return role


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_Request):
    """What both endpoints sample with; bounds as OpenAI documents them."""

    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever comes (benchmarks)

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    def stop_strings(self) -> tuple[str, ...]:
        return tuple(self.stop or ())

    def unsupported(self) -> list[str]:
        """Options set to something agentrl's engines cannot do."""
        return [
            name for name in ("frequency_penalty", "presence_penalty") if getattr(self, name) not in (None, 0, 0.0)
        ] + (["logit_bias"] if self.logit_bias else [])


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    max_tokens: int | None = Field(16, ge=1)  # the completions API's own default

    def token_limit(self) -> int | None:
        return self.max_tokens


# ---- responses: plain dicts built by completions.py, shaped as below -------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def parse(model: type[BaseModel], payload: object) -> BaseModel:
    """`payload` (decoded JSON) as `model`, or an APIError naming the first bad field and what it takes."""
    from pydantic import ValidationError

    if not isinstance(payload, dict):
        raise APIError(f"the request body must be a JSON object, got {type(payload).__name__}")
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        got = f" (got {first['input']!r:.80})" if first["type"] != "missing" else ""
        message = f"{param}: {first['msg']}{got}" if param else first["msg"]
        if first["type"] == "missing":
            message = f"{param} is required; add it to the request"
        return _raise(APIError(message, param=param, code="invalid_value"))


def _raise(error: APIError):
    raise error
