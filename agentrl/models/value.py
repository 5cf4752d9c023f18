"""A value model: a causal LM's backbone (transformers `AutoModel`) with a scalar head, one value per position.

Its folder is a Hugging Face base-model folder (config.json, model.safetensors: what
`AutoModel.from_pretrained` reads) plus `value_head.safetensors`. `from_pretrained` accepts a
causal-LM folder too: the backbone is taken from it and the head starts at zero, so the first
values are 0 and the critic starts as a constant predictor.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

HEAD_FILE = "value_head.safetensors"
BACKBONE_PREFIX = "backbone."
HEAD_PREFIX = "value_head."


class ValueModel(nn.Module):
    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(backbone.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        self.value_head.to(dtype=next(backbone.parameters()).dtype)

    @property
    def base_model(self) -> nn.Module:
        """The transformer: where agentrl/trainer/parallel.py finds the decoder layers to shard and checkpoint."""
        return self.backbone

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) float32: the value of the state after each position's token."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.value_head(hidden).squeeze(-1).to(torch.float32, copy=True)  # a new tensor, not a view

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str = "float32") -> ValueModel:
        """A value-model folder, or a causal-LM folder whose backbone is used (head at zero)."""
        from safetensors.torch import load_file
        from transformers import AutoModel

        model = cls(AutoModel.from_pretrained(path, dtype=getattr(torch, dtype)))
        head = Path(path) / HEAD_FILE
        if head.is_file():
            model.value_head.load_state_dict(load_file(head))
        return model


def write_value_model(model: ValueModel, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Write a full ValueModel state dict (keys `backbone.*`, `value_head.*`) as a value-model folder.

    `model` (possibly sharded) only writes its backbone's config and files; the tensors are `state`'s.
    """
    from safetensors.torch import save_file

    backbone = {k.removeprefix(BACKBONE_PREFIX): v for k, v in state.items() if k.startswith(BACKBONE_PREFIX)}
    head = {k.removeprefix(HEAD_PREFIX): v.contiguous() for k, v in state.items() if k.startswith(HEAD_PREFIX)}
    unknown = set(state) - {BACKBONE_PREFIX + k for k in backbone} - {HEAD_PREFIX + k for k in head}
    if unknown:
        raise ValueError(f"not ValueModel weights: {sorted(unknown)[:5]}")
    model.backbone.save_pretrained(folder, state_dict=backbone)
    save_file(head, str(Path(folder) / HEAD_FILE))


def read_value_model(folder: Path) -> dict[str, torch.Tensor]:
    """A value-model folder back as a full ValueModel state dict (in the dtype it was saved in, on CPU)."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(folder, dtype="auto")
    state = {BACKBONE_PREFIX + k: v for k, v in backbone.state_dict().items()}
    state.update({HEAD_PREFIX + k: v for k, v in load_file(Path(folder) / HEAD_FILE).items()})
    return state
