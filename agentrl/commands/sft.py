"""`agentrl sft CONFIG [key=value ...]`: every rank is a trainer; rank 0 reads and tokenizes the transcripts and
sends them to all. As `agentrl train`: errors before training raise on every rank, later ones abort the job.

The loop is the RL trainer's without rollouts: a batch of transcripts per step (shuffled
per epoch from the seed, so a resumed run continues with the very next batch), one
optimizer step, TensorBoard scalars and the progress bar on rank 0, checkpoints in the
same format as RL (so `resume=true` works the same way), a graceful stop on
SIGTERM/SIGUSR1/Ctrl-C at a step boundary, and at the end a plain Hugging Face folder,
`run_dir/final`, that an RL config names as `model.path`.
"""

from __future__ import annotations

import math
import os
import shutil
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agentrl import transport
from agentrl.config import save_config
from agentrl.errors import RefusedOnEveryRank, UserError
from agentrl.run import preempt, startup_gc
from agentrl.sft.config import SFTConfig
from agentrl.sft.data import Packed, describe_packed, read_transcripts, texts_of, tokenize_all
from agentrl.sft.transcripts import TranscriptTokenizer

FINAL_DIR = "final"


@dataclass
class SFTProgress:
    """Where a run stands: it started at step `start`, has done `done` of `total` steps; the training loss
    logged at each step, and the last validation loss."""

    start: int
    total: int
    done: int
    losses: dict[int, float] = field(default_factory=dict)
    val_loss: float | None = None


def add_arguments(parser) -> None:
    parser.add_argument("config", help="SFT YAML config, e.g. launch/configs/sft_example.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. sft.epochs=3 run_dir=runs/sft2")


def main(args) -> int:
    from mpi4py import MPI

    from agentrl.run.claim import claim
    from agentrl.sft.config import load_sft_config
    from agentrl.transport import Failed, run_entry_point

    config = load_sft_config(args.config, args.overrides)
    preempt.install()
    world = MPI.COMM_WORLD
    command = ["agentrl", "sft", args.config, *args.overrides]

    def run():
        lock = claim(config, command, world)
        try:
            from agentrl.layout import job_nodes
            from agentrl.run.liveness import Liveness

            liveness = Liveness(world, *job_nodes(world), config.runtime.peer_timeout_s)
            result = run_sft(config, world, command)
            liveness.stop()
            return result
        finally:
            if lock is not None:
                lock.release()

    try:
        done, total = run_entry_point(run)
    except Failed as failure:
        return failure.exit_code
    return 0 if done >= total else preempt.EXIT_STOPPED


def final_path(run_dir: str | Path) -> Path:
    """Where the fine-tuned model and tokenizer land: an RL config's `model.path`."""
    return Path(run_dir) / FINAL_DIR


def steps_per_epoch(config: SFTConfig, transcripts: int) -> int:
    return math.ceil(transcripts / config.sft.batch_size)


def batch_indices(config: SFTConfig, transcripts: int, step: int) -> np.ndarray:
    """The transcripts of global step `step`: a slice of its epoch's permutation (drawn from seed and epoch)."""
    per_epoch = steps_per_epoch(config, transcripts)
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([config.seed, epoch]).permutation(transcripts)
    size = config.sft.batch_size
    return order[position * size : (position + 1) * size]


def read_inputs(config: SFTConfig, world_size: int) -> tuple[list, list | None]:
    """Rank 0: the checks that need no model, then the (train, val) transcripts."""
    from agentrl.models.hub import refuse_missing_model
    from agentrl.tracking import check_installed

    if config.parallelism.fsdp and world_size < 2:
        raise UserError(
            "parallelism.fsdp=true needs at least 2 ranks (mpirun -n 2 or more); with one there is nothing to shard: "
            "set parallelism.fsdp=false"
        )
    check_installed(config.logging.backends)
    refuse_missing_model(config.model)
    train = read_transcripts(config.sft.train)
    val = read_transcripts(config.sft.val) if config.sft.val else None
    return train, val


