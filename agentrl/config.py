"""Typed, validated configuration: one section per role, YAML plus key=value overrides.

Every field carries a description; `agentrl config-doc` prints them as the README's
config reference. A config is validated once, on load, and saved resolved into the
run folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrl.errors import UserError


class ConfigError(UserError, ValueError):
    """A config that cannot run; the message names the field and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LayoutConfig(Section):
    """How many ranks take each role. Ranks are assigned in this order: trainer, rollout, env."""

    trainer: int = Field(1, ge=1, description="Ranks that train the policy (torch.distributed among them).")
    rollout: int = Field(1, ge=1, description="Ranks that run an inference engine and the multi-turn agent loop.")
    env: int = Field(
        0, ge=0, description="Ranks that host environments; 0 runs each rollout rank's environments in-process."
    )
    colocate: bool = Field(
        False, description="Rollout ranks share the trainer ranks' GPUs (rollout rank i on trainer rank i's GPU)."
    )

    @property
    def world_size(self) -> int:
        return self.trainer + self.rollout + self.env


class TinyModelConfig(Section):
    """A tiny random Qwen2 model and a locally trained tokenizer, built when `model.path` is missing."""

    hidden_size: int = Field(64, ge=8, description="Hidden width.")
    num_layers: int = Field(2, ge=1, description="Transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads (key/value heads: half of these).")
    vocab_size: int = Field(128, ge=32, description="Upper bound on the BPE vocabulary trained on env texts.")
    seed: int = Field(0, description="Seed of the random initialisation.")


class ModelConfig(Section):
    """The policy: any transformers causal LM loadable with `from_pretrained`."""

    path: str = Field(..., description="Local folder or hub id of the model and tokenizer.")
    tiny: TinyModelConfig | None = Field(
        None, description="If set and `path` does not exist, build a tiny model there first (no network needed)."
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype for training and rollout.")


class EnvConfig(Section):
    """The environment every episode runs in."""

    id: str = Field("guess_number", description="Registered env id or `module:Class`.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the env constructor.")
    system_prompt: str | None = Field(None, description="Optional system message placed before the first observation.")
    reward_fn: str | None = Field(
        None,
        description="`module:function` scoring a finished episode (see docs/environments.md); None: the env's reward.",
    )
    reward_mode: Literal["replace", "add"] = Field(
        "replace", description="`replace` the env's summed reward with reward_fn's, or `add` reward_fn's to it."
    )


class RolloutConfig(Section):
    """Generation and the multi-turn agent loop on rollout ranks."""

    backend: Literal["torch", "sglang"] = Field("torch", description="Inference engine: built-in torch or SGLang.")
    tasks_per_step: int = Field(
        16, ge=1, description="Distinct tasks (env seeds) per training step, all ranks together."
    )
    group_size: int = Field(8, ge=2, description="Episodes per task; GRPO compares episodes within a group.")
    max_turns: int = Field(8, ge=1, description="Assistant turns before an episode is cut off.")
    max_new_tokens: int = Field(32, ge=1, description="Tokens the model may generate in one turn.")
    max_episode_tokens: int = Field(512, ge=8, description="Token budget of a whole episode (prompt + all turns).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (the trainer divides logits by it too).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    top_k: int = Field(-1, ge=-1, description="Top-k filter; -1 disables it.")
    max_batch_size: int = Field(256, ge=1, description="Most sequences the torch engine decodes at once.")
    tp_size: int = Field(1, ge=1, description="SGLang: tensor-parallel GPUs per engine (one engine per rollout rank).")
    mem_fraction_static: float = Field(
        0.8, gt=0, lt=1, description="SGLang: GPU memory fraction for weights and KV cache (lower it when colocated)."
    )
    sglang_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="SGLang: extra keyword arguments for `sglang.Engine`."
    )


class TrainerConfig(Section):
    """GRPO: group-relative advantages and a PPO-clipped token-level loss."""

    lr: float = Field(1e-3, gt=0, description="Peak learning rate (AdamW).")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="Decay after warm-up.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final LR as a fraction of `lr` for linear/cosine.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    clip_eps_low: float = Field(0.2, ge=0, description="PPO ratio clip below 1.")
    clip_eps_high: float = Field(0.28, ge=0, description="PPO ratio clip above 1 (clip-higher).")
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL penalty to a frozen reference model; 0 loads none."
    )
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    adv_std_norm: bool = Field(True, description="Divide group-relative advantages by the group's std.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")
    micro_batch_size: int = Field(16, ge=1, description="Episodes per forward/backward pass.")
    updates_per_step: int = Field(
        1, ge=1, description="Optimizer steps per batch (mini-batches); >1 is off-policy PPO."
    )
    seed: int = Field(0, description="Seed of trainer-side randomness.")
    fsdp: bool = Field(
        False, description="Shard parameters, gradients and optimizer state across trainer ranks with FSDP2."
    )
    mixed_precision: Literal["none", "bf16"] = Field(
        "none", description="`bf16`: compute in bfloat16 over float32 master weights (FSDP2 on GPU)."
    )
    activation_checkpointing: bool = Field(False, description="Recompute each decoder layer's activations in backward.")


class CheckpointConfig(Section):
    """Hugging Face model folders plus optimizer, RNG and step, written atomically."""

    every: int = Field(50, ge=0, description="Save every N steps (and at the end); 0 saves only at the end.")
    keep: int = Field(2, ge=1, description="Checkpoints kept; older ones are deleted.")
    checksums: bool = Field(
        True,
        description="Record each file's sha256 in the checkpoint's manifest and check it on resume; "
        "false checks sizes only (hashing reads every byte, about 1 s per GB).",
    )


