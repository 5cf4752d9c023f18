"""verifiers environments through the training gateway: a verifiers (v1) taskset and its Env run as an agent program,
one per episode, with the model client pointed at the episode's session, and the rubric's reward as the episode's.

    env: {id: verifiers:TASKSET}       # the config turns this into the agent program below (docs/ecosystems.md)
    agent:                             # or say it yourself:
      command: python -m agentrl.env.adapters.verifiers TASKSET --taskset '{num_tasks: 50}' --harness null

TASKSET is a verifiers taskset id: an installed package exporting its `vf.Taskset` subclass in `__all__` (a Hub
environment once installed, or your own). The episode's task is the taskset's task number `seed` modulo its size (a
task row's `task_index` wins). verifiers runs its harness program (the `null` chat loop by default) in a subprocess
runtime; that program's model calls reach verifiers' interception server, which relays them to the gateway session,
so the trainer gets every call's exact tokens. The last stdout line is `{"reward": ..., "success": ...}`; an episode
verifiers records as failed (errors, a timeout, a failed trace) exits 1 with verifiers' reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import yaml

INSTALL = "pip install 'agentrl[verifiers]'"
DEFAULT_HARNESS = "null"  # verifiers' plain chat loop (no code execution)


def make(name: str, **kwargs):
    """The `verifiers` prefix of the env registry: there is no TextEnv to make, and this says where to go."""
    raise ValueError(
        f"verifiers:{name} is not an agentrl TextEnv: verifiers environments drive their own OpenAI client, so they "
        f"run through the training gateway. Set env.id: verifiers:{name} in a config (agentrl train and agentrl eval "
        f"run it as an agent program); `agentrl check-env verifiers:{name}` checks it"
    )


def verifiers_module():
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise ImportError(f"verifiers environments need the verifiers package (0.4 or later): {INSTALL}") from None
    return vf


def agent_command(env_id: str, kwargs: dict, model_name: str = "policy") -> list[str]:
    """The agent program that runs `verifiers:TASKSET` episodes, with env.kwargs `taskset` (the taskset config's
    fields), `harness` (a verifiers harness id, default null) and `success_reward` passed on."""
    import importlib.util

    _, _, taskset = env_id.partition(":")
    if importlib.util.find_spec("verifiers") is None:
        raise ValueError(f"env.id={env_id} needs the verifiers package (0.4 or later): {INSTALL}")
    if not taskset:
        raise ValueError("env.id=verifiers: names no taskset; write env.id=verifiers:TASKSET (an installed taskset id)")
    unknown = sorted(set(kwargs) - {"taskset", "harness", "success_reward"})
    if unknown:
        raise ValueError(
            f"env.kwargs {unknown} are not options of verifiers:{taskset}; it takes taskset, harness, success_reward"
        )
    command = [sys.executable, "-m", "agentrl.env.adapters.verifiers", taskset, "--model", model_name]
    if kwargs.get("taskset"):
        command += ["--taskset", json.dumps(kwargs["taskset"])]
    command += ["--harness", str(kwargs.get("harness", DEFAULT_HARNESS))]
    if "success_reward" in kwargs:
        command += ["--success-reward", str(kwargs["success_reward"])]
    return command


def load_env(taskset_id: str, taskset_fields: dict, harness: str, base_url: str, api_key_variable: str):
    """verifiers' Env for the taskset, its one agent seat on `harness` in a local subprocess runtime, the model
    client at `base_url` with its key in the environment variable `api_key_variable`."""
    vf = verifiers_module()
    from verifiers.v1.utils.loaders import env_config_type, harness_config_type

    agent = vf.AgentConfig(
        runtime=vf.SubprocessConfig(),
        harness=harness_config_type(harness).model_validate({"id": harness}),
        client=vf.EvalClientConfig(base_url=base_url, api_key_var=api_key_variable),
    )
    config_type = env_config_type(taskset_id)
    fields = {"taskset": {"id": taskset_id, **taskset_fields}}
    roles = [name for name, field in config_type.model_fields.items() if isinstance(field.default, vf.AgentConfig)]
    fields.update(dict.fromkeys(roles, agent))
    return vf.load_environment(config_type.model_validate(fields))


def pick_task(env, row: dict):
    """The row's task: number `task_index` (else `seed`) of the taskset, modulo its size."""
    index = row.get("task_index", row.get("seed", 0))
    if not isinstance(index, int):
        raise ValueError(f"the task row's task_index/seed must be an integer, got {index!r}")
    taskset = env.taskset
    if taskset.bounded:
        tasks = list(taskset)
        if not tasks:
            raise ValueError(f"verifiers taskset {env.config.taskset.id!r} has no tasks")
        return tasks[index % len(tasks)]
    for position, task in enumerate(taskset):  # an infinite taskset: its task number `index`
        if position == index:
            return task
    raise ValueError(f"verifiers taskset {env.config.taskset.id!r} ended before task {index}")


