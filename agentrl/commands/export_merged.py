"""`agentrl export-merged CHECKPOINT OUT`: a LoRA checkpoint merged into its base, written as a plain model folder."""

from __future__ import annotations

from pathlib import Path

from agentrl.errors import UserError


def add_arguments(parser) -> None:
    parser.description = "agentrl export-merged CHECKPOINT OUT [--dtype float32|bfloat16]"
    parser.add_argument("checkpoint", help="a LoRA run's RUN_DIR/checkpoints/step_N (or the run folder: its newest)")
    parser.add_argument("out", help="folder to write (config.json, model.safetensors, tokenizer)")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default="float32", help="dtype of the written weights"
    )


def main(args) -> int:
    out = export_merged(args.checkpoint, args.out, args.dtype)
    print(f"agentrl: wrote the merged model to {out} (load it with from_pretrained, or as model.path)")
    return 0


def export_merged(checkpoint: str, out: str, dtype: str = "float32") -> Path:
    """Load the recorded base, merge the adapter (W + alpha/r * B @ A), save model and tokenizer to `out`."""
    from agentrl.models import adapters
    from agentrl.models.loading import load_causal_lm, load_tokenizer

    path = Path(checkpoint)
    if (path / "checkpoints").is_dir() and not adapters.is_adapter_folder(path):
        from agentrl.trainer.folders import newest_checkpoint

        path, _ = newest_checkpoint(path)
    if not adapters.is_adapter_folder(path):
        raise UserError(
            f"{checkpoint} is not a LoRA checkpoint (no {adapters.ADAPTER_CONFIG}); export-merged takes a LoRA run's "
            "RUN_DIR/checkpoints/step_N. A full fine-tuning checkpoint is a plain model folder already"
        )
    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise UserError(f"{out} exists and is not empty; pass a new folder to write the merged model into")
    model = load_causal_lm(str(path), dtype)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer_source = path if (path / "tokenizer_config.json").is_file() else adapters.recorded_base(path)
    load_tokenizer(str(tokenizer_source)).save_pretrained(target)
    return target
