"""The `agentrl sft` config: the RL config's model, optimizer, schedule, parallelism, checkpoint and logging
sections, plus an `sft:` section for the data and the batch shape."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError

from agentrl.config.load import apply_override, parse_override, parse_yaml
from agentrl.config.schema import (
    ChatConfig,
    CheckpointConfig,
    LoggingConfig,
    LRSchedulerConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelismConfig,
    RuntimeConfig,
)
from agentrl.sections import ConfigError, Section, format_validation_error


class SFTSection(Section):
    """Supervised fine-tuning data and batches: chat transcripts in the Hugging Face messages format."""

    train: str = Field(
        ...,
        description='JSONL file of transcripts, one `{"messages": [...], "tools": [...]}` per line (`tools` optional; '
        "assistant messages may hold `tool_calls`, `tool` messages the results). Loss on assistant tokens only.",
    )
    val: str | None = Field(None, description="Held-out JSONL transcripts: `sft/val_loss` every `eval_every` steps.")
    epochs: int = Field(1, ge=1, description="Passes over the training transcripts (reshuffled each epoch from seed).")
    batch_size: int = Field(32, ge=1, description="Transcripts per optimizer step, all ranks together.")
    micro_batch_size: int = Field(
        8, ge=1, description="Transcripts per forward/backward pass on one rank (its share of a batch may be less)."
    )
    max_seq_len: int = Field(
        1024, ge=8, description="Tokens per transcript; longer ones are cut at the end (counted and reported)."
    )
    system_prompt: str | None = Field(
        None,
        description="System prompt of transcripts that have no system message; set it to the RL run's "
        "`env.system_prompt` so both see the same prompt.",
    )
    eval_every: int = Field(0, ge=0, description="Steps between held-out losses (and at the end); 0: at the end only.")


class SFTRuntime(Section):
    """Process-level settings of `agentrl sft`."""

    peer_timeout_s: float | None = RuntimeConfig.model_fields["peer_timeout_s"]
    torch_threads: int = RuntimeConfig.model_fields["torch_threads"]
    keep_freed_memory: bool = RuntimeConfig.model_fields["keep_freed_memory"]


class SFTConfig(Section):
    """An `agentrl sft` run."""

    run_dir: str = Field("runs/sft", description="Folder for config, checkpoints, TensorBoard and `final/`.")
    seed: int = Field(0, description="Seed of the data order and of torch.")
    resume: bool = Field(False, description="Continue from the latest checkpoint in run_dir.")
    model: ModelConfig
    chat: ChatConfig = Field(default_factory=ChatConfig)
    sft: SFTSection
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    lr_scheduler: LRSchedulerConfig = Field(default_factory=LRSchedulerConfig)
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    runtime: SFTRuntime = Field(default_factory=SFTRuntime)


def load_sft_config(path: str | Path, overrides: list[str] = ()) -> SFTConfig:
    """Read an SFT YAML, apply `key=value` overrides, validate; errors name the field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"config file {path} does not exist; pass a YAML file such as launch/configs/sft_example.yaml"
        )
    data = parse_yaml(path.read_text(), f"config file {path}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    for text in overrides:
        apply_override(data, *parse_override(text))
    try:
        return SFTConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, str(path))) from None
