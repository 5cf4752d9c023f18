"""The env check a run makes before training: build the configured env once, reset it, check its shape.

A broken env (an unknown id, a typo in its kwargs, a plain Gymnasium env) would otherwise
fail every episode of every step while training runs on to the end. This check turns it
into one message that names the config field and the fix, before any model loads.
`agentrl check-env` is the thorough check; this one only asks whether episodes can start.
"""

from __future__ import annotations

import inspect
import traceback
from pathlib import Path

from agentrl.config import ConfigError
from agentrl.env.check import not_text, spaces_are_text
from agentrl.env.registry import resolve
from agentrl.plugins import did_you_mean


class EnvUnusable(ConfigError):
    """The configured env cannot run a single episode; the message names env.id or env.kwargs and the fix."""


def refuse_unusable_env(world, config, evaluating: bool = False) -> None:
    """Rank 0 builds the env once, before any rank loads a model or writes the run folder; if it is broken,
    every rank raises RefusedOnEveryRank (exit code 2, the reason printed once by rank 0). With `data.train`,
    the rows are checked too, and the env is reset with the first one."""
    from agentrl import transport

    transport.agree_on_root(world, lambda: check_run_inputs(config, evaluating))


def check_run_inputs(config, evaluating: bool = False) -> None:
    """`evaluating`: the run only evaluates (`agentrl eval`), so data.train is not read."""
    if config.agent.enabled:
        check_agent(config, evaluating)
        return
    env = config.env
    evaluates_val = (config.eval.enabled or evaluating) and config.eval.split_of(config.data.val) == "val"
    if not config.data.train or evaluating:
        if not evaluates_val:
            check_env_config(env.id, env.kwargs)
            return
        from agentrl.env.row_checks import check_val_rows

        check_env_config(env.id, env.kwargs, reset=False)
        check_env_config(env.id, env.kwargs, options=check_val_rows(config))
        return
    from agentrl.env.row_checks import check_training_rows

    check_env_config(env.id, env.kwargs, reset=False)
    check_env_config(env.id, env.kwargs, options=check_training_rows(config))


def check_env_config(env_id: str, kwargs: dict, options: dict | None = None, reset: bool = True) -> None:
    """Raise EnvUnusable unless `env_id` builds with `kwargs`, has text spaces and `reset(seed=0, options=options)`
    gives (str, dict); `reset=False` only builds it (an env that needs a dataset row, on a rank without rows)."""
    try:
        constructor = resolve(env_id)
    except (KeyError, ImportError, AttributeError, ValueError) as error:
        raise EnvUnusable(
            f"env.id={env_id!r} names no environment: {_text(error)}. Fix env.id (`agentrl envs` lists the "
            "registered ids; a 'module:Class' path must be importable on every rank)"
        ) from None
    _check_kwargs_fit(env_id, constructor, kwargs)
    try:
        env = constructor(**kwargs)
    except Exception as error:  # env code is user code: whatever it raises becomes the message
        raise EnvUnusable(
            f"env.id={env_id!r} with env.kwargs={kwargs!r} cannot be built: {_raised(error)}"
            f"Fix env.kwargs or the env; `agentrl check-env {env_id}` runs the full check"
        ) from None
    try:
        _check_shape(env_id, env, options, reset)
    finally:
        env.close()


def _check_kwargs_fit(env_id: str, constructor, kwargs: dict) -> None:
    """A keyword the constructor does not take, or a required one missing, named before anything runs."""
    try:
        signature = inspect.signature(constructor)
    except (TypeError, ValueError):  # a builtin or C callable without a readable signature: construction will tell
        return
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        takes = [name for name, p in signature.parameters.items() if p.kind is not p.VAR_POSITIONAL]
        unknown = [name for name in kwargs if name not in signature.parameters]
        hint = did_you_mean(unknown[0], takes) if unknown else ""
        raise EnvUnusable(
            f"env.kwargs={kwargs!r} do not fit env.id={env_id!r}: {error}{hint}. "
            f"It takes: {', '.join(takes) or 'no arguments'}. Fix env.kwargs (the YAML's env.kwargs section or an "
            "env.kwargs.NAME=VALUE override)"
        ) from None


def _check_shape(env_id: str, env, options: dict | None, reset: bool) -> None:
    if not spaces_are_text(env):
        raise EnvUnusable(f"env.id={env_id!r} {not_text(env)}")
    if not reset:
        return
    try:
        first = env.reset(seed=0) if options is None else env.reset(seed=0, options=options)
    except Exception as error:  # env code is user code
        called = "reset(seed=0)" if options is None else "reset(seed=0, options=<the first row of data.train>)"
        raise EnvUnusable(
            f"env.id={env_id!r}: {called} raised {_raised(error)}"
            f"Fix the env; `agentrl check-env {env_id}` runs the full check"
        ) from None
    if not (isinstance(first, tuple) and len(first) == 2 and isinstance(first[0], str) and isinstance(first[1], dict)):
        raise EnvUnusable(
            f"env.id={env_id!r}: reset() must return (observation: str, info: dict), got {first!r:.120}; "
            f"fix the env (`agentrl check-env {env_id}` runs the full check)"
        )


def _text(error: BaseException) -> str:
    return str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)


