"""GPU smoke check and numbers for the torch path, in one run that prints one markdown table.

    python benchmarks/gpu_check.py --out gpu_check.md   # on a GPU node: ~0.5B Qwen2, random weights
    python benchmarks/gpu_check.py --device cpu --small --batch-sizes 4  # dry run (what the unit test runs)
    python benchmarks/gpu_check.py --device cpu --small --quickstart --quickstart-steps 2 --sections quickstart

The model is built locally (no downloads): a Qwen2 config of Qwen2.5-0.5B's shape (hidden
896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151,936) with random
weights in bfloat16 (`--small`: a tiny one, float32 on CPU), and agentrl's tiny byte-level
tokenizer (token ids are all it needs). Sections, in this order (`--sections` picks some):

- `grpo`: one GRPO train step (32 episodes of 256 + 512 tokens) after a warm-up step, with the trainer's lean
  forward (agentrl/trainer/lean_forward.py) and with the model's own forward; the row says whether the lean forward
  was taken and how far apart the two warm-up steps' gradients are (from the same weights and batch).
- `weights`: the weight update under `mpirun -n 2`: rank 0 holds the trainer's model, rank
  1 a TorchEngine on the same GPU; `CUDAIPCWeightSync` (from `agentrl.weights.cuda_ipc`,
  else `agentrl.weights.nccl`) moves the weights (the CPU dry run uses `MPIWeightBroadcast`).
  The update's time is the median of 5 sends after 2 warm-up sends (versions 1..7), set
  against the median of 5 device-to-device copies of the same bytes (the bound a same-GPU
  update cannot beat): the row gives update/copy. Then rank 1 generates greedily from a
  fixed prompt and rank 0 scores those tokens with its own model: equal weights give
  equal logprobs up to kernel noise.
- `tokens`: sampling tokens/s (top_k=50, `--new-tokens` per row, 64-token random prompts)
  at each of `--batch-sizes` (default 1,32,64,256) for three contenders side by side:
  `model.generate`, the batch engine `TorchEngine(max_batch_size=B)` and the continuous
  engine `ContinuousTorchEngine(max_batch_size=max(B, 64))` (with its default CUDA-graph
  setting; the row says whether it decoded with graphs). Each is warmed up once on the
  same workload (graph capture happens there) and timed as the median of `--repeats` (3).
- `multiturn`: benchmarks/bench_engine.py's multi-turn workload (32 episodes x 8 turns,
  up to 32 new tokens a turn, then an observation of 8..16 tokens) on its 512x8x8 tiny
  Qwen2 (hidden 512, 8 layers, 8 heads) in bfloat16 on the GPU, for generate, batch and
  continuous; median of `--repeats` after a warm-up (`--small`: 64x2x4, 4 x 2 turns).
- `quickstart`: `mpirun -n 4 agentrl train launch/configs/quickstart.yaml steps=20
  run_dir=... model.path=... eval.every=0 checkpoint.every=0` on this machine (one GPU),
  with a timeout (`--quickstart-timeout`, 240 s); the row gives the wall time (start-up
  included), the exit code and the rollout ranks' weights column of the layout table the
  run prints at start (else its last lines). Runs with `--device cuda`, or when
  `--quickstart` is given (`--quickstart-steps` sets the steps).

Every section is wrapped: a failure becomes a `| section | FAILED: <error> |` row and the
next section runs. Each row is also printed to stderr as soon as it is measured, and
appended to `--out FILE` if given, so a run cut short still leaves its rows; a contender
that fails inside `tokens` or `multiturn` shows as `FAILED (<error>)` in its row while the
others are still timed. The last row is the wall time of each section (about 215 s in all
on one H200: model 20 s, grpo 4 s, weights 15 s, tokens 30-35 s per batch size, multiturn
35-45 s, quickstart 22 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
FULL_SHAPE = dict(
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
)
SMALL_SHAPE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=512,
)
TOKENIZER_TEXTS = ["the agent calls a tool and reads the answer", "0 1 2 3 4 5 6 7 8 9 + - * / = ( )"]
SECTIONS = ("grpo", "weights", "tokens", "multiturn", "quickstart")
CONTENDERS = ("generate", "batch", "continuous")
EAGER_PREFILLS = "continuous-eager-prefills"  # multiturn: the continuous engine without prefill graphs
WEIGHT_WARMUPS, WEIGHT_REPEATS = 2, 5  # sends (versions 1..7); the engine receives as many
COPY_REPEATS = 5
TOP_K = 50


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--small", action="store_true", help="tiny models and workloads instead of the real ones")
    parser.add_argument("--batch-sizes", default="1,32,64,256", help="engines vs generate batch sizes")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per row in `tokens` (--small: 8)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats in `tokens` and `multiturn` (median)")
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--out", metavar="FILE", help="also write the table here, each row as soon as it is measured")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"which to run, of {','.join(SECTIONS)}")
    parser.add_argument("--quickstart", action="store_true", help="run the quickstart section off CUDA too")
    parser.add_argument("--quickstart-steps", type=int, default=20)
    parser.add_argument("--quickstart-timeout", type=float, default=240.0, help="seconds")
    parser.add_argument("--weight-sync-part", metavar="MODEL_DIR", help=argparse.SUPPRESS)  # the mpirun child
    args = parser.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    return args


# ---- the table: rows as they come ----------------------------------------------------------


class Table:
    """Markdown rows, printed to stderr and appended to `out` as each is measured; `text()` at the end."""

    HEADER = "| check | result |\n|---|---|\n"

    def __init__(self, out: str | None):
        self.rows: list[str] = []
        self.out = Path(out) if out else None
        if self.out is not None:
            self.out.write_text(self.HEADER)

    def add(self, check: str, result: str) -> None:
        row = f"| {_cell(check)} | {_cell(result)} |"
        self.rows.append(row)
        print(f"gpu_check: {row}", file=sys.stderr, flush=True)
        if self.out is not None:
            with self.out.open("a") as out:
                out.write(row + "\n")

    def text(self) -> str:
        return self.HEADER + "\n".join(self.rows)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "/")


def one_line(error: BaseException, limit: int = 240) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def section(table: Table, name: str, timings: dict, key: str | None = None):
    """Run one section; a failure (pytest.skip's from mpirun_command included) becomes a FAILED row.
    Its wall time goes to `timings[key or name]`."""
    started = time.perf_counter()
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # record it and go on with the next section
        traceback.print_exc(file=sys.stderr)
        table.add(name, f"FAILED: {one_line(error)}")
    finally:
        timings[key or name] = time.perf_counter() - started
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _num(value: float) -> str:
    """4 significant digits, no exponent for the sizes seen here."""
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


# ---- the model -------------------------------------------------------------------------------


def build_model(out_dir: Path, small: bool, dtype: torch.dtype) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer(TOKENIZER_TEXTS, vocab_size=160)
    config = Qwen2Config(
        **(SMALL_SHAPE if small else FULL_SHAPE),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        torch_dtype=str(dtype).removeprefix("torch."),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def agentrl_config(model_dir: Path, dtype: str):
    from agentrl.config import load_config

    return load_config(None, [f"model.path={model_dir}", f"model.dtype={dtype}", "steps=10"])


def random_batch(vocab: int, episodes: int, prompt_len: int, response_len: int, seed: int = 0) -> dict:
    from agentrl.trajectory import Episode, pack

    rng = np.random.default_rng(seed)
    batch = []
    for index in range(episodes):
        episode = Episode(group=index // 4, task_seed=index, reward=float(rng.random()), finish="terminated")
        episode.extend(rng.integers(3, vocab, prompt_len), mask=0)
        episode.extend(rng.integers(3, vocab, response_len), mask=1, logprobs=np.full(response_len, -2.0))
        episode.prompt_len = prompt_len
        batch.append(episode)
    return pack(batch)


def sync_device(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def time_grpo_step(model_dir: Path, device: str, dtype: str, small: bool) -> dict:
    """One GRPO step timed with the trainer's lean forward (what a run takes) and with the model's own forward, after
    a first step of each from the same weights on the same batch, whose gradients are compared."""
    from agentrl.roles.trainer_parts import policy_trainer

    episodes, prompt_len, response_len = (8, 16, 16) if small else (32, 256, 512)
    batch = random_batch(160, episodes, prompt_len, response_len)
    result, gradients = {}, {}
    for lean in (True, False):
        trainer = policy_trainer(agentrl_config(model_dir, dtype), str(model_dir), device)
        if lean:
            result["lean"] = trainer.lean_forwards.get(id(trainer.model)) is not None
        else:
            trainer.lean_forwards = {}
        trainer.train_step(batch)  # warm-up: allocator, kernels; the gradients compared
        gradients[lean] = [p.grad.float() for p in trainer.params if p.grad is not None]
        sync_device(device)
        started = time.perf_counter()
        metrics = trainer.train_step(batch)
        sync_device(device)
        result["seconds" if lean else "forward_seconds"] = time.perf_counter() - started
        if lean:
            result["loss"] = metrics["train/loss"]
            result["params"] = sum(p.numel() for p in trainer.model.parameters())
        del trainer
    largest = max(float(g.abs().max()) for g in gradients[False])
    result["gradient_difference"] = max(
        float((a - b).abs().max()) for a, b in zip(gradients[True], gradients[False], strict=True)
    ) / max(largest, 1e-30)
    result["tokens_per_s"] = episodes * (prompt_len + response_len) / result["seconds"]
    return result


# ---- the two-process part (run under mpirun -n 2) ------------------------------------


def cuda_ipc_sync(world, bucket_mb: float, device: str):
    """The colocated sync: the new module's (whose engine sleeps while the trainer trains) if it is there."""
    try:
        from agentrl.weights.cuda_ipc import CUDAIPCWeightSync
    except ImportError:
        from agentrl.weights.nccl import CUDAIPCWeightSync

        return CUDAIPCWeightSync(world, bucket_mb, device)
    return CUDAIPCWeightSync(world, bucket_mb, device, sleeps=True)


def weight_sync_part(model_dir: Path, device: str, dtype: str, bucket_mb: float) -> None:
    from mpi4py import MPI

    from agentrl import transport
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.models.loading import load_causal_lm
    from agentrl.weights.mpi import MPIWeightBroadcast

    world = MPI.COMM_WORLD
    model = load_causal_lm(str(model_dir), dtype, device)
    on_gpu = device.startswith("cuda")
    sync = cuda_ipc_sync(world, bucket_mb, device) if on_gpu else MPIWeightBroadcast(world, bucket_mb)
    prompt = list(range(5, 37))
    versions = list(range(1, WEIGHT_WARMUPS + WEIGHT_REPEATS + 1))
    if world.Get_rank() == 0:
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(1.01)  # "trained": the engine must pick this up
        named = [(name, p.detach()) for name, p in model.named_parameters()]
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        times = []
        for version in versions:  # the first WEIGHT_WARMUPS: IPC handles, allocator
            sync_device(device)
            started = time.perf_counter()
            sync.send(named, version)
            sync_device(device)
            times.append(time.perf_counter() - started)
        copy_times = device_copy_seconds(named, device)
        writer_phases = dict(getattr(sync, "seconds", {}))
        generated = transport.bcast_object(world, None, root=1)
        alone = trainer_logprobs(model, prompt, generated["ids"], device)
        diffs = np.abs(alone - generated["logprobs"])
        # The noise floor: the trainer's own forward of the same tokens, as one row of a batch of 8.
        noise = np.abs(alone - trainer_logprobs(model, prompt, generated["ids"], device, batch=8))
        sync.stop()
        print(
            "WEIGHT_SYNC_RESULT "
            + json.dumps(
                {
                    "method": "cuda_ipc" if on_gpu else "mpi (cpu dry run)",
                    "sync_class": f"{type(sync).__module__}.{type(sync).__name__}",
                    "gb": nbytes / 1e9,
                    "seconds": statistics.median(times[WEIGHT_WARMUPS:]),
                    "times": times,
                    "copy_seconds": statistics.median(copy_times),
                    "copy_times": copy_times,
                    "version": generated["version"],
                    "writer_phases": writer_phases,
                    "reader_phases": generated["phases"],
                    "reader_copies": generated["copies"],
                    "graphs": generated["graphs"],
                    "max_abs_diff": float(diffs.max()),
                    "mean_abs_diff": float(diffs.mean()),
                    "noise_max_abs_diff": float(noise.max()),
                    "noise_mean_abs_diff": float(noise.mean()),
                }
            ),
            flush=True,
        )
    else:
        # The continuous engine, with CUDA graphs on a GPU: its logprobs are the ones compared with the trainer's.
        engine = ContinuousTorchEngine(model, pad_token_id=0)
        received = [sync.receive(engine) for _ in versions]
        assert received == versions, received
        phases = dict(getattr(sync, "seconds", {}))
        copies = reader_copy_seconds(sync, model, device)
        greedy = SamplingParams(max_new_tokens=32, temperature=1.0, top_k=1)
        output = asyncio.run(engine.generate(prompt, greedy))
        payload = {
            "ids": output.output_ids.tolist(),
            "logprobs": output.logprobs,
            "version": engine.weight_version,
            "phases": phases,
            "copies": copies,
            "graphs": getattr(engine, "graphs", None) is not None,
        }
        transport.bcast_object(world, payload, root=1)
        assert sync.receive(engine) is None
        engine.shutdown()


def reader_copy_seconds(sync, model, device: str) -> dict[str, float]:
    """The reader's one fused copy into its parameters, timed from the writer's mapped memory and from a local copy
    of it: whether reading memory mapped over CUDA IPC is slower than reading the reader's own."""
    views = [tensor for _, tensor in getattr(sync, "_views", [])]
    if not views:
        return {}
    params = [dict(model.named_parameters())[name] for name, _ in sync._views]
    local = [view.clone() for view in views]
    seconds = {}
    for label, sources in (("from_ipc", views), ("from_local", local)):
        times = []
        for _ in range(COPY_REPEATS):
            sync_device(device)
            started = time.perf_counter()
            with torch.no_grad():
                torch._foreach_copy_(params, sources)
            sync_device(device)
            times.append(time.perf_counter() - started)
        seconds[label] = statistics.median(times)
    return seconds


def device_copy_seconds(named, device: str) -> list[float]:
    """Device-to-device copies of the same bytes (after one warm-up), the bound a same-GPU update cannot beat."""
    source = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in named])
    target = torch.empty_like(source)
    target.copy_(source)
    times = []
    for _ in range(COPY_REPEATS):
        sync_device(device)
        started = time.perf_counter()
        target.copy_(source)
        sync_device(device)
        times.append(time.perf_counter() - started)
    return times


