"""`agentrl check-env`: does an environment follow the API? Reports problems (FAIL) and warnings (WARN).

Tool envs also get their tool schemas checked, and random actions then include
random tool calls built from those schemas. Warnings do not stop a run but point at a
likely mistake: an env that never reports success, or a plain Gymnasium env.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

import gymnasium as gym

from agentrl.env.host import reusable
from agentrl.env.registry import make, toy_text_plays

RANDOM_ARGUMENTS = {"string": "1 + 2", "integer": 3, "number": 1.5, "boolean": True, "array": [], "object": {}}


@dataclass
class EnvReport:
    problems: list[str] = field(default_factory=list)
    """Ways the env breaks the API; each fails `agentrl check-env`."""
    warnings: list[str] = field(default_factory=list)
    """Likely mistakes that do not break the API."""


def check_env(env_id: str, kwargs: dict, episodes: int = 3, max_steps: int = 50, rows=None) -> list[str]:
    """The problems `inspect_env` finds (warnings left out)."""
    return inspect_env(env_id, kwargs, episodes, max_steps, rows).problems


def reset_env(env, seed: int, rows: list[dict] | None):
    """`env.reset(seed=seed)`, or with dataset rows (an env that serves data.train) a row as options."""
    return env.reset(seed=seed) if not rows else env.reset(seed=seed, options=rows[seed % len(rows)])


def inspect_env(env_id: str, kwargs: dict, episodes: int = 3, max_steps: int = 50, rows=None) -> EnvReport:
    """`rows`: dataset rows passed to reset as options (`agentrl check-env ID --data FILE`)."""
    report = EnvReport()
    try:
        env = make(env_id, **kwargs)
    except Exception as error:  # report, do not crash: this is a checker
        report.problems.append(f"constructing {env_id}: {type(error).__name__}: {error}")
        return report
    if not spaces_are_text(env):
        report.warnings.append(f"{env_id} {not_text(env)}")
    try:
        _check_episodes(env, env_id, kwargs, episodes, max_steps, report, rows)
    finally:  # an env may hold a server's session (openenv:http://...) until it is closed
        report.problems += close_problems(env)
    report.problems = sorted(set(report.problems), key=report.problems.index)
    return report


def close_problems(env) -> list[str]:
    """Close `env`; what its close() raised, as a problem."""
    try:
        env.close()
    except Exception as error:  # report, do not crash: this is a checker
        return [f"close() raised {type(error).__name__}: {error}"]
    return []


def _check_episodes(env, env_id: str, kwargs: dict, episodes: int, max_steps: int, report: EnvReport, rows) -> None:
    problems = report.problems
    tools = getattr(env, "tools", None) or []
    problems += check_tools(tools)
    problems += check_spaces(env)
    try:
        first = reset_env(env, 123, rows)
    except Exception as error:  # report, do not crash: this is a checker
        problems.append(f"reset(seed=123) raised {type(error).__name__}: {error}")
        return
    if not (isinstance(first, tuple) and len(first) == 2 and isinstance(first[0], str) and isinstance(first[1], dict)):
        problems.append(f"reset() must return (str, dict), got {first!r:.80}")
        return
    problems += check_observation(env, first[0], "reset")
    second = make(env_id, **kwargs)
    try:
        again = reset_env(second, 123, rows)
    finally:
        problems += close_problems(second)
    if again[0] != first[0]:
        problems.append("reset(seed=123) twice gave different observations: seed the env via super().reset(seed=seed)")
    rng = random.Random(0)
    reports_success = False
    for episode in range(episodes):
        reset_env(env, episode, rows)
        for _ in range(max_steps):
            try:
                out = env.step(random_action(rng, tools if not problems else []))
            except Exception as error:  # report, do not crash: this is a checker
                problems.append(f"episode {episode}: step() raised {type(error).__name__}: {error}")
                return
            if not (isinstance(out, tuple) and len(out) == 5):
                problems.append(f"step() must return (obs, reward, terminated, truncated, info), got {out!r:.80}")
                return
            obs, reward, terminated, truncated, info = out
            if not isinstance(obs, str):
                problems.append(f"step() observation must be str, got {type(obs).__name__}")
            else:
                problems += check_observation(env, obs, "step")
            if not isinstance(reward, int | float):
                problems.append(f"step() reward must be a number, got {type(reward).__name__}")
            if not isinstance(info, dict):
                problems.append(f"step() info must be a dict, got {type(info).__name__}")
            else:
                reports_success = reports_success or "success" in info
            if terminated or truncated:
                problems += check_step_after_end(env, rng, tools)
                break
        else:
            problems.append(f"episode {episode} did not end within {max_steps} random steps")
    if reusable(env) and not problems:
        problems += check_reuse(env, env_id, kwargs, max_steps, rows)
    if not reports_success:
        report.warnings.append(
            f"no step() info of {episodes} random episodes has a 'success' key, so episode/success_rate will read 0; "
            "set info['success'] = True or False on an episode's last step (or name an env.reward_fn that returns "
            "success)"
        )


def check_reuse(env, env_id: str, kwargs: dict, max_steps: int, rows) -> list[str]:
    """For a class that says `reusable = True`: an episode on `env`, which has played episodes, must go as one on a
    new instance does (same seed, same actions), or reset leaves some state behind."""
    fresh = make(env_id, **kwargs)
    try:
        new, used = _replay(fresh, max_steps, rows), _replay(env, max_steps, rows)
    except Exception as error:  # report, do not crash: this is a checker
        return [f"replaying an episode to check reusable = True raised {type(error).__name__}: {error}"]
    finally:
        close_problems(fresh)
    if new == used:
        return []
    turn = next((i for i, (a, b) in enumerate(zip(new, used, strict=False)) if a != b), min(len(new), len(used)))
    shown = "reset" if turn == 0 else f"step {turn}"
    return [
        f"{type(env).__name__} says reusable = True, but an instance that has played episodes gave another {shown} "
        f"than a new one (same seed and actions): {used[turn] if turn < len(used) else 'no more turns'!r:.120} "
        f"against {new[turn] if turn < len(new) else 'no more turns'!r:.120}; set every piece of episode state in "
        "reset(), or drop reusable = True"
    ]


def _replay(env, max_steps: int, rows) -> list[tuple]:
    """An episode from seed 7 with actions drawn from a fixed seed: what reset and each step returned."""
    rng = random.Random(7)
    obs, info = reset_env(env, 7, rows)
    turns = [(obs, repr(info))]
    for _ in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(random_action(rng, getattr(env, "tools", None) or []))
        turns.append((obs, float(reward), bool(terminated), bool(truncated), repr(info)))
        if terminated or truncated:
            break
    return turns


def check_spaces(env) -> list[str]:
    """observation_space and action_space: Gymnasium spaces that hold text (agentrl.env.api.FreeText does)."""
    problems = []
    for name in ("observation_space", "action_space"):
        space = getattr(env, name, None)
        if not isinstance(space, gym.spaces.Space):
            problems.append(f"env.{name} must be a gymnasium space; subclass agentrl.env.TextEnv, which sets FreeText")
        elif not isinstance(space.sample(), str):
            problems.append(f"env.{name} must be a text space (samples are str), got {space!r}")
    return problems


def spaces_are_text(env) -> bool:
    """False when the env declares a Gymnasium space that does not hold text (a plain Gymnasium env)."""
    spaces = [getattr(env, name, None) for name in ("observation_space", "action_space")]
    return all(not isinstance(space, gym.spaces.Space) or isinstance(space.sample(), str) for space in spaces)


def not_text(env) -> str:
    """Why an env whose spaces are not text cannot run, and what to do instead (the toy_text adapter, if it fits)."""
    spaces = f"observation_space {env.observation_space!r}, action_space {env.action_space!r}"
    game = newest_gymnasium_id(type(env))
    if game is not None and toy_text_plays(game):
        return (
            f"is not a text env ({spaces}); Gymnasium's {game} plays as text through the toy_text adapter: "
            f"env.id=toy_text env.kwargs.game={game} (`agentrl check-env toy_text --kwargs '{{game: {game}}}'`; "
            "docs/environments.md)"
        )
    return (
        f"is not a text env ({spaces}); agentrl envs take and return strings. The toy_text adapter plays "
        "registered Gymnasium games with Discrete observations and actions (env.id=toy_text "
        "env.kwargs.game=GYMNASIUM_ID); otherwise wrap the game in an agentrl.env.TextEnv that describes the state "
        "in words and parses the model's answer (docs/writing-an-environment.md)"
    )


def newest_gymnasium_id(env_class: type) -> str | None:
    """The newest version of the Gymnasium ids registered with `env_class` as their entry point."""
    path = f"{env_class.__module__}:{env_class.__qualname__}"
    ids = [env_id for env_id, spec in gym.registry.items() if spec.entry_point in (path, env_class)]
    return max(ids, key=lambda env_id: gym.registry[env_id].version or 0, default=None)


def check_observation(env, obs: str, where: str) -> list[str]:
    space = getattr(env, "observation_space", None)
    if isinstance(space, gym.spaces.Space) and not space.contains(obs):
        return [
            f"{where}() observation {obs[:40]!r} is not in env.observation_space {space!r} "
            "(gymnasium's Text only holds its charset: use agentrl.env.api.FreeText)"
        ]
    return []


def check_step_after_end(env, rng: random.Random, tools: list[dict]) -> list[str]:
    """After terminated/truncated, step() must raise (asking for reset()) or report the episode as over again."""
    try:
        out = env.step(random_action(rng, tools))
    except Exception:  # the expected answer: an error telling the caller to reset
        return []
    if isinstance(out, tuple) and len(out) == 5 and (out[2] or out[3]):
        return []
    return [
        "step() after the episode ended went on as if the episode were running; "
        "raise RuntimeError('episode is over; call reset()') there (Gymnasium leaves it undefined; agentrl checks it)"
    ]


def check_tools(tools) -> list[str]:
    """Tool specs must be {"type": "function", "function": {name, description, parameters}} with unique names."""
    if not isinstance(tools, list):
        return [f"env.tools must be a list of tool specs, got {type(tools).__name__}"]
    problems, names = [], set()
    for index, spec in enumerate(tools):
        function = spec.get("function") if isinstance(spec, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            problems.append(f'tool {index} must look like {{"type": "function", "function": {{"name": ...}}}}')
            continue
        name = function["name"]
        if name in names:
            problems.append(f"tool name {name!r} is used twice; tool names must be unique")
        names.add(name)
        parameters = function.get("parameters")
        if not (isinstance(parameters, dict) and parameters.get("type") == "object"):
            problems.append(f'tool {name!r}: parameters must be a JSON-schema object {{"type": "object", ...}}')
        elif not isinstance(parameters.get("properties", {}), dict):
            problems.append(f"tool {name!r}: parameters.properties must map argument names to schemas")
        elif any(arg not in parameters.get("properties", {}) for arg in parameters.get("required", [])):
            problems.append(f"tool {name!r}: every name in parameters.required must be in parameters.properties")
    return problems


def random_action(rng: random.Random, tools: list[dict]) -> str:
    """A number (a final answer) or, for tool envs half the time, a tool call with schema-typed arguments."""
    if not tools or rng.random() < 0.5:
        return str(rng.randint(0, 20))
    function = rng.choice(tools)["function"]
    properties = function["parameters"].get("properties", {})
    arguments = {name: RANDOM_ARGUMENTS.get(spec.get("type"), "x") for name, spec in properties.items()}
    return f"<tool_call>{json.dumps({'name': function['name'], 'arguments': arguments})}</tool_call>"


def time_random_episodes(
    env_id: str, kwargs: dict, episodes: int = 5, max_steps: int = 50, rows=None
) -> tuple[int, float]:
    """(steps, seconds) for a few short random episodes, reset and close included."""
    rng = random.Random(1)
    steps, started = 0, time.perf_counter()
    for episode in range(episodes):
        env = make(env_id, **kwargs)
        reset_env(env, episode, rows)
        tools = getattr(env, "tools", None) or []
        for _ in range(max_steps):
            steps += 1
            _, _, terminated, truncated, _ = env.step(random_action(rng, tools))
            if terminated or truncated:
                break
        env.close()
    return steps, time.perf_counter() - started
