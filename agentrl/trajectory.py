"""Episodes and the flat numpy batch they travel in (no per-token Python objects on the wire)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FINISH_REASONS = ("terminated", "truncated", "max_turns", "max_tokens", "error")


@dataclass
class Episode:
    group: int  # index of the task within the step; episodes of one task share it
    task_seed: int
    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    finish: str = "max_turns"
    weight_version: int = -1
    error: str | None = None
    text: str = ""

    def extend(self, ids, mask: int, logprobs=None) -> None:
        ids = [int(i) for i in ids]
        self.tokens.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend(np.zeros(len(ids)) if logprobs is None else logprobs)


def pack(episodes: list[Episode], group_offset: int = 0) -> dict[str, np.ndarray]:
    """Concatenate episodes into flat arrays with `offsets` marking their boundaries."""
    lengths = np.array([len(e.tokens) for e in episodes], dtype=np.int64)
    return {
        "tokens": np.concatenate([np.asarray(e.tokens, dtype=np.int64) for e in episodes]),
        "loss_mask": np.concatenate([np.asarray(e.loss_mask, dtype=np.uint8) for e in episodes]),
        "logprobs": np.concatenate([np.asarray(e.logprobs, dtype=np.float32) for e in episodes]),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "group": np.array([e.group + group_offset for e in episodes], dtype=np.int64),
        "reward": np.array([e.reward for e in episodes], dtype=np.float32),
        "success": np.array([e.success for e in episodes], dtype=np.bool_),
        "turns": np.array([e.turns for e in episodes], dtype=np.int32),
        "tool_calls": np.array([e.tool_calls for e in episodes], dtype=np.int32),
        "tool_errors": np.array([e.tool_errors for e in episodes], dtype=np.int32),
        "prompt_len": np.array([e.prompt_len for e in episodes], dtype=np.int32),
        "weight_version": np.array([e.weight_version for e in episodes], dtype=np.int64),
        "finish": np.array([FINISH_REASONS.index(e.finish) for e in episodes], dtype=np.int8),
    }


def concat(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Join packed batches, shifting offsets."""
    out = {key: np.concatenate([b[key] for b in batches]) for key in batches[0] if key != "offsets"}
    starts = np.cumsum([0] + [b["offsets"][-1] for b in batches[:-1]])
    out["offsets"] = np.concatenate([[0]] + [b["offsets"][1:] + s for b, s in zip(batches, starts, strict=True)])
    return out


def num_episodes(batch: dict[str, np.ndarray]) -> int:
    return len(batch["offsets"]) - 1
