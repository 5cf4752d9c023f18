"""Typed, validated configuration: one section per role, YAML plus key=value overrides.

- `base`: `Section`, `AlgorithmSection` and `ConfigError`, which any component may import;
- `schema`: every section with a docstring per field, and the whole-config checks;
- `load`: YAML and `key=value` overrides in, validated once, saved resolved into the run folder;
"""

from __future__ import annotations

from agentrl.config.base import AlgorithmSection, ConfigError, Section, format_validation_error
from agentrl.config.load import (
    apply_override,
    from_dict,
    load_config,
    migrate_renamed,
    parse_override,
    parse_yaml,
    save_config,
)
from agentrl.config.schema import (
    AgentConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    EngineConfig,
    EnvConfig,
    EvalConfig,
    LayoutConfig,
    LoggingConfig,
    LoraConfig,
    LRSchedulerConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelismConfig,
    RolloutConfig,
    RuntimeConfig,
    SGLangEngineConfig,
    TinyModelConfig,
    TorchEngineConfig,
    TrainerConfig,
    WeightsConfig,
    algorithm_options,
)

__all__ = [
    "AgentConfig",
    "AlgorithmSection",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EngineConfig",
    "EnvConfig",
    "EvalConfig",
    "LRSchedulerConfig",
    "LayoutConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "RolloutConfig",
    "RuntimeConfig",
    "SGLangEngineConfig",
    "Section",
    "TinyModelConfig",
    "TorchEngineConfig",
    "TrainerConfig",
    "WeightsConfig",
    "algorithm_options",
    "apply_override",
    "format_validation_error",
    "from_dict",
    "load_config",
    "migrate_renamed",
    "parse_override",
    "parse_yaml",
    "save_config",
]