def prepare_run(
    config: SFTConfig, world_size: int, train: list, val: list | None
) -> tuple[int, int, Packed, Packed | None]:
    """Rank 0: build or check the model, tokenize, decide the start step, save the config."""
    from agentrl.chat.detect import model_type_of
    from agentrl.models.loading import ensure_model, load_tokenizer
    from agentrl.run.start import resume_step
    from agentrl.sft.chat_transcripts import transcript_tokenizer

    ensure_model(
        config.model, lambda: texts_of(train) + ([config.sft.system_prompt] if config.sft.system_prompt else [])
    )
    tokenizer = transcript_tokenizer(
        load_tokenizer(config.model.path),
        config.sft.system_prompt,
        config.chat.format,
        config.chat.template_kwargs,
        keep_rewritten=config.chat.rewritten == "keep",
        model_type=model_type_of(config.model.path),
        train_reasoning=config.chat.train_reasoning,
    )
    if not isinstance(tokenizer, TranscriptTokenizer):
        print(f"agentrl sft: chat format {tokenizer.family.name} (the model's own chat template)", flush=True)
    packed = tokenize_all(train, tokenizer, config.sft.max_seq_len)
    if not len(packed):
        raise UserError(f"no transcript of {config.sft.train} has an assistant token within sft.max_seq_len")
    print(f"agentrl sft: {describe_packed(packed, 'train', config.sft.max_seq_len)}", flush=True)
    val_packed = None
    if val is not None:
        val_packed = tokenize_all(val, tokenizer, config.sft.max_seq_len)
        if not len(val_packed):
            raise UserError(f"no transcript of {config.sft.val} has an assistant token within sft.max_seq_len")
        print(f"agentrl sft: {describe_packed(val_packed, 'val', config.sft.max_seq_len)}", flush=True)
    total = config.sft.epochs * steps_per_epoch(config, len(packed))
    start = resume_step(types.SimpleNamespace(run_dir=config.run_dir, resume=config.resume, steps=total))
    save_config(config, Path(config.run_dir) / "config.yaml")
    print(
        f"agentrl sft: run_dir={config.run_dir} ranks={world_size} steps={total} "
        f"({config.sft.epochs} epoch(s) x {steps_per_epoch(config, len(packed))} batches of {config.sft.batch_size})",
        flush=True,
    )
    return start, total, packed, val_packed


def device_for(world) -> str:
    """A node-local GPU per rank when there are GPUs, else the CPU."""
    import torch
    from mpi4py import MPI

    if not torch.cuda.is_available():
        return "cpu"
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    gpu = node.Get_rank() % torch.cuda.device_count()
    node.Free()
    torch.cuda.set_device(gpu)
    return f"cuda:{gpu}"


def shared_gpu(world, device: str) -> tuple[int, int, int, int] | None:
    """The first two ranks of `world` bound to one GPU, as (rank, rank, node, gpu), or None."""
    import socket

    from agentrl.layout import Role, node_ids, shared_trainer_gpu

    places = transport.allgather_object(world, (socket.gethostname(), device))
    gpus = [int(where.split(":")[1]) if where.startswith("cuda:") else None for _, where in places]
    return shared_trainer_gpu([Role.TRAINER] * len(places), node_ids([host for host, _ in places]), gpus)