@torch.no_grad()
def trainer_logprobs(model, prompt: list[int], generated: list[int], device: str, batch: int = 1) -> np.ndarray:
    """The model's logprobs of `generated` after `prompt`, that sequence fed alone or as the first row of `batch`
    rows (the others random tokens: other matrix shapes, other rounding)."""
    rows = [prompt + generated]
    rng = np.random.default_rng(0)
    rows += [rng.integers(3, 160, len(rows[0])).tolist() for _ in range(batch - 1)]
    ids = torch.tensor(rows, device=device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    chosen = torch.tensor(generated, device=device)
    return torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None]).squeeze(1).cpu().numpy()


def run_child(command: list[str], timeout: float, cwd: Path | None = None) -> tuple[int | None, str, float]:
    """Run `command` in its own session with stdout and stderr merged; on timeout end its whole process
    group (mpirun and its ranks). Returns (exit code or None on timeout, output, seconds)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    started = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd, start_new_session=True
    )
    try:
        output, _ = child.communicate(timeout=timeout)
        code = child.returncode
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, sig)
            try:
                child.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        output, _ = child.communicate()
        code = None
    return code, output, time.perf_counter() - started


def run_weight_sync_part(model_dir: Path, args) -> dict:
    from tests.conftest import mpirun_command

    command = [
        *mpirun_command(2),
        sys.executable,
        str(Path(__file__).resolve()),
        "--weight-sync-part",
        str(model_dir),
        "--device",
        args.device,
        "--bucket-mb",
        str(args.bucket_mb),
        *(["--small"] if args.small else []),
    ]
    code, output, _ = run_child(command, timeout=300)
    for line in output.splitlines():
        if line.startswith("WEIGHT_SYNC_RESULT "):
            return json.loads(line.removeprefix("WEIGHT_SYNC_RESULT "))
    print(output, file=sys.stderr)
    raise RuntimeError(f"the mpirun weight-sync part {_ended(code)}: {_error_line(output)}")


def _ended(code: int | None) -> str:
    return "timed out" if code is None else f"failed (exit {code})"


def _error_line(output: str) -> str:
    """The last line that names an error (a traceback's last), else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(Error|Exception)\b", line) and not line.startswith("File ")]
    return errors[-1] if errors else _last_lines(output, 1)


def _last_lines(output: str, n: int) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return " / ".join(lines[-n:]) if lines else "(no output)"


# ---- engines vs generate ---------------------------------------------------------------------


def median_seconds(run, device: str, repeats: int):
    """Warm up once, then time `repeats` runs: (median seconds, the last run's result)."""
    run()
    times, result = [], None
    for _ in range(repeats):
        sync_device(device)
        started = time.perf_counter()
        result = run()
        sync_device(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def uses_graphs(engine) -> bool:
    return getattr(engine, "graphs", None) is not None


class Contenders:
    """Each contender's tokens/s, or the one-line error that stopped it (the others go on)."""

    def __init__(self):
        self.rates: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self.graphs = False

    @contextlib.contextmanager
    def attempt(self, name: str):
        try:
            yield
        except Exception as error:  # this contender is out; the row says why
            traceback.print_exc(file=sys.stderr)
            self.errors[name] = one_line(error, 160)

    def row(self, unit: str = "") -> str:
        if not self.rates and self.errors:
            raise RuntimeError("; ".join(f"{name}: {error}" for name, error in self.errors.items()))
        cells = []
        for name in ("continuous", "batch", "generate", *sorted(set(self.rates) - set(CONTENDERS))):
            if name in self.errors:
                cells.append(f"{name} FAILED ({self.errors[name]})")
            else:
                graphs = f" ({'graphs' if self.graphs else 'no graphs'})" if name == "continuous" else ""
                cells.append(f"{name} {self.rates[name]:.0f}{graphs}")
        for name in sorted(set(self.errors) - set(CONTENDERS)):
            cells.append(f"{name} FAILED ({self.errors[name]})")
        ratio = "n/a"
        if "continuous" in self.rates and "generate" in self.rates:
            ratio = f"{self.rates['continuous'] / self.rates['generate']:.2f}x"
        return ", ".join(cells) + unit + f"; continuous/generate {ratio}"


def shut_down(engine) -> None:
    try:
        engine.shutdown()
    except Exception:  # a broken engine must not hide the numbers of the others
        traceback.print_exc(file=sys.stderr)


def time_generation(model, device: str, batch_size: int, new_tokens: int, repeats: int) -> Contenders:
    """tokens/s of each contender on `batch_size` 64-token random prompts, `new_tokens` each, top-k sampling."""
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.engine.torch_engine import TorchEngine

    rng = np.random.default_rng(batch_size)
    prompts = [rng.integers(3, 160, 64).tolist() for _ in range(batch_size)]
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_k=TOP_K)
    makers = {
        "continuous": lambda: ContinuousTorchEngine(model, pad_token_id=0, max_batch_size=max(batch_size, 64), seed=0),
        "batch": lambda: TorchEngine(model, pad_token_id=0, max_batch_size=batch_size, seed=0),
    }

    def all_prompts(engine, loop):
        async def gathered():
            return await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))

        return loop.run_until_complete(gathered())

    result = Contenders()
    for name, make in makers.items():
        with result.attempt(name):
            engine = make()
            loop = asyncio.new_event_loop()
            try:
                if name == "continuous":
                    result.graphs = uses_graphs(engine)
                seconds, outputs = median_seconds(functools.partial(all_prompts, engine, loop), device, repeats)
                result.rates[name] = sum(len(o.output_ids) for o in outputs) / seconds
            finally:
                shut_down(engine)
                loop.close()

    with result.attempt("generate"):
        input_ids = torch.tensor(prompts, device=device)
        attention_mask = torch.ones_like(input_ids)
        generate_kwargs = dict(
            do_sample=True, top_k=TOP_K, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0
        )
        with torch.inference_mode():
            seconds, generated = median_seconds(
                lambda: model.generate(input_ids, attention_mask=attention_mask, **generate_kwargs), device, repeats
            )
        result.rates["generate"] = (generated.shape[1] - input_ids.shape[1]) * batch_size / seconds
    return result


