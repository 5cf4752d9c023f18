"""`env.id: openenv:...`: an OpenEnv environment (openenv-core's `Environment` API) as an agentrl TextEnv.

    env.id: openenv:my_pkg.server.env:MyEnvironment    # in this process, no server, no Docker
    env.id: openenv:http://127.0.0.1:8000              # a running OpenEnv server (its WebSocket session API)

In-process, the Environment class is built for each episode (`env.kwargs.env_kwargs` are its constructor's
arguments) and reset with the episode's seed: an Environment whose `reset` takes no seed gets Python's `random`
seeded with it first, so that the episodes of a group see one task. A server is reached through openenv-core's
GenericEnvClient, one WebSocket session per episode, and reset with `seed`.

The model's turn becomes the action: for an action with one required text field (EchoAction's `message`,
DIPGAction's `llm_response`) the turn is that field; otherwise the turn must be the action as a JSON object, and a
turn that is not comes back as an `invalid action` observation (counted in info["invalid_actions"]). An
observation's fields other than done/reward/metadata become the text: the one text field alone, or `name: value`
lines.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import random
import typing
from typing import Any

from agentrl.env.api import TextEnv

INSTALL = "pip install 'agentrl[openenv]'"
OBSERVATION_BASE_FIELDS = ("done", "reward", "metadata")


def make(name: str, **kwargs) -> OpenEnvEnv:
    """The adapter behind the `openenv` prefix (the `agentrl.env_adapters` entry point)."""
    return OpenEnvEnv(name, **kwargs)


def openenv_core():
    try:
        import openenv.core as core
    except ImportError:
        raise ImportError(f"env ids openenv:... need the openenv-core package: {INSTALL}") from None
    return core


class OpenEnvEnv(TextEnv):
    """An OpenEnv environment, in this process (`module:Class`) or behind a server (`http://...`).

    Args:
        name: `module:Class` of an openenv Environment subclass, or the URL of an OpenEnv server
        env_kwargs: the Environment's constructor arguments (in-process only)
        action_field: the action's field that takes the model's turn (default: its one required text field)
        truncate_after: steps after which an episode is cut off (truncated, not failed): for environments that never
            end by design, like openenv init's echo template; None: the environment ends its episodes
        max_steps: steps after which an episode the environment never ends fails, naming the env
        success_reward: the last step's reward at or above which a finished episode counts as a success
    """

    def __init__(
        self,
        name: str,
        env_kwargs: dict | None = None,
        action_field: str | None = None,
        truncate_after: int | None = None,
        max_steps: int = 32,
        success_reward: float = 1e-9,
    ) -> None:
        super().__init__()
        openenv_core()
        if max_steps < 1:
            raise ValueError(f"env.kwargs.max_steps={max_steps} must be at least 1")
        if truncate_after is not None and not 1 <= truncate_after <= max_steps:
            raise ValueError(f"env.kwargs.truncate_after={truncate_after} must be between 1 and max_steps={max_steps}")
        self.truncate_after = truncate_after
        self.name, self.max_steps, self.success_reward = name, max_steps, success_reward
        self.remote = name.startswith(("http://", "https://", "ws://", "wss://"))
        self.env_kwargs = dict(env_kwargs or {})
        if self.remote:
            if self.env_kwargs:
                raise ValueError("env.kwargs.env_kwargs builds an in-process Environment; a server builds its own")
            self.environment_class = None
            self.action_schema = _server_action_schema(name)
        else:
            self.environment_class = _environment_class(name)
            self.action_schema = _action_class(self.environment_class).model_json_schema()
        self.action_field = action_field or _text_field(self.action_schema)
        self.client = None
        self.environment = None
        self.steps = 0
        self.done = True

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.close()
        if self.remote:
            from openenv.core.generic_client import GenericEnvClient

            self.client = GenericEnvClient(base_url=self.name).sync()
            try:
                self.client.connect()
                result = self.client.reset(seed=seed)
            except Exception as error:  # the server's refusal arrives as a closed WebSocket
                raise RuntimeError(
                    f"openenv:{self.name} refused a session: {type(error).__name__}: {error}. Episodes run at once "
                    "open a session each: start the server with max_concurrent_envs at least rollout.tasks_per_step "
                    "x rollout.group_size (an Environment with SUPPORTS_CONCURRENT_SESSIONS)"
                ) from None
            observation, reward, done = result.observation, result.reward, result.done
        else:
            takes_seed = "seed" in inspect.signature(self.environment_class.reset).parameters
            if not takes_seed:
                random.seed(seed)  # an Environment that draws its task from Python's random, as DIPG does
            self.environment = self.environment_class(**self.env_kwargs)
            first = self.environment.reset(seed=seed) if takes_seed else self.environment.reset()
            observation, reward, done = _observation_parts(first, self.name, "reset()")
        self.steps, self.done, self.invalid = 0, bool(done), 0
        if self.done:
            raise ValueError(f"openenv:{self.name} reset() returned an observation that is already done")
        return _observation_text(observation, self.name, "reset()"), {"openenv_reward": reward}

    def step(self, action: str):
        if self.done or (self.client is None and self.environment is None):
            raise RuntimeError(f"openenv:{self.name}: the episode has ended (or never started); call reset()")
        self.steps += 1
        payload = self._action_payload(action)
        if payload is None:
            self.invalid += 1
            text, reward, done = f"invalid action: send the action as a JSON object: {self.action_schema}", 0.0, False
        elif self.remote:
            result = self.client.step(payload)
            text = _observation_text(result.observation, self.name, "step()")
            reward, done = result.reward, result.done
        else:
            observation, reward, done = _observation_parts(
                self.environment.step(_action_class(self.environment_class)(**payload)), self.name, "step()"
            )
            text = _observation_text(observation, self.name, "step()")
        reward = _finite(reward, self.name)
        terminated = bool(done)
        truncated = not terminated and self.steps == self.truncate_after
        if not (terminated or truncated) and self.steps >= self.max_steps:
            raise RuntimeError(
                f"openenv:{self.name} did not end its episode within env.kwargs.max_steps={self.max_steps} steps "
                "(set env.kwargs.truncate_after to cut off an environment that never ends by design)"
            )
        self.done = terminated or truncated
        info: dict[str, Any] = {"invalid_actions": self.invalid}
        if self.done:
            info["success"] = terminated and reward >= self.success_reward
        return text, reward, terminated, truncated, info

    def _action_payload(self, action: str) -> dict | None:
        if self.action_field is not None:
            return {self.action_field: action}
        try:
            payload = json.loads(action)
        except ValueError:
            return None
        return payload if isinstance(payload, dict) else None

    def close(self):
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.environment is not None:
            closer = getattr(self.environment, "close", None)
            if callable(closer):
                closer()
            self.environment = None


def _environment_class(name: str):
    module_name, sep, class_name = name.partition(":")
    if not sep:
        raise ValueError(
            f"openenv:{name} names no environment: write openenv:module:Class (an openenv Environment subclass, "
            "run in this process) or openenv:http://HOST:PORT (a running OpenEnv server)"
        )
    environment_class = getattr(importlib.import_module(module_name), class_name)
    from openenv.core.env_server.interfaces import Environment

    if not (isinstance(environment_class, type) and issubclass(environment_class, Environment)):
        raise ValueError(f"openenv:{name} is not a subclass of openenv.core.env_server.interfaces.Environment")
    return environment_class


def _action_class(environment_class):
    """The Action model `step` takes, from its type hint."""
    from openenv.core.env_server.types import Action

    hints = typing.get_type_hints(environment_class.step)
    action = hints.get("action")
    if not (isinstance(action, type) and issubclass(action, Action)):
        raise ValueError(
            f"{environment_class.__name__}.step has no Action subclass as the type hint of its `action` argument"
        )
    return action


def _server_action_schema(url: str) -> dict:
    import httpx

    base = url.replace("ws://", "http://").replace("wss://", "https://").rstrip("/")
    response = httpx.get(f"{base}/schema", timeout=30)
    response.raise_for_status()
    schema = response.json().get("action")
    if not isinstance(schema, dict):
        raise ValueError(f"openenv:{url}/schema has no action schema")
    return schema


def _text_field(schema: dict) -> str | None:
    """The action's one required string field, or None (then the model writes the action as JSON)."""
    properties = schema.get("properties", {})
    required = [name for name in schema.get("required", []) if name != "metadata"]
    if len(required) == 1 and properties.get(required[0], {}).get("type") == "string":
        return required[0]
    return None


def _observation_parts(observation, name: str, call: str) -> tuple[dict, Any, Any]:
    from openenv.core.env_server.types import Observation

    if not isinstance(observation, Observation):
        raise ValueError(f"openenv:{name} {call} returned {observation!r:.200}, not an openenv Observation")
    return observation.model_dump(), observation.reward, observation.done


def _observation_text(observation: dict, name: str, call: str) -> str:
    if not isinstance(observation, dict):
        raise ValueError(f"openenv:{name} {call} returned observation {observation!r:.200}, not a mapping of fields")
    fields = {key: value for key, value in observation.items() if key not in OBSERVATION_BASE_FIELDS}
    texts = [value for value in fields.values() if isinstance(value, str)]
    if len(texts) == 1 and all(isinstance(v, str) or not v for v in fields.values()):
        return texts[0]
    return "\n".join(f"{key}: {value}" for key, value in fields.items() if value not in ("", None, [], {}))


def _finite(reward, name: str) -> float:
    if reward is None:
        return 0.0
    if isinstance(reward, bool):
        return float(reward)
    if not isinstance(reward, int | float) or not math.isfinite(reward):
        raise ValueError(f"openenv:{name} returned reward {reward!r}, not a finite number")
    return float(reward)