def run_sft(config: SFTConfig, world, command: list[str]) -> tuple[int, int]:
    """Train on every rank of `world`; returns (steps done, total steps)."""
    import torch
    from transformers.utils import logging as hf_logging

    from agentrl.models.loading import import_model_code, load_tokenizer
    from agentrl.run.freed_memory import keep_freed_memory
    from agentrl.run.supervise import restart_count
    from agentrl.tracking import open_trackers
    from agentrl.tracking.run_logger import RunLogger
    from agentrl.trainer import checkpoint
    from agentrl.trainer.model import init_trainer_group

    started = time.monotonic()
    hf_logging.disable_progress_bar()
    rank, size = world.Get_rank(), world.Get_size()
    inputs = []  # rank 0's transcripts, kept there: the other ranks get the packed batches
    transport.agree_on_root(world, lambda: inputs.extend(read_inputs(config, size)))
    import_model_code()  # side by side, before rank 0's model check imports the same and the others wait
    start, total, data, val = transport.agree_on_root(world, lambda: prepare_run(config, size, *inputs))
    torch.set_num_threads(config.runtime.torch_threads or max(1, (os.cpu_count() or 1) // size))
    if config.runtime.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(config.seed + rank)
    device = device_for(world)
    shared = shared_gpu(world, device)
    if shared is not None and config.parallelism.fsdp:  # the same placements on every rank: all refuse alike
        from agentrl.layout import sharding_refusal

        raise RefusedOnEveryRank(sharding_refusal(shared, "SFT"))
    group = init_trainer_group(world, device, shares_gpu=shared is not None)
    resumed_from = checkpoint.step_path(config.run_dir, start) if start else None

    from agentrl.trainer.sft import SFTSections, SFTTrainer

    trainer = SFTTrainer(str(resumed_from or config.model.path), device, total, group, SFTSections.of(config))
    if resumed_from is not None:
        checkpoint.load_state(resumed_from, trainer.optimizer, trainer.scheduler, trainer.model)
    tokenizer = load_tokenizer(config.model.path)
    leader = rank == 0
    logger = None
    if leader:
        postfix = {"loss": ("sft/loss", ".4f"), "val": ("sft/val_loss", ".4f"), "tok_s": ("perf/tokens_per_s", ".0f")}
        trackers = open_trackers(config.logging, config.run_dir, start, config.model_dump(mode="json"))
        logger = RunLogger(
            config.run_dir, total, start, config.logging.progress, restart_count(), postfix, "sft", trackers
        )
    per_epoch = steps_per_epoch(config, len(data))
    progress = SFTProgress(start, total, done=start)
    startup_gc.settle()
    for step in range(start, total):
        step_started = time.perf_counter()
        batch = batch_indices(config, len(data), step)
        metrics = trainer.train_step(data.rows(batch[rank::size]))
        done = progress.done = step + 1
        stopping = done < total and preempt.agreed(world)
        evaluate = val is not None and (
            done == total or stopping or (config.sft.eval_every and done % config.sft.eval_every == 0)
        )
        if evaluate:
            progress.val_loss, _ = trainer.eval_loss(val.rows(range(rank, len(val), size)))
            metrics["sft/val_loss"] = progress.val_loss
        saving = (config.checkpoint.every and done % config.checkpoint.every == 0) or done == total or stopping
        if logger is not None:
            step_time = time.perf_counter() - step_started
            batch_tokens = int(np.sum(data.offsets[batch + 1] - data.offsets[batch]))
            metrics["sft/epoch"] = step / per_epoch
            metrics["perf/tokens_per_s"] = batch_tokens / step_time
            metrics["time/step"] = step_time
            progress.losses[step] = metrics["sft/loss"]
            logger.log(step, metrics)
            if stopping:
                print(f"\nagentrl sft: {preempt.reason()}: stopping after step {done} with a checkpoint", flush=True)
            if saving:
                logger.flush()
        if saving:
            checkpoint.save_step(config, done, trainer, tokenizer, world, leader)
        if stopping:
            break
    if progress.done >= total:
        save_final(config.run_dir, trainer, tokenizer, leader)
    transport.barrier(world)
    if logger is not None:
        logger.close()
        print(summary(config, progress, time.monotonic() - started, command, size))
    return progress.done, total


def save_final(run_dir, trainer, tokenizer, leader: bool) -> None:
    """The fine-tuned model as a plain Hugging Face folder (gathered from the shards under FSDP)."""
    from agentrl.trainer import parallel

    state = parallel.full_model_state(trainer.model) if parallel.is_sharded(trainer.model) else None
    if not leader:
        return
    final = final_path(run_dir)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = trainer.model
    if hasattr(model, "merge_and_unload"):  # LoRA: final/ is the merged plain model an RL config can load
        model = model.merge_and_unload()
    model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def summary(config, progress: SFTProgress, wall_s: float, command: list[str], world_size: int) -> str:
    from agentrl.run.summary import format_duration, resume_command
    from agentrl.tracking import summary_lines

    start, done, total, losses, val_loss = (
        progress.start,
        progress.done,
        progress.total,
        progress.losses,
        progress.val_loss,
    )
    resumed = f", resumed at step {start}" if start else ""
    took = f"{done}/{total} steps in {format_duration(wall_s)}{resumed}"
    run_dir = Path(config.run_dir)
    lines = [f"agentrl sft: finished: {took}" if done >= total else f"{preempt.stopped_message(done)}: {took}"]
    if losses:
        first, last = min(losses), max(losses)
        lines.append(f"  loss          {losses[first]:.4f} (step {first}) -> {losses[last]:.4f} (step {last})")
    if val_loss is not None:
        lines.append(f"  val loss      {val_loss:.4f}")
    if done >= total:
        lines.append(f"  model         {final_path(run_dir)}  (an RL config's model.path)")
    lines.append(f"  tensorboard   tensorboard --logdir {run_dir / 'tb'}")
    lines += summary_lines(run_dir, config.logging.backends)
    if done < total:
        lines.append(f"  continue      {resume_command(command, world_size)}")
    return "\n".join(lines)
