"""The gateway's open sessions: one per episode, each with its own id, key, recorded calls and reward.

A session's key opens that session only. An unknown session is 404; a key that is no session's is 401;
another session's key is 403. A long-lived agent service claims sessions the rollout rank offers
(`offer` / `claim`) with the gateway's service key.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from dataclasses import dataclass, field


class SessionError(Exception):
    """A request the session table refuses: its HTTP status and an OpenAI-style message."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


@dataclass
class Session:
    id: str
    key: str
    task: dict
    base_url: str
    calls: list = field(default_factory=list)  # CallRecords, in the order their choices finished
    reward: float | None = None  # posted by the agent to /sessions/{id}/reward
    success: bool | None = None
    turn_rewards: dict = field(default_factory=dict)  # call index (0 first) -> the rewards posted for it, summed
    refused: str | None = None  # why its episode fails whatever the agent does next: a reward the gateway refused
    claimed: asyncio.Event = field(default_factory=asyncio.Event)  # a service took it (POST /sessions/claim)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # the agent (service) said it is done
    stitcher: object = None  # the gateway's PromptStitcher of this session, made at its first call
    sampling: object = None  # the episode's SamplingParams: every call samples with them
    # Several policies (a multi-policy gateway): each policy's stitcher and SamplingParams, the outcome rewards and
    # successes posted for one policy ({"reward": x, "policy": NAME}), and the model names no policy has, as asked.
    policy_stitchers: dict = field(default_factory=dict)
    policy_sampling: dict = field(default_factory=dict)
    policy_rewards: dict = field(default_factory=dict)
    policy_success: dict = field(default_factory=dict)
    unknown_models: list = field(default_factory=list)

    def record(self, call) -> None:
        self.calls.append(call)

    def claim_payload(self) -> dict:
        return {"session_id": self.id, "base_url": self.base_url, "api_key": self.key, "task": self.task}


class SessionTable:
    def __init__(self, base_url: str, service_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.service_key = service_key or secrets.token_urlsafe(24)
        self.sessions: dict[str, Session] = {}
        self._by_key: dict[str, str] = {}
        self._offered: asyncio.Queue[Session | None] | None = None
        self.opened = 0
        self.claiming = 0  # services' claims waiting for a session

    def open(self, task: dict) -> Session:
        session_id = secrets.token_hex(8)
        session = Session(
            id=session_id,
            key=secrets.token_urlsafe(24),
            task=task,
            base_url=f"{self.base_url}/sessions/{session_id}/v1",
        )
        self.sessions[session.id] = session
        self._by_key[session.key] = session.id
        self.opened += 1
        return session

    def close(self, session: Session) -> None:
        """The episode is over: later calls with its key get 404."""
        self.sessions.pop(session.id, None)
        self._by_key.pop(session.key, None)

    def get(self, session_id: str, authorization: str | None) -> Session:
        key = bearer(authorization)
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError(404, f"no open session {session_id!r} (it ended, or never existed)", "session_not_found")
        if key is None:
            raise SessionError(401, "missing API key: send 'Authorization: Bearer <the session's key>'", "missing_key")
        if hmac.compare_digest(key, session.key):
            return session
        if key in self._by_key:
            raise SessionError(403, f"this key belongs to another session, not {session_id!r}", "wrong_session")
        raise SessionError(401, "invalid API key for this session", "invalid_api_key")

    def check_service(self, authorization: str | None) -> None:
        key = bearer(authorization)
        if key is None or not hmac.compare_digest(key, self.service_key):
            raise SessionError(401, "claiming sessions needs the gateway's service key as the Bearer token", "bad_key")

    # ---- a long-lived agent service ---------------------------------------------------------------------

    @property
    def offered(self) -> asyncio.Queue[Session]:
        if self._offered is None:  # made on the loop that serves it
            self._offered = asyncio.Queue()
        return self._offered

    def offer(self, session: Session) -> None:
        self.offered.put_nowait(session)

    async def claim(self, wait_s: float) -> Session | None:
        """The next offered session still open, or None after `wait_s` seconds without one (or at shutdown)."""
        deadline = asyncio.get_running_loop().time() + wait_s
        self.claiming += 1
        try:
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    return None
                try:
                    session = await asyncio.wait_for(self.offered.get(), left)
                except asyncio.TimeoutError:
                    return None
                if session is None:
                    return None
                if session.id in self.sessions:
                    session.claimed.set()
                    return session
        finally:
            self.claiming -= 1

    def release_claims(self) -> None:
        """Answer every waiting claim at once (empty): the gateway is stopping."""
        for _ in range(self.claiming):
            self.offered.put_nowait(None)


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
