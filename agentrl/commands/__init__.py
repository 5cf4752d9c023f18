"""Commands that assemble several packages, above the parts they build from; agentrl/cli.py dispatches to them.

- `eval`: `agentrl eval`, a model folder evaluated with the training layout;
- `config_doc`: the field reference `agentrl config-doc` prints (docs/config.md), RL and SFT configs.
"""
