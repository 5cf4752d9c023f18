"""`agentrl serve MODEL [options] [engine key=value ...]`: load a model or a run's checkpoint and serve it over HTTP.

World size 1 serves from this process. Under `mpirun -n N` every rank loads the model; rank 0 runs the HTTP
front and spreads the generations over all N engines (`ranks`). Ctrl-C or SIGTERM (to one rank or to mpirun)
stops the server, lets the calls in flight end, and stops every rank; an error on any rank aborts the job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from dataclasses import dataclass

from agentrl.errors import UserError
from agentrl.run import startup_gc

DEFAULT_ENGINE = {"backend": "torch", "scheduler": "continuous"}
GRACEFUL_SHUTDOWN_S = 10.0
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def add_arguments(p) -> None:
    p.description = (
        "agentrl serve MODEL [--port 8000] [--model-name NAME] [engine key=value ...], e.g. "
        "agentrl serve runs/quickstart scheduler=continuous max_batch_size=64"
    )
    p.add_argument("model", help="RUN_DIR/checkpoints/step_N, a run folder (its newest) or a Hugging Face model folder")
    p.add_argument(
        "overrides",
        nargs="*",
        help="engine options as key=value, rollout.engine's fields: scheduler=continuous|batch max_batch_size=256 "
        "kv_cache_mb=256 cuda_graphs=auto; backend=sglang tp_size=1 mem_fraction_static=0.8 (GPU)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--model-name", help="the model id clients send (default: the folder's name, or RUN-stepN)")
    p.add_argument("--max-model-len", type=int, help="longest prompt + completion (default: the model's positions)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="parameter dtype")
    p.add_argument("--device", help="torch device for the torch engine (default cuda if available, else cpu)")
    p.add_argument("--seed", type=int, default=0, help="the engines' sampling seed (rank r uses seed + r)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (info prints every request)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("AGENTRL_API_KEY") or None,
        help="clients must send 'Authorization: Bearer KEY' (the openai client's api_key) on every route but /health; "
        "default: the AGENTRL_API_KEY environment variable (better than this option: a command line is visible to "
        "every user of the machine); neither: no key",
    )
    p.add_argument(
        "--list-tools",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="put a request's `tools` in the prompt (default); --no-list-tools for a model that learnt the call "
        "format in training (as the gateway's agent.list_tools: false): replies are parsed for tool calls either way",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        help="the largest request body read (default 4 MiB); a larger one gets 413 before it is read",
    )
    p.add_argument(
        "--chat-format",
        help="the model's chat format family (the config's chat.format): hermes, qwen3, llama3, mistral, harmony, "
        "deepseek_v3, deepseek_r1, glm45, a registered one or module:Class; default: detected from the model folder",
    )
    p.add_argument(
        "--peer-timeout-s",
        type=seconds_or_null,
        default=60.0,
        help="over several nodes: stop the job when a node is silent this long (a cut link); null: never",
    )


def seconds_or_null(text: str) -> float | None:
    """An argparse type: positive seconds, or `null` for none (argparse names the function in its error)."""
    if text == "null":
        return None
    seconds = float(text)
    if seconds <= 0:
        raise ValueError(text)
    return seconds


@dataclass(frozen=True)
class Served:
    """What rank 0 decided to serve: the model folder, its training step (the weight version) and name."""

    path: str
    step: int
    name: str
    note: str | None = None


def resolve_model(given: str, name: str | None) -> Served:
    """A run's checkpoint folder, a run folder (its newest checkpoint) or a Hugging Face model folder."""
    from agentrl.trainer.folders import STEP_NAME, model_folder

    path, note = model_folder(given, f"agentrl serve {given}")
    match = STEP_NAME.match(path.name)
    step = int(match.group(1)) if match and path.parent.name == "checkpoints" else 0
    default_name = f"{path.parent.parent.name}-step{step}" if step else path.resolve().name
    return Served(str(path), step, name or default_name, note)