class LoggingConfig(Section):
    """TensorBoard on the trainer leader and a console progress bar."""

    sample_every: int = Field(10, ge=0, description="Write sample episodes as text every N steps; 0: never.")
    num_samples: int = Field(2, ge=0, description="Episodes per text sample.")
    progress: bool = Field(True, description="Show a console progress bar.")


class RuntimeConfig(Section):
    """Process-level settings."""

    torch_threads: int = Field(
        0, ge=0, description="torch threads per rank; 0 = cores on the node / ranks on the node."
    )
    weight_bucket_mb: float = Field(64.0, gt=0, description="Size of one weight-broadcast bucket in MiB.")
    weight_sync: Literal["auto", "mpi", "nccl", "gloo", "cuda_ipc"] = Field(
        "auto",
        description="Weights to rollout ranks: `mpi` (CPU), `nccl` (broadcast), `cuda_ipc` (colocated, same GPU), "
        "`gloo` (the NCCL path's process-group broadcast on CPU); "
        "`auto` picks cuda_ipc when colocated, nccl on GPUs, else mpi.",
    )
    env_step_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Seconds one env call (reset/step/close) may take; a slower call ends its episode as an error.",
    )


class Config(Section):
    """The whole run."""

    run_dir: str = Field("runs/default", description="Folder for config, checkpoints and TensorBoard events.")
    steps: int = Field(100, ge=1, description="Training steps (one batch of episodes and one weight update each).")
    seed: int = Field(0, description="Seed for task sampling and generation.")
    resume: bool = Field(False, description="Continue from the latest checkpoint in run_dir.")
    layout: LayoutConfig = Field(default_factory=LayoutConfig)
    model: ModelConfig
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)

    @model_validator(mode="after")
    def _check_batch_split(self) -> Config:
        shards = self.layout.rollout * self.layout.trainer
        if self.rollout.tasks_per_step % shards:
            raise ValueError(
                f"rollout.tasks_per_step={self.rollout.tasks_per_step} must be a multiple of "
                f"layout.rollout x layout.trainer = {self.layout.rollout} x {self.layout.trainer} = {shards}, "
                "so every rollout rank sends every trainer the same number of groups; "
                f"set rollout.tasks_per_step to a multiple of {shards}"
            )
        if self.rollout.max_new_tokens >= self.rollout.max_episode_tokens:
            raise ValueError(
                f"rollout.max_new_tokens={self.rollout.max_new_tokens} must be below "
                f"rollout.max_episode_tokens={self.rollout.max_episode_tokens}; raise the budget or lower the turn size"
            )
        return self


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not key=value; write it like rollout.group_size=8")
    return key.strip().split("."), _parse_yaml(raw, f"override {text!r}") if raw.strip() else ""


def _parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        parts = []
        for text_attr, mark_attr in (("context", "context_mark"), ("problem", "problem_mark")):
            said, mark = getattr(error, text_attr, None), getattr(error, mark_attr, None)
            if said:
                parts.append(said + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""))
        detail = ": ".join(parts) or str(error).splitlines()[0]
        raise ConfigError(f"{source} is not valid YAML, {detail}; fix the YAML syntax there") from None


def apply_override(data: dict, path: list[str], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {part} is a value, not a section")
        node = child
    node[path[-1]] = value


def format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field; check the spelling against `agentrl config-doc`"
        elif item["type"] == "missing":
            message = "required field is missing; add it to the YAML or pass it as key=value"
        whole_config = not item["loc"]  # a cross-field check: its message already names the values
        got = "" if whole_config or item["type"] in ("missing", "extra_forbidden") else f" (got {item['input']!r})"
        lines.append(f"  {field}: {message}{got}")
    return "\n".join(lines)


def from_dict(data: dict, source: str = "<dict>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, source)) from None


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read YAML at `path` (or start empty), apply `key=value` overrides, validate."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"config file {path} does not exist; pass a YAML file such as launch/configs/quickstart.yaml"
            )
        try:
            text = path.read_text()
        except OSError as error:
            raise ConfigError(f"config file {path} cannot be read ({error.strerror}); check its permissions") from None
        data = _parse_yaml(text, f"config file {path}") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    for text in overrides:
        apply_override(data, *parse_override(text))
    return from_dict(data, source=str(path) if path else "overrides")


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def config_reference() -> str:
    """A markdown table per section: field, type, default, description."""
    out = []
    for name, field in Config.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, Section):
            out.append(f"\n### `{name}`\n\n{(annotation.__doc__ or '').strip()}\n")
            out.append("| field | type | default | description |\n|---|---|---|---|")
            for sub, sub_field in annotation.model_fields.items():
                out.append(_row(f"{name}.{sub}", sub_field))
    top = [_row(name, f) for name, f in Config.model_fields.items() if name not in _sections()]
    return (
        "### top level\n\n| field | type | default | description |\n|---|---|---|---|\n"
        + "\n".join(top)
        + "\n".join(["", *out])
    )


def _sections() -> set[str]:
    return {
        n
        for n, f in Config.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, Section)
    }


def _row(name: str, field) -> str:
    annotation = getattr(field.annotation, "__name__", None) or str(field.annotation).replace("typing.", "")
    if field.is_required():
        default = "required"
    elif field.default_factory is not None:
        default = repr(field.default_factory())
    else:
        default = repr(field.default)
    return f"| `{name}` | `{annotation}` | `{default}` | {field.description or ''} |"
