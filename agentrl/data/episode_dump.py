"""Episode dumps (`rollout.dump_episodes`): each step's episodes as one JSON object per line, in
`run_dir/episodes/step_NNNNNN.jsonl`, written by the trainer leader from every rollout rank's records.

    {"task_id": "17", "step": 3, "weight_version": 3, "turn_versions": [3, 3], "reward": 1.0, "success": true,
     "finish": "terminated", "turns": 2, "trained": true, "group": 5, "rollout_rank": 1, "data_source": "arith",
     "tools": [...],
     "messages": [{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", "tool_calls": [...]}, ...]}

`weight_version` is the oldest weight version that generated a token of the episode, `turn_versions` the
version of each turn (they differ when new weights reached the episode in flight: rollout.max_staleness).
`trained` is false for a group that dynamic sampling dropped; `rollout_rank` is the index (among rollout
ranks) of the rank that ran the episode; `data_source`, `tools` and `error` appear when there are any.
A step's file is written whole under a temporary name and renamed, and a resumed run deletes the files
of steps at or past its start, so each step is in the folder once.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from agentrl.trajectory import Episode

DUMP_DIR = "episodes"
STEP_FILE = re.compile(r"^step_(\d{6,})\.jsonl$")


def episode_record(episode: Episode, step: int, trained: bool = True, rollout_rank: int | None = None) -> dict:
    record = {
        "task_id": episode.task_id,
        "step": step,
        "weight_version": episode.weight_version,
        "turn_versions": [episode.token_versions[start] for start, end in episode.turn_spans if end > start],
        "reward": episode.reward,
        "success": episode.success,
        "finish": episode.finish,
        "turns": episode.turns,
        "trained": trained,
        "group": episode.group,
    }
    if rollout_rank is not None:
        record["rollout_rank"] = rollout_rank
    if episode.data_source is not None:
        record["data_source"] = episode.data_source
    if episode.tools:
        record["tools"] = episode.tools
    if episode.error:
        record["error"] = episode.error
    record["messages"] = episode.messages
    return record


def dump_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / DUMP_DIR / f"step_{step:06d}.jsonl"


def write_step(run_dir: str | Path, step: int, records: list[dict]) -> Path:
    """One step's records, replacing any earlier file of that step."""
    path = dump_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False, default=_plain) + "\n")
    os.replace(tmp, path)
    return path


def drop_dumps_from(run_dir: str | Path, step: int) -> int:
    """Delete the dumps of steps >= `step` (a resumed run redoes them); the number deleted."""
    folder = Path(run_dir) / DUMP_DIR
    if not folder.is_dir():
        return 0
    doomed = [p for p in folder.iterdir() if (m := STEP_FILE.match(p.name)) and int(m.group(1)) >= step]
    doomed += list(folder.glob("*.jsonl.tmp"))
    for path in doomed:
        path.unlink()
    return len(doomed)


def read_steps(run_dir: str | Path) -> dict[int, list[dict]]:
    """{step: records} of every dump file in run_dir."""
    folder = Path(run_dir) / DUMP_DIR
    found = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if match := STEP_FILE.match(path.name):
            found[int(match.group(1))] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return found


def _plain(value):
    """numpy scalars and other values a dataset row may hold inside messages or tools."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)