def engine_section(options: list[str]):
    """The engine's config section from `key=value` options (rollout.engine's fields), checked."""
    from pydantic import TypeAdapter, ValidationError

    from agentrl.config.load import parse_override
    from agentrl.config.schema import EngineConfig
    from agentrl.sections import ConfigError, format_validation_error

    values = dict(DEFAULT_ENGINE)
    for option in options:
        if "=" not in option:
            raise UserError(f"engine option {option!r} is not key=value; e.g. scheduler=batch max_batch_size=64")
        path, value = parse_override(option)
        values[".".join(path).removeprefix("rollout.engine.")] = value
    if values.get("backend") == "sglang":
        values = {key: value for key, value in values.items() if key not in DEFAULT_ENGINE or key == "backend"}
    try:
        return TypeAdapter(EngineConfig).validate_python(values)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, "agentrl serve's engine options")) from None


def chat_family(path: str, chat_format: str | None) -> str:
    """The chat format family the model is served with (`chat_format`, else detected from the folder), checked
    before serving: a UserError in one line naming the fix for an unknown name, a folder without a chat template,
    a template that raises, or a model no family recognises."""
    from agentrl.models.loading import load_tokenizer
    from agentrl.serve.render import ChatRenderer

    try:
        return ChatRenderer(load_tokenizer(path), chat_format).family.name
    except KeyError as error:
        if chat_format is None:
            raise
        raise UserError(f"--chat-format: {error.args[0]}") from None  # the registry lists the known names
    except (ValueError, ImportError, TypeError) as error:  # ChatTemplateError, UnknownChatFormat, a bad path
        raise UserError(f"{path}: {error} (agentrl serve: --chat-format NAME)") from None


class _StopSignals:
    """The first SIGINT/SIGTERM asks for a stop; a second SIGINT stops at once (KeyboardInterrupt)."""

    def __init__(self):
        self.received: list[int] = []
        self.on_first = None
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._flag)

    def _flag(self, signum, frame) -> None:
        if signum == signal.SIGINT and signal.SIGINT in self.received:
            raise KeyboardInterrupt
        self.received.append(signum)
        if self.on_first is not None and len(self.received) == 1:
            self.on_first()

    def reason(self) -> str | None:
        return signal.Signals(self.received[0]).name if self.received else None


def main(args) -> int:
    """`agentrl serve`: errors found before serving raise on every rank (the CLI prints them once)."""
    from mpi4py import MPI

    from agentrl import transport
    from agentrl.transport import Failed, run_entry_point

    world = MPI.COMM_WORLD
    section = engine_section(args.overrides)
    if args.max_body_bytes is not None and args.max_body_bytes < 1024:
        raise UserError(f"--max-body-bytes {args.max_body_bytes} is too small; pass 1024 or more (default 4 MiB)")
    served = transport.agree_on_root(world, lambda: resolve_model(args.model, args.model_name))
    if served.note and world.Get_rank() == 0:
        print(f"agentrl: {served.note}", flush=True)
    family = chat_family(served.path, args.chat_format)
    if world.Get_rank() == 0:
        how = "--chat-format" if args.chat_format else "detected; --chat-format overrides it"
        print(f"agentrl: chat format {family} ({how})", flush=True)
    stops = _StopSignals()
    try:
        run_entry_point(lambda: _serve(args, world, section, served, stops))
    except Failed as failure:
        return failure.exit_code
    return 0


def _serve(args, world, section, served: Served, stops: _StopSignals) -> None:
    from transformers.utils import logging as hf_logging

    from agentrl import transport
    from agentrl.layout import job_nodes
    from agentrl.models.loading import load_tokenizer
    from agentrl.run.freed_memory import keep_freed_memory
    from agentrl.run.liveness import Liveness
    from agentrl.serve.generation import LocalBackend

    hf_logging.disable_progress_bar()
    keep_freed_memory()  # generation's tensors reuse freed pages; MALLOC_*_THRESHOLD_ in the environment overrides
    rank, size = world.Get_rank(), world.Get_size()
    tokenizer = load_tokenizer(served.path)
    engine, max_positions = _engine(args, section, served, rank)
    max_model_len = args.max_model_len or max_positions
    if max_positions and max_model_len > max_positions:
        raise UserError(
            f"--max-model-len {max_model_len} is longer than the model's {max_positions} positions; "
            f"pass --max-model-len {max_positions} or less"
        )
    engine.weight_version = served.step
    local = LocalBackend(engine, tokenizer)
    loop = engine.event_loop or asyncio.new_event_loop()
    liveness = Liveness(world, *job_nodes(world), args.peer_timeout_s)
    startup_gc.settle()
    try:
        if rank == 0:
            loop.run_until_complete(_front(args, world, local, tokenizer, served, max_model_len, stops))
        else:
            from agentrl.serve.ranks import serve_engine_rank

            loop.run_until_complete(serve_engine_rank(world, local, stops.reason))
    finally:
        engine.shutdown()
    liveness.stop()
    if size > 1:
        transport.barrier(world)


