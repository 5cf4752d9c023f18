"""Typed, validated configuration: one section per role, YAML plus key=value overrides.

- `Section`, `AlgorithmSection` and `ConfigError` come from agentrl/sections.py, a leaf any module may import;
- `schema`: every section with a docstring per field, and the whole-config checks;
- `load`: YAML and `key=value` overrides in, validated once, saved resolved into the run folder;
"""

from __future__ import annotations

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
    ChatConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    EngineConfig,
    EnvConfig,
    EvalConfig,
    JudgeConfig,
    LayoutConfig,
    LoggingConfig,
    LoraConfig,
    LRSchedulerConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelismConfig,
    RewardConfig,
    RewardModelConfig,
    RolloutConfig,
    RuntimeConfig,
    SGLangEngineConfig,
    TinyModelConfig,
    TorchEngineConfig,
    TrainerConfig,
    WeightsConfig,
    algorithm_options,
)
from agentrl.sections import AlgorithmSection, ConfigError, Section, format_validation_error

__all__ = [
    "AgentConfig",
    "AlgorithmSection",
    "ChatConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EngineConfig",
    "EnvConfig",
    "EvalConfig",
    "JudgeConfig",
    "LRSchedulerConfig",
    "LayoutConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "RewardConfig",
    "RewardModelConfig",
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