# ---- the multi-turn workload of bench_engine.py --------------------------------------------


def time_multiturn(device: str, dtype: str, small: bool, repeats: int) -> tuple[str, Contenders]:
    """(the row's label, each contender's tokens/s) on bench_engine.py's multi-turn workload."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_engine

    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.engine.torch_engine import TorchEngine

    shape, episodes, turns, new_tokens = ("64x2x4", 4, 2, 8) if small else ("512x8x8", 32, 8, 32)
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype]
    label = f"multi-turn {episodes}x{turns} ({shape}, {short})"
    model, tokenizer = bench_engine.tiny_model(shape, device=device, dtype=dtype)
    args = argparse.Namespace(turns=turns, env_ms=0.0, new_tokens=new_tokens, top_k=TOP_K, top_p=1.0)
    work = bench_engine.Workload("multiturn", bench_engine.make_prompts(tokenizer, episodes), tokenizer, args)
    pad_id = tokenizer.pad_token_id
    result, engines = Contenders(), {}
    for name, engine_class in (("batch", TorchEngine), ("continuous", ContinuousTorchEngine)):
        with result.attempt(name):
            engines[name] = engine_class(model, pad_token_id=pad_id, max_batch_size=max(episodes, 64), seed=0)
    result.graphs = uses_graphs(engines.get("continuous"))
    names = list(CONTENDERS)
    if result.graphs:  # the same engine with its prefills run eagerly: what the prefill graphs bring
        with result.attempt(EAGER_PREFILLS):
            engine = ContinuousTorchEngine(model, pad_token_id=pad_id, max_batch_size=max(episodes, 64), seed=0)
            engine.graphs.prefill_tokens = 0
            engines[EAGER_PREFILLS] = engine
            names.append(EAGER_PREFILLS)
    loop = asyncio.new_event_loop()

    def run(name: str) -> float:
        sync_device(device)
        if name == "generate":
            return bench_engine.time_hf_generate(model, work, pad_id, args)
        return bench_engine.time_engine(engines[name], loop, work, args)

    try:
        times = {}
        for name in names:  # warm-up (graph capture)
            if name not in result.errors:
                with result.attempt(name):
                    run(name)
                    times[name] = []
        for repeat in range(repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]  # none always in another's wake
            for name in order:
                if name in times and name not in result.errors:
                    with result.attempt(name):
                        times[name].append(run(name))
        for name, seconds in times.items():
            if name not in result.errors:
                result.rates[name] = work.tokens / statistics.median(seconds)
    finally:
        loop.close()
        for engine in engines.values():
            shut_down(engine)
    return label, result


# ---- the quickstart on this machine ------------------------------------------------------------


def run_quickstart(workdir: Path, steps: int, timeout: float) -> str:
    from tests.conftest import mpirun_command

    command = [
        *mpirun_command(4),
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        str(ROOT / "launch" / "configs" / "quickstart.yaml"),
        f"steps={steps}",
        f"run_dir={workdir / 'quickstart-run'}",
        f"model.path={workdir / 'quickstart-model'}",
        "eval.every=0",
        "checkpoint.every=0",
    ]
    print("gpu_check: " + " ".join(command), file=sys.stderr, flush=True)
    code, output, seconds = run_child(command, timeout, cwd=workdir)
    if code != 0:
        print(output, file=sys.stderr)
    weights = layout_weights(output)
    ran = f"{steps} steps in {seconds:.1f} s, exit {code}" if code is not None else f"timed out after {seconds:.0f} s"
    if weights is not None and code == 0:
        return f"{ran}; weights: {weights}"
    return f"{ran}; weights: {weights or '?'}; last lines: {_last_lines(output, 3)}"


def layout_weights(output: str) -> str | None:
    """The rollout ranks' cells of the weights column in the layout table `agentrl train` prints at start."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("rank  role") and line.rstrip().endswith("weights"):
            cells = []
            for row in lines[index + 1 :]:
                parts = row.split()
                if len(parts) < 6 or not parts[0].isdigit():
                    break
                if parts[1] == "rollout":
                    cells.append(" ".join(parts[5:]))
            return ", ".join(dict.fromkeys(cells)) or None
    return None


