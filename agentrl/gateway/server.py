"""The gateway on a rollout rank: the policy under training over HTTP, one session per episode.

    POST /sessions/{id}/v1/chat/completions, /completions; GET /sessions/{id}/v1/models
    POST /sessions/{id}/reward   {"reward": float, "success": bool?, "call": int?}  (the agent's own score; with
                                 "call", the reward of that model call's turn, 0 first, -1 the latest; with
                                 "policy": NAME on a multi-policy gateway, that policy's own reward)
    POST /sessions/{id}/end      {"reward"?, "success"?}  (a service's agent is done)
    POST /sessions/claim         (a long-lived agent service, with the gateway's service key: the next session)
    GET  /health

It runs on the rollout worker's asyncio loop, beside the engine: calls from every session batch in the
same engine. While training, every call samples at the rollout's temperature, top-p and top-k whatever
the agent asks (the trainer's logprobs are at that temperature), and at most rollout.max_new_tokens.
A multi-policy job serves every policy under its name (`model`), each on its own engine (policy_router.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from dataclasses import replace
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from agentrl.config.schema import AgentConfig
from agentrl.errors import UserError
from agentrl.gateway.sessions import Session, SessionError, SessionTable
from agentrl.gateway.stitch import PromptStitcher
from agentrl.gateway.trace import SessionCall
from agentrl.models.chat_format import REWRITTEN

GATEWAY_DIR = "gateway"  # in run_dir: one rollout-N.json per rollout rank while it trains
CLAIM_WAIT_S = 30.0
KEEP_ALIVE_S = 600  # a service's claim waits this long for a session before an empty answer


class Gateway:
    """The policy under training over HTTP on a rollout rank, as `agent` (the config's agent section) describes it:
    its address (`port` overrides agent.port: each rollout rank of a node listens on its own), the served model
    name, whether tools are listed, the body limit; `chat_format`: the config's chat.format (None: the family
    detected from the tokenizer); `rewritten`: chat.rewritten, what a session's request that extends an earlier
    reply the template renders differently gets (agentrl/gateway/stitch.py). With `policies` ({name: (engine,
    tokenizer)}, a multi-policy job) it serves each policy under its name instead (`engine` and `tokenizer` unused):
    a call's `model` picks the policy."""

    def __init__(
        self,
        engine,
        tokenizer,
        max_model_len: int,
        agent: AgentConfig | None = None,
        port: int | None = None,
        chat_format: str | None = None,
        rewritten: str = "keep",
        policies: dict[str, tuple] | None = None,
    ):
        from agentrl.gateway.policy_router import PolicyRouter

        agent = agent or AgentConfig()
        if rewritten not in REWRITTEN:
            raise ValueError(f"chat.rewritten must be one of {', '.join(REWRITTEN)}, got {rewritten!r}")
        self.rewritten = rewritten
        host, port = agent.host, agent.port if port is None else port
        self.host = host
        self.max_body_bytes = agent.max_body_bytes  # larger request bodies get 413
        if policies:
            served = {
                name: _completions(served_engine, served_tokenizer, name, max_model_len, agent.list_tools, chat_format)
                for name, (served_engine, served_tokenizer) in policies.items()
            }
            self.completions = PolicyRouter(served)
        else:
            self.completions = _completions(
                engine, tokenizer, agent.model_name, max_model_len, agent.list_tools, chat_format
            )
        self.socket = _bind(host, port)
        self.port = self.socket.getsockname()[1]
        self.table = SessionTable(f"http://{_url_host(host)}:{self.port}")
        self.server = None
        self.serving: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return self.table.base_url

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve on `loop` (the worker's): requests are answered while the loop runs episodes."""
        # The loop stands still while the rank trains or takes weights; a keep-alive timer that fires as it wakes
        # would close connections a client is reusing that moment, so idle connections are kept long.
        config = uvicorn.Config(
            self.app(),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=1,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self.server = _QuietServer(config)
        self.serving = loop.create_task(self.server.serve(sockets=[self.socket]))

    def announce(self, run_dir: Path, rollout_index: int) -> None:
        """Write run_dir/gateway/rollout-N.json (the URL and the service key, readable by this user only), where a
        long-lived agent service finds the gateways to claim sessions from."""
        folder = run_dir / GATEWAY_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.announced = folder / f"rollout-{rollout_index}.json"
        descriptor = os.open(self.announced, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump({"url": self.url, "service_key": self.table.service_key, "pid": os.getpid()}, file)
        print(f"agentrl: gateway of rollout rank {rollout_index}: {self.url} (sessions announced in {folder})")

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        if getattr(self, "announced", None) is not None:
            self.announced.unlink(missing_ok=True)
        if self.server is None:
            return
        self.table.release_claims()
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.wait_for(self.serving, 5))
        self.socket.close()

    # ---- the HTTP app -----------------------------------------------------------------------------------

    def app(self) -> FastAPI:
        from agentrl.gateway.policy_router import PolicyRouter
        from agentrl.serve.app import install_error_handlers, openai_router
        from agentrl.serve.guard import RequestGuard
        from agentrl.serve.protocol import APIError

        app = FastAPI(title="agentrl gateway", docs_url=None, redoc_url=None, openapi_url=None)
        install_error_handlers(app)
        app.add_middleware(RequestGuard, max_body_bytes=self.max_body_bytes)  # every route, /reward and /end too
        table = self.table

        def session_of(request: Request) -> Session:
            try:
                return table.get(request.path_params["session_id"], request.headers.get("authorization"))
            except SessionError as error:
                raise APIError(error.message, status=error.status, code=error.code) from None

        def hook_for(request: Request):
            session = session_of(request)
            if isinstance(self.completions, PolicyRouter):
                return _PolicyCalls(session, self.completions, self.rewritten)
            if session.stitcher is None:
                session.stitcher = PromptStitcher(self.completions.renderer, self.rewritten)
            return _SessionCalls(session, session.stitcher)

        app.include_router(openai_router(self.completions, hook_for), prefix="/sessions/{session_id}/v1")

        policies = self.completions.names if isinstance(self.completions, PolicyRouter) else None

        @app.post("/sessions/{session_id}/reward")
        async def reward(session_id: str, request: Request) -> Response:
            session = session_of(request)
            _take_reward(await request.body(), session, policies)
            return JSONResponse({"ok": True})

        @app.post("/sessions/{session_id}/end")
        async def end(session_id: str, request: Request) -> Response:
            session = session_of(request)
            body = await request.body()
            try:
                if body.strip():
                    reward, success = _reward_body(body, session, required=False)
                    session.reward = session.reward if reward is None else reward
                    session.success = session.success if success is None else success
            finally:  # a refused reward ends it too: its episode has failed, nothing is left to wait for
                session.ended.set()
            return JSONResponse({"ok": True})

        @app.post("/sessions/claim")
        async def claim(request: Request) -> Response:
            try:
                table.check_service(request.headers.get("authorization"))
            except SessionError as error:
                raise APIError(error.message, status=error.status, code=error.code) from None
            session = await table.claim(CLAIM_WAIT_S)
            return Response(status_code=204) if session is None else JSONResponse(session.claim_payload())

        @app.get("/health")
        async def health() -> Response:
            return JSONResponse({"status": "ok", "open_sessions": len(table.sessions), "opened": table.opened})

        return app


class _SessionCalls:
    """The `on_call` hook of one session's request (and its prompt stitching). The tools it gets are the ones the
    prompt lists (none with the gateway's list_tools false: Completions decides). `policy`: the policy the call
    named, on a multi-policy gateway (its calls are recorded as that policy's)."""

    def __init__(self, session: Session, stitcher: PromptStitcher, policy: str | None = None):
        self.session = session
        self.stitcher = stitcher
        self.policy = policy

    def __call__(self, record) -> None:
        reply = record.reply or {}
        if record.reply is None:  # a completions call: its text
            output = list(record.output_ids)
            renderer = self.stitcher.renderer
            text = renderer.text(output[:-1] if output and output[-1] in renderer.stop_ids else output)
        else:
            text = reply.get("content") or ""
        call = SessionCall(
            prompt_ids=list(record.prompt_ids),
            output_ids=list(record.output_ids),
            logprobs=list(record.logprobs),
            weight_version=record.weight_version,
            finish_reason=record.finish_reason,
            text=text,
            tool_calls=len(reply.get("tool_calls") or []),
            request=record.request,
            reply=record.reply,
            policy=self.policy,
        )
        self.session.record(call)
        self.stitcher.remember(record)

    def prompt_ids(self, messages, tools) -> list[int]:
        return self.stitcher.prompt_ids(messages, tools)

    def sampling_for(self, asked):
        """The episode's sampling (the rollout's, or evaluation's) whatever the agent asks; its token cap too, and
        its output grammar (tool_choice, response_format): the trainer's logprobs are unconstrained anyway."""
        own = self.session.policy_sampling.get(self.policy, self.session.sampling)
        if own is None:
            return asked
        return replace(
            own,
            max_new_tokens=min(asked.max_new_tokens, own.max_new_tokens),
            stop_token_ids=asked.stop_token_ids or own.stop_token_ids,
            grammar=asked.grammar,
        )


class _PolicyCalls:
    """The hook of one session's request on a multi-policy gateway: `for_policy(name)` is the hook of the policy the
    call names (its own prompt stitching and sampling in this session)."""

    def __init__(self, session: Session, router, rewritten: str = "keep"):
        self.session, self.router, self.rewritten = session, router, rewritten

    def for_policy(self, name: str) -> _SessionCalls:
        stitcher = self.session.policy_stitchers.get(name)
        if stitcher is None:
            stitcher = PromptStitcher(self.router.served[name].renderer, self.rewritten)
            self.session.policy_stitchers[name] = stitcher
        return _SessionCalls(self.session, stitcher, name)


def _take_reward(raw: bytes, session: Session, policies: list[str] | None = None) -> None:
    """Apply a /reward body to the session: the episode's reward (and success), or with "call" a reward added to
    that call's turn, or (a multi-policy gateway, `policies` its names) with "policy" that policy's own reward. A
    body it refuses fails the session's episode, as `_reward_body`."""
    from agentrl.serve.protocol import APIError
    from agentrl.trajectory import RewardError, finite_reward

    with _failing_the_session(session):
        reward, success, call = _parse_reward_body(raw, True, len(session.calls))
        policy = _policy_named(raw, call, policies)
        if policy is not None:
            session.policy_rewards[policy] = reward
            if success is not None:
                session.policy_success[policy] = success
            return
        if call is None:
            session.reward, session.success = reward, success
            return
        summed = session.turn_rewards.get(call, 0.0) + reward
        try:
            session.turn_rewards[call] = finite_reward(summed, f"the rewards posted for call {call}, summed,")
        except RewardError as error:
            raise APIError(str(error), param="reward", code="invalid_reward") from None
        session.success = session.success if success is None else success


def _reward_body(raw: bytes, session: Session, required: bool = True) -> tuple[float | None, bool | None]:
    """(reward, success) of an /end body. A body it refuses (400, naming the field and the value) also fails the
    session's episode, so that episode never trains, even if the agent then ends normally."""
    with _failing_the_session(session):
        reward, success, _ = _parse_reward_body(raw, required, None)
        return reward, success


@contextlib.contextmanager
def _failing_the_session(session: Session):
    """A refused reward (an APIError raised inside) fails the session's episode and says so in its message."""
    from agentrl.serve.protocol import APIError

    try:
        yield
    except APIError as refused:
        session.refused = f"the gateway refused the agent's reward: {refused.message}"
        refused.message += "; this session's episode has failed and will not train"
        raise


def _parse_reward_body(raw: bytes, required: bool, calls: int | None) -> tuple[float | None, bool | None, int | None]:
    """(reward, success, call) of a body; `calls`: how many model calls the session has made (None: the body may
    name no call, as /end's)."""
    from agentrl.serve.protocol import APIError
    from agentrl.trajectory import RewardError, finite_reward

    try:
        body = json.loads(raw)
    except ValueError:  # not JSON, not UTF-8, or an int past Python's digit limit
        raise APIError(
            'the body is not JSON; send {"reward": 1.0, "success": true}', param="reward", code="invalid_reward"
        ) from None
    call = _call_index(body.get("call") if isinstance(body, dict) else None, calls)
    reward = body.get("reward") if isinstance(body, dict) else None
    reward_value = None
    if reward is not None or required:
        try:
            reward_value = finite_reward(reward, '"reward"')
        except RewardError as error:
            raise APIError(f'{error}; send {{"reward": 1.0}}', param="reward", code="invalid_reward") from None
    success = body.get("success") if isinstance(body, dict) else None
    if success is not None and not isinstance(success, bool):
        raise APIError(f'"success" must be true or false, got {success!r:.80}', param="success", code="invalid_reward")
    return reward_value, success, call


def _policy_named(raw: bytes, call: int | None, policies: list[str] | None) -> str | None:
    """The policy a /reward body names in "policy" on a multi-policy gateway (None: the reward is the session's, for
    every policy that acted); one it does not serve is refused, naming those it does. A single-policy gateway
    ignores "policy", as it always did."""
    from agentrl.serve.protocol import APIError

    body = json.loads(raw)
    policy = body.get("policy") if isinstance(body, dict) else None
    if policies is None or policy is None:
        return None
    if call is not None:
        raise APIError(
            '"call" and "policy" both name whose reward it is: a call\'s reward goes to the policy that made it; '
            "send one of them",
            param="policy",
            code="invalid_reward",
        )
    if policy not in policies:
        raise APIError(
            f'"policy" is {policy!r:.80}, which this job does not train or serve; name one of {", ".join(policies)}',
            param="policy",
            code="invalid_reward",
        )
    return policy


def _call_index(call, calls: int | None) -> int | None:
    """The session's call a per-turn reward is for, 0 first (a negative index counts back from the latest), or
    None; an index of no call made so far is refused, naming the range."""
    from agentrl.serve.protocol import APIError

    if call is None:
        return None
    if calls is None:
        raise APIError(
            '"call" is for /reward: post each turn\'s reward there ({"reward": 0.5, "call": 0}), then end the session',
            param="call",
            code="invalid_reward",
        )
    if isinstance(call, bool) or not isinstance(call, int):
        raise APIError(
            f'"call" must be an integer, the index of the model call the reward is for, got {call!r:.80}',
            param="call",
            code="invalid_reward",
        )
    if not calls:
        raise APIError(
            f'"call" is {call} but this session has made no model call yet: post a turn\'s reward after its call',
            param="call",
            code="invalid_reward",
        )
    if not -calls <= call < calls:
        raise APIError(
            f'"call" must be the index of one of this session\'s {calls} model calls so far (0..{calls - 1}, or '
            f"-1 for the latest), got {call}",
            param="call",
            code="invalid_reward",
        )
    return call % calls


def _completions(engine, tokenizer, name: str, max_model_len: int, list_tools: bool, chat_format: str | None):
    """One model's OpenAI endpoints, served as `name`; UserError naming the fix where its chat template is unusable."""
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend

    try:
        return Completions(
            LocalBackend(engine, tokenizer),
            tokenizer,
            name,
            max_model_len,
            list_tools=list_tools,  # false: the request's tools are parsed for, not shown to the model
            chat_format=chat_format,
        )
    except KeyError as error:
        if chat_format is None:
            raise
        raise UserError(f"chat.format: {error.args[0]}") from None  # the registry lists the known names
    except (ValueError, ImportError, TypeError) as error:  # ChatTemplateError, UnknownChatFormat, a bad path
        raise UserError(f"the training gateway cannot serve {tokenizer.name_or_path}: {error}") from None


class _QuietServer(uvicorn.Server):
    """uvicorn's server without its signal handlers: SIGTERM and SIGINT stay agentrl's graceful stop."""

    def capture_signals(self):
        return contextlib.nullcontext()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Made with IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets' connections. Without it a reply's body
    # waited for the ACK of its headers, which the client delays by 40 ms: 45 ms a call instead of 1.5 ms.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise OSError(f"agent.port: cannot listen on {host}:{port} ({error}); use port 0 for a free one") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host
