"""Episodes and the flat numpy batch they travel in (no per-token Python objects on the wire).

A packed batch holds per-token arrays (tokens, loss_mask, logprobs; `offsets` marks the
episodes), per-episode arrays, one `metric/NAME` array per episode metric, and per-turn
arrays (`turn_episode`, `turn_start`, `turn_end`: the turn's generated tokens in the flat
token array, `turn_reward`: the env's reward for that turn, `turn_state`: a key of the
state the turn acted in, `turn_call`: the turn's place among its episode's turns, 0 first).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import numbers
from dataclasses import dataclass, field

import numpy as np

FINISH_REASONS = ("terminated", "truncated", "max_turns", "max_tokens", "error")
METRIC_PREFIX = "metric/"
TURN_KEYS = ("turn_episode", "turn_start", "turn_end", "turn_reward", "turn_state", "turn_call")
LARGEST_REWARD = float(np.finfo(np.float32).max)  # rewards travel as float32 (`pack`): past this they become inf


@dataclass
class Episode:
    group: int  # index of the task within the step; episodes of one task share it
    task_seed: int
    task_id: str = ""  # the dataset row's id (or index), or the seed of a seeded task
    task_options: dict | None = field(default=None, repr=False)  # env.reset's options: the dataset row, or None
    data_source: str | None = None  # the row's `data_source` column, if any
    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)  # weight version that made each token; -1: none
    prompt_len: int = 0
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    finish: str = "max_turns"
    weight_version: int = -1  # the oldest version among its generated tokens
    error: str | None = None
    text: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # summed over the episode; episode/NAME_mean
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each turn's generated tokens
    turn_rewards: list[float] = field(default_factory=list)
    turn_states: list[int] = field(default_factory=list)
    # each turn's index among the episode's model calls (0 first), where its calls are spread over several samples
    # (the gateway); empty: this row's turns are the episode's turns 0, 1, 2, ... in order (the env loop)
    turn_calls: list[int] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list, repr=False)  # the conversation as chat messages (dumps)
    tools: list[dict] = field(default_factory=list, repr=False)  # the env's tool schemas
    # 0: the episode's own row; k > 0: its k-th further sample (an agent session that was not append-only),
    # packed right after it, sharing its group and reward (agentrl/gateway/trace.py)
    sample: int = 0
    more_samples: list[Episode] = field(default_factory=list, repr=False)  # its samples after the first

    def extend(self, ids, mask: int, logprobs=None, version: int = -1) -> None:
        """Append `ids` (Python ints: an engine's array is converted once) with their mask, log-probs (0 where
        None) and the weight version that made them."""
        ids = ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        count = len(ids)
        self.tokens += ids
        self.loss_mask += [mask] * count
        if logprobs is None:
            self.logprobs += [0.0] * count
        else:
            self.logprobs += logprobs.tolist() if isinstance(logprobs, np.ndarray) else logprobs
        self.token_versions += [version] * count

    def add_metrics(self, values: dict) -> None:
        for name, value in values.items():
            self.metrics[name] = self.metrics.get(name, 0.0) + float(value)


class RewardError(ValueError):
    """A reward that cannot train: not a real number, or not finite. Its episode fails instead (finish "error")."""


def finite_reward(value, what: str) -> float:
    """`value` as a float reward, or RewardError saying that `what` (where it came from) must be a finite number.

    Refused: bools, strings, None and other non-numbers, NaN, infinities, and numbers beyond float32's range
    (rewards travel as float32). Python and numpy ints and floats are taken.
    """
    if type(value) is float and abs(value) <= LARGEST_REWARD:  # the common case, without the ABC checks below
        return value
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise RewardError(f"{what} must be a finite number, got {_shown(value)} ({type(value).__name__})")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not math.isfinite(number) or abs(number) > LARGEST_REWARD:
        raise RewardError(f"{what} must be a finite number, got {_shown(value)}")
    return number


def _shown(value, limit: int = 80) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        return f"an int of about {int(value.bit_length() * 0.30103)} digits"
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def state_key(value) -> int:
    """A stable int64 key of an env state (an env's `info["state_key"]`, or the observation text)."""
    return _text_key(repr(value))


@functools.lru_cache(maxsize=4096)  # a game's states and a dataset's prompts repeat
def _text_key(text: str) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def pack(episodes: list[Episode], group_offset: int = 0) -> dict[str, np.ndarray]:
    """Concatenate episodes into flat arrays with `offsets` marking their boundaries (no episodes: empty arrays)."""
    lengths = np.array([len(e.tokens) for e in episodes], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    starts = offsets[:-1]
    names = sorted({name for e in episodes for name in e.metrics})
    metrics = {
        METRIC_PREFIX + name: np.array([e.metrics.get(name, 0.0) for e in episodes], dtype=np.float32) for name in names
    }
    spans = [
        (index, start + a, start + b)
        for index, (e, start) in enumerate(zip(episodes, starts, strict=True))
        for a, b in e.turn_spans
    ]
    turns = np.array(spans, dtype=np.int64).reshape(-1, 3)
    return {
        **metrics,
        "turn_episode": turns[:, 0].copy(),
        "turn_start": turns[:, 1].copy(),
        "turn_end": turns[:, 2].copy(),
        "turn_reward": np.array([r for e in episodes for r in e.turn_rewards], dtype=np.float32),
        "turn_state": np.array([k for e in episodes for k in e.turn_states], dtype=np.int64),
        "turn_call": np.array([k for e in episodes for k in _turn_calls(e)], dtype=np.int64),
        "tokens": _flat([e.tokens for e in episodes], np.int64),
        "loss_mask": _flat([e.loss_mask for e in episodes], np.uint8),
        "logprobs": _flat([e.logprobs for e in episodes], np.float32),
        "token_version": _flat([e.token_versions for e in episodes], np.int64),
        "offsets": offsets,
        "group": np.array([e.group + group_offset for e in episodes], dtype=np.int64),
        "reward": np.array([e.reward for e in episodes], dtype=np.float32),
        "success": np.array([e.success for e in episodes], dtype=np.bool_),
        "turns": np.array([e.turns for e in episodes], dtype=np.int32),
        "prompt_len": np.array([e.prompt_len for e in episodes], dtype=np.int32),
        "sample": np.array([e.sample for e in episodes], dtype=np.int32),
        "weight_version": np.array([e.weight_version for e in episodes], dtype=np.int64),
        "finish": np.array([FINISH_REASONS.index(e.finish) for e in episodes], dtype=np.int8),
    }


def _turn_calls(episode: Episode) -> list[int]:
    if not episode.turn_calls:
        return list(range(len(episode.turn_spans)))
    if len(episode.turn_calls) != len(episode.turn_spans):
        raise ValueError(
            f"episode has {len(episode.turn_spans)} turn spans and {len(episode.turn_calls)} turn_calls: "
            "give one call index per turn, or none"
        )
    return list(episode.turn_calls)


def _flat(per_episode: list, dtype) -> np.ndarray:
    count = sum(len(values) for values in per_episode)
    return np.fromiter(itertools.chain.from_iterable(per_episode), dtype, count=count)


def concat(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Join packed batches, shifting offsets and turn indices; a metric one batch lacks is 0 there."""
    names = sorted({key for b in batches for key in b if key.startswith(METRIC_PREFIX)})
    batches = [{**b, **{n: b.get(n, np.zeros(num_episodes(b), np.float32)) for n in names}} for b in batches]
    shifted = ("offsets", "turn_episode", "turn_start", "turn_end")
    out = {key: np.concatenate([b[key] for b in batches]) for key in batches[0] if key not in shifted}
    token_starts = np.cumsum([0] + [b["offsets"][-1] for b in batches[:-1]])
    episode_starts = np.cumsum([0] + [num_episodes(b) for b in batches[:-1]])
    out["offsets"] = np.concatenate([[0]] + [b["offsets"][1:] + s for b, s in zip(batches, token_starts, strict=True)])
    pairs = list(zip(batches, token_starts, episode_starts, strict=True))
    out["turn_episode"] = np.concatenate([b["turn_episode"] + e for b, _, e in pairs])
    out["turn_start"] = np.concatenate([b["turn_start"] + t for b, t, _ in pairs])
    out["turn_end"] = np.concatenate([b["turn_end"] + t for b, t, _ in pairs])
    return out


def num_episodes(batch: dict[str, np.ndarray]) -> int:
    return len(batch["offsets"]) - 1


def trained_tokens(batch: dict[str, np.ndarray]) -> np.ndarray:
    """(episodes,) loss-mask tokens of each episode that enter the loss (its first token has no prediction)."""
    offsets = np.asarray(batch["offsets"], dtype=np.int64)
    running = np.concatenate([[0], np.cumsum(batch["loss_mask"], dtype=np.int64)])
    return running[offsets[1:]] - running[np.minimum(offsets[:-1] + 1, offsets[1:])]


def trained_totals(batch: dict[str, np.ndarray]) -> np.ndarray:
    """(2,) float64: the tokens and the episodes of `batch` that enter the loss, its share of a training step's
    denominators."""
    return token_totals(trained_tokens(batch))


def token_totals(tokens: np.ndarray) -> np.ndarray:
    """(2,) float64: the sum of per-episode trained-token counts, and the episodes with any."""
    return np.array([tokens.sum(), (tokens > 0).sum()], dtype=np.float64)


TOKEN_KEYS = ("tokens", "loss_mask", "logprobs", "token_version")


def select_episodes(batch: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    """The packed batch of the episodes where `keep` (a bool per episode) is true, in their order."""
    keep = np.asarray(keep, dtype=bool)
    offsets = batch["offsets"]
    lengths = np.diff(offsets)
    token_keep = np.repeat(keep, lengths)
    turn_keep = keep[batch["turn_episode"]]
    new_index = np.cumsum(keep) - 1  # an old episode index -> its index among the kept
    token_shift = np.cumsum(np.where(keep, 0, lengths)) - np.where(keep, 0, lengths)  # tokens dropped before it
    out = {}
    for key, values in batch.items():
        if key in TOKEN_KEYS:
            out[key] = values[token_keep]
        elif key in TURN_KEYS:
            out[key] = values[turn_keep]
        elif key != "offsets":
            out[key] = values[keep]
    out["offsets"] = np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64)
    episode_of_turn = batch["turn_episode"][turn_keep]
    out["turn_episode"] = new_index[episode_of_turn]
    out["turn_start"] = batch["turn_start"][turn_keep] - token_shift[episode_of_turn]
    out["turn_end"] = batch["turn_end"][turn_keep] - token_shift[episode_of_turn]
    return out