async def run_episode(env, task, model: str, base_url: str, api_key_variable: str):
    vf = verifiers_module()
    context = vf.ModelContext(model=model, client=vf.EvalClientConfig(base_url=base_url, api_key_var=api_key_variable))
    async with env.serving():
        return await env.run_episode(task, context)


def episode_outcome(episode, success_reward: float) -> tuple[float | None, bool, str | None]:
    """(reward, success, why it failed or None): the mean of its traces' rubric rewards."""
    if episode.errors or not episode.ok:
        reasons = [f"{error.type}: {error.message}" for error in episode.errors]
        for trace in episode.traces:
            reasons += [f"{error.type}: {error.message}" for error in getattr(trace, "errors", [])]
        return None, False, "; ".join(reasons) or "verifiers recorded the episode as not ok"
    rewards = [trace.reward for trace in episode.traces]
    reward = sum(rewards) / len(rewards)
    return reward, reward >= success_reward, None


def taskset_texts(env_id: str, kwargs: dict, tasks: int = 64) -> list[str]:
    """The text of the taskset's first tasks (prompts, system prompts, scripted turns): a tiny tokenizer's corpus
    (model.tiny), as agentrl builds it from an env's observations."""
    from itertools import islice

    env = load_env(
        env_id.partition(":")[2], kwargs.get("taskset") or {}, str(kwargs.get("harness", DEFAULT_HARNESS)), "", ""
    )
    texts: list[str] = []
    for task in islice(iter(env.taskset), tasks):
        _strings(task.data.model_dump(), texts)
    return texts


def _strings(value, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)
    elif isinstance(value, list | tuple):
        for item in value:
            _strings(item, out)


def check_taskset(env_id: str, kwargs: dict) -> tuple[list[str], str]:
    """`agentrl check-env verifiers:TASKSET`: (problems, summary). Builds the Env as training would (taskset, its
    Env class, the harness) and its first tasks; the episodes themselves need the model, so `agentrl train` runs
    them (each new kind of failure printed once in full)."""
    from itertools import islice

    taskset = env_id.partition(":")[2]
    try:
        agent_command(env_id, kwargs)
        env = load_env(taskset, kwargs.get("taskset") or {}, str(kwargs.get("harness", DEFAULT_HARNESS)), "", "")
        tasks = list(islice(iter(env.taskset), 3))
    except Exception as error:  # report, do not crash: this is a checker
        return [f"loading verifiers:{taskset}: {type(error).__name__}: {error}"], ""
    if not tasks:
        return [f"verifiers taskset {taskset!r} has no tasks"], ""
    size = f"{len(list(env.taskset))} tasks" if env.taskset.bounded else "an infinite taskset"
    harness = kwargs.get("harness", DEFAULT_HARNESS)
    summary = (
        f"{size}, env {type(env).__name__}, harness {harness}; its episodes run through the gateway as the agent "
        "program `python -m agentrl.env.adapters.verifiers` (agentrl train, agentrl eval)"
    )
    return [], summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("taskset", help="a verifiers taskset id (an installed package exporting a vf.Taskset)")
    parser.add_argument("--taskset", dest="fields", default="{}", help="the taskset config's fields, YAML/JSON")
    parser.add_argument("--harness", default=DEFAULT_HARNESS, help="a verifiers harness id (default: null)")
    parser.add_argument("--model", default="policy", help="the model id the gateway serves (agent.model_name)")
    parser.add_argument("--success-reward", type=float, default=1.0, help="reward at or above which it succeeded")
    args = parser.parse_args(argv)
    row = json.loads(os.environ.get("AGENTRL_TASK") or sys.stdin.read() or "{}")
    base_url, model = os.environ["OPENAI_BASE_URL"], args.model
    fields = yaml.safe_load(args.fields) or {}
    env = load_env(args.taskset, fields, args.harness, base_url, "OPENAI_API_KEY")
    episode = asyncio.run(run_episode(env, pick_task(env, row), model, base_url, "OPENAI_API_KEY"))
    reward, success, failure = episode_outcome(episode, args.success_reward)
    if failure is not None:
        print(f"verifiers:{args.taskset} episode failed: {failure}", file=sys.stderr)
        return 1
    print(json.dumps({"reward": reward, "success": success}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