# ---- main ---------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here; run it on a GPU node, or dry-run the non-CUDA logic with "
            "`python benchmarks/gpu_check.py --device cpu --small`",
            file=sys.stderr,
        )
        return 2
    dtype = "bfloat16" if on_cuda else "float32"
    if args.weight_sync_part:
        weight_sync_part(Path(args.weight_sync_part), _rank_device(args.device), dtype, args.bucket_mb)
        return 0
    wanted = set(args.sections.split(","))
    table, timings = Table(args.out), {}
    workdir = Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-"))
    started = time.perf_counter()
    try:
        table.add("device", torch.cuda.get_device_name() if on_cuda else "cpu")
        model_dir = None
        if wanted & {"grpo", "weights", "tokens"}:
            with section(table, "model", timings, "build model"):
                model_dir = build_model(workdir / "model", args.small, getattr(torch, dtype))

        def need_model() -> Path:
            if model_dir is None:
                raise RuntimeError("no model: building it failed (see the model row)")
            return model_dir

        if "grpo" in wanted:
            with section(table, "GRPO train step", timings, "grpo"):
                step = time_grpo_step(need_model(), args.device, dtype, args.small)
                table.add("model parameters", f"{step['params'] / 1e6:.1f} M ({dtype})")
                table.add("GRPO train step", f"{step['seconds']:.3f} s, {step['tokens_per_s']:.0f} tokens/s")
                table.add(
                    "the trainer's lean forward",
                    f"{'taken' if step['lean'] else 'stood aside (differs from the forward)'}; the model's own forward "
                    f"{step['forward_seconds']:.3f} s a step; first steps' gradients "
                    f"{step['gradient_difference']:.1e} of the largest apart",
                )

        if "weights" in wanted:
            with section(table, "weight update", timings, "weights"):
                sync = run_weight_sync_part(need_model(), args)
                print(f"gpu_check: weight sync {sync['sync_class']}: {sync}", file=sys.stderr, flush=True)
                gb, seconds, copy = sync["gb"], sync["seconds"], sync["copy_seconds"]
                table.add(
                    f"weight update ({sync['method']}, {gb:.3f} GB)",
                    f"{_num(seconds)} s, {_num(gb / seconds)} GB/s; {seconds / copy:.1f}x one device copy",
                )
                table.add("device copy of the same bytes", f"{_num(copy)} s, {_num(gb / copy)} GB/s")
                phases = {
                    **sync.get("writer_phases", {}),
                    **{f"reader {k}": v for k, v in sync.get("reader_phases", {}).items()},
                }
                if phases:
                    table.add("weight update phases (ms)", ", ".join(f"{k} {v * 1e3:.2f}" for k, v in phases.items()))
                copies = sync.get("reader_copies") or {}
                if copies:
                    table.add(
                        "reader's fused copy into its parameters",
                        ", ".join(
                            f"{k.replace('_', ' ')} {_num(v)} s ({_num(gb / v)} GB/s)" for k, v in copies.items()
                        ),
                    )
                table.add("engine weight version after update", str(sync["version"]))
                table.add(
                    "engine vs trainer logprobs, abs diff",
                    f"max {sync['max_abs_diff']:.2e}, mean {sync['mean_abs_diff']:.2e}"
                    + (" (continuous engine, CUDA graphs)" if sync.get("graphs") else " (continuous engine)"),
                )
                if "noise_max_abs_diff" in sync:
                    table.add(
                        "noise floor: trainer alone vs in a batch of 8, abs diff",
                        f"max {sync['noise_max_abs_diff']:.2e}, mean {sync['noise_mean_abs_diff']:.2e}",
                    )

        if "tokens" in wanted:
            from agentrl.models.loading import load_causal_lm

            new_tokens = 8 if args.small else args.new_tokens
            model = None
            with section(table, "engines vs generate", timings, "load model"):
                model = load_causal_lm(str(need_model()), dtype, args.device).eval()
            for batch_size in [int(b) for b in args.batch_sizes.split(",")] if model is not None else []:
                check = f"tokens/s at batch {batch_size} ({new_tokens} new)"
                with section(table, check, timings, f"tokens b{batch_size}"):
                    speed = time_generation(model, args.device, batch_size, new_tokens, args.repeats)
                    table.add(check, speed.row())
            del model

        if "multiturn" in wanted:
            with section(table, "multi-turn", timings, "multiturn"):
                label, rates = time_multiturn(args.device, dtype, args.small, args.repeats)
                table.add(label, rates.row(" tokens/s"))

        if "quickstart" in wanted and (on_cuda or args.quickstart):
            check = "quickstart, mpirun -n 4, " + ("one GPU" if on_cuda else "cpu")
            with section(table, check, timings, "quickstart"):
                table.add(check, run_quickstart(workdir, args.quickstart_steps, args.quickstart_timeout))

        spent = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
        table.add("gpu_check wall time", f"{time.perf_counter() - started:.0f} s ({spent})")
        print(table.text(), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _rank_device(device: str) -> str:
    """Both mpirun ranks on one GPU: the colocated case."""
    return "cuda:0" if device.startswith("cuda") else device


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
