"""The OpenAI wire format agentrl serve speaks: request and response models, and the error shape."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICES = ("none", "auto", "required")
JSON_MEDIA_TYPES = ("application/json",)  # and any application/*+json
MAX_CHOICES = 128  # completions one call may ask for: n x its prompts
# Seeds as OpenAI takes them (int64); each choice j of a call samples with seed + j.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


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
    # An assistant message's reasoning, as replies carry it (vLLM's field; `reasoning` is read the same)
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
        return role

    @field_validator("content")
    @classmethod
    def _text_parts(cls, content):
        """Text parts only: an image, audio or file part would be dropped unseen, so it is refused."""
        for index, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type", "text")
            if kind != "text":
                raise ValueError(
                    f"{kind!r} content parts are not supported: this server serves text models; "
                    'send the content as a string or as {"type": "text", "text": ...} parts'
                )
            if not isinstance(part.get("text"), str):
                raise ValueError(
                    f"part {index} is a text part whose `text` is {part.get('text')!r:.40}, not a string; "
                    'send {"type": "text", "text": "..."}'
                )
        return content

    @model_validator(mode="after")
    def _content_given(self):
        """OpenAI lets only an assistant message that calls tools leave its content null (or out); a reply that
        only reasoned (cut by the token limit) comes back so too."""
        if self.content is None and not (self.role == "assistant" and (self.tool_calls or self.reasoning_text())):
            raise ValueError(
                f"a {self.role} message needs content (a string or text parts), not null; only an assistant "
                "message with tool_calls or reasoning_content may leave it null"
            )
        return self

    def reasoning_text(self) -> str:
        """An assistant message's reasoning (`reasoning_content`, or `reasoning`), "" where it has none."""
        return self.reasoning_content or self.reasoning or ""

    def text(self) -> str:
        """The message's text: its content string, or its text parts joined."""
        if isinstance(self.content, list):
            return "".join(part["text"] for part in self.content if part.get("type", "text") == "text")
        return self.content or ""


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
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
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


class JSONSchemaFormat(_Request):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # absent: any JSON object
    strict: bool | None = None  # the output follows the schema either way (constrained decoding)


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError(
                'type json_schema needs "json_schema": {"name": ..., "schema": {...}}; for any JSON object use '
                '{"type": "json_object"}'
            )
        return self


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None  # absent: auto with tools, none without
    parallel_tool_calls: bool = True  # false: a reply holds at most one tool call
    response_format: ResponseFormat | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_shape(cls, choice):
        named = (
            isinstance(choice, dict)
            and choice.get("type") == "function"
            and isinstance(choice.get("function"), dict)
            and isinstance(choice["function"].get("name"), str)
        )
        if choice is None or choice in TOOL_CHOICES or named:
            return choice
        raise ValueError(
            'tool_choice takes "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
        )

    @field_validator("tools")
    @classmethod
    def _function_tools(cls, tools):
        for index, tool in enumerate(tools or ()):
            function = tool.get("function", tool)
            problem = _tool_problem(tool, function)
            if problem:
                raise ValueError(
                    f"tool {index} {problem}; send "
                    '{"type": "function", "function": {"name": "...", "description": "...", "parameters": {...}}}'
                )
        return tools

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def tool_choice_name(self) -> str | None:
        """The function a named tool_choice forces, or None."""
        return self.tool_choice["function"]["name"] if isinstance(self.tool_choice, dict) else None

    def tools_offered(self) -> bool:
        """The model sees the tools and its calls are parsed: tools given and tool_choice not none."""
        return bool(self.tools) and self.tool_choice != "none"


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


def check_content_type(header: str | None) -> None:
    """A body declared as anything but JSON is refused (415), not parsed as JSON regardless; no header is JSON."""
    if not header:
        return
    media_type = header.split(";", 1)[0].strip().lower()
    if media_type in JSON_MEDIA_TYPES or (media_type.startswith("application/") and media_type.endswith("+json")):
        return
    raise APIError(
        f"Content-Type: {header} is not supported; send the JSON body with Content-Type: application/json "
        "(curl: -H 'Content-Type: application/json')",
        status=415,
        param="Content-Type",
        code="unsupported_media_type",
    )


def _tool_problem(tool: dict, function: object) -> str | None:
    """What is wrong with one tool spec (None: a function tool the renderers can list)."""
    if tool.get("type", "function") != "function":
        return f"has type {tool.get('type')!r:.40}; only function tools are supported"
    if not isinstance(function, dict):
        return "has a `function` that is not an object"
    if not isinstance(function.get("name"), str) or not function["name"]:
        return "has no function name"
    if not isinstance(function.get("description", ""), str):
        return "has a description that is not a string"
    if not isinstance(function.get("parameters", {}), dict):
        return "has parameters that are not a JSON schema object"
    return None