def _raised(error: BaseException) -> str:
    """`Type: message` and where in the env's code it was raised (the last frames), ending in a newline."""
    ours = error.__traceback__
    where = "".join(traceback.format_tb(ours.tb_next or ours, limit=-2))
    return f"{type(error).__name__}: {_text(error)}\n{where}"


def check_agent(config, evaluating: bool = False) -> None:
    """An agent program instead of an env: its command must exist, and the task rows must read."""
    import shutil

    from agentrl.gateway.agent_process import command_argv

    if config.agent.command is not None:
        program = command_argv(config.agent.command)[0]
        where = Path(config.agent.cwd or ".") / program
        if shutil.which(program) is None and not where.is_file():
            raise EnvUnusable(
                f"agent.command starts {program!r}, which is neither on PATH nor a file in {where.parent}; "
                "name the program with its path, e.g. agent.command='python examples/openai_agent/agent.py'"
            )
    from agentrl.data.loading import load_rows
    from agentrl.env.row_checks import check_rows

    if config.data.train and not evaluating:
        rows = load_rows(config.data.train, "data.train")
        check_rows(rows, config.data.train, None, "agent", config.rollout.tasks_per_step)
    if (config.eval.enabled or evaluating) and config.eval.split_of(config.data.val) == "val":
        check_rows(load_rows(config.data.val, "data.val"), config.data.val, None, "agent", 1, "data.val")


def agree_on_chat_format(world, config) -> None:
    """Rank 0 loads the model folder's chat format (`check_chat_format`); every rank then holds its family in
    chat.format (env ranks parse tool calls with it without loading a tokenizer), or refuses alike."""
    from agentrl import transport

    config.chat.format = transport.agree_on_root(world, lambda: check_chat_format(config))


def check_chat_format(config, say=print) -> str:
    """The model folder's chat format, loaded and probed before any rank trains: its family's name (chat.format, or
    the one detected), said in one line with what the probe found. A folder without a chat template, a template
    that raises, a family that cannot be detected or a name that does not resolve: a one-line ChatFormatUnusable."""
    from agentrl.chat.codec import ChatCodec
    from agentrl.chat.detect import detect_family, model_type_of
    from agentrl.chat.errors import ChatTemplateError
    from agentrl.chat.family import ModelSignals
    from agentrl.chat.registry import resolve
    from agentrl.models.loading import load_tokenizer

    path, named = config.model.path, config.chat.format
    folder = Path(path)
    try:
        tokenizer = load_tokenizer(path)
        model_type = model_type_of(folder) if folder.is_dir() else None
        name = named or detect_family(ModelSignals.of(tokenizer, model_type))
        codec = ChatCodec(tokenizer, resolve(name)(), config.chat.template_kwargs)
        probe = codec.probe()
    except (ChatTemplateError, ValueError, KeyError, ImportError, AttributeError, TypeError) as error:
        where = f"chat.format={named}" if named else f"model.path={path}"
        raise ChatFormatUnusable(f"{where}: {_text(error)}") from None
    if probe.renders_tools:  # a template that ignores tools= gets them as agentrl's own system text
        refuse_unrendered_tools(codec, config)
    checks = (("tool results", probe.append_only_after_tool), ("a user message", probe.append_only_after_user))
    rewrites = [kind for kind, kept in checks if not kept]
    kept = (
        "is append-only"
        if not rewrites
        else f"rewrites the history after {' and '.join(rewrites)} (chat.rewritten={config.chat.rewritten})"
    )
    tools = "to the template" if probe.renders_tools else "in the system message (the template ignores tools=)"
    say(
        f"agentrl: chat format {name} ({'chat.format' if named else 'detected'}; {codec.family.summary}); the template "
        f"{kept}; an env's tools go {tools}",
        flush=True,
    )
    return name


def refuse_unrendered_tools(codec, config) -> None:
    """The env's tools, as an episode offers them, rendered through the chat template once before any rank trains:
    a tool schema the template raises on or leaves out is a one-line ChatFormatUnusable naming the tool, the family
    and the fix (else every episode would fail on it, or the model would never see the tool)."""
    from agentrl.chat.tool_schemas import unrendered_tool

    tools = env_tools(config)
    found = unrendered_tool(codec, tools) if tools else None
    if found is None:
        return
    raise ChatFormatUnusable(
        f"env.id={config.env.id!r}: tool {found.name!r} cannot go into the prompt: {found.problem}. Change that "
        f"tool's JSON schema to one the {codec.family.name} template renders (its parameters' types, names, "
        "descriptions), or set model.path to a model whose chat template renders it"
    )


def env_tools(config) -> list[dict]:
    """The tools the configured env offers an episode: its `tools` after a reset with the first row of data.train
    (else data.val, else no options), as the env host reads them; none for an agent program, whose tools come
    with each request (the gateway renders them per request)."""
    if config.agent.enabled:
        return []
    from agentrl.data.loading import load_rows
    from agentrl.env.registry import make

    spec, field = (config.data.train, "data.train") if config.data.train else (config.data.val, "data.val")
    options = load_rows(spec, field)[0] if spec else None
    env = make(config.env.id, **config.env.kwargs)
    try:
        env.reset(seed=0) if options is None else env.reset(seed=0, options=options)
        return list(getattr(env, "tools", None) or [])
    finally:
        env.close()


class ChatFormatUnusable(ConfigError):
    """The model's chat format cannot be loaded; the message names chat.format or model.path and the fix."""