def _engine(args, section, served: Served, rank: int):
    """This rank's engine and the model's position limit (None where unknown)."""
    import torch

    if section.backend == "sglang":
        from transformers import AutoConfig

        from agentrl.engine.sglang import SGLangEngine

        device = f"cuda:{rank % max(torch.cuda.device_count(), 1)}"
        engine = SGLangEngine(
            served.path,
            section,
            base_gpu_id=int(device.partition(":")[2]),
            colocate=False,
            seed=args.seed + rank,
            dtype=args.dtype,
        )
        return engine, getattr(AutoConfig.from_pretrained(served.path), "max_position_embeddings", None)
    from agentrl.engine import build_torch_engine
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_causal_lm(served.path, args.dtype, device)
    tokenizer = load_tokenizer(served.path)
    engine = build_torch_engine(model, section, pad_token_id=tokenizer.pad_token_id, seed=args.seed + rank)
    return engine, getattr(model.config, "max_position_embeddings", None)


async def _front(args, world, local, tokenizer, served: Served, max_model_len: int, stops: _StopSignals) -> None:
    """Rank 0: the HTTP server, and with several ranks the spread of generations over them."""
    import uvicorn

    from agentrl.serve.app import build_app
    from agentrl.serve.completions import Completions
    from agentrl.serve.guard import DEFAULT_MAX_BODY_BYTES

    spread = None
    backend = local
    if world.Get_size() > 1:
        from agentrl.serve.ranks import RankSpread

        spread = RankSpread(world, local, lambda reason: _stop(server, reason))
        backend = spread
    completions = Completions(
        backend, tokenizer, served.name, max_model_len, list_tools=args.list_tools, chat_format=args.chat_format
    )
    app = build_app(completions, args.max_body_bytes or DEFAULT_MAX_BODY_BYTES, args.api_key)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        lifespan="off",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = uvicorn.Server(config)
    stops.on_first = lambda: _stop(server, stops.reason())  # a signal before uvicorn catches its own
    print(
        f"agentrl: serving {served.path} as `{served.name}` on http://{args.host}:{args.port}/v1 "
        f"({world.Get_size()} engine rank(s), max model length {max_model_len}, "
        f"{'API key required' if args.api_key else 'no API key'})",
        flush=True,
    )
    if not args.api_key and args.host not in LOOPBACK_HOSTS:
        print(
            f"agentrl: {args.host} is reachable from other machines and no API key is set: anyone there can use the "
            "model; set AGENTRL_API_KEY (or --api-key)",
            flush=True,
        )
    poller = asyncio.ensure_future(spread.poll()) if spread is not None else None
    serving = asyncio.ensure_future(server.serve())
    if poller is not None:
        done, _ = await asyncio.wait({poller, serving}, return_when=asyncio.FIRST_COMPLETED)
        if poller in done:
            poller.result()  # a failure in the MPI poll aborts the job
    try:
        await serving
    except SystemExit:  # uvicorn's answer to a port it cannot bind
        raise UserError(
            f"could not listen on {args.host}:{args.port} (uvicorn's error above); pass another --port"
        ) from None
    if spread is not None:
        await spread.close()
        await poller
    print("agentrl: server stopped", flush=True)


def _stop(server, reason: str | None) -> None:
    if not server.should_exit:
        sys.stderr.write(f"agentrl: {reason or 'a stop'}: stopping the server after the calls in flight\n")
        sys.stderr.flush()
    server.should_exit = True
