"""`agentrl episodes-to-sft`: dumped RL episodes (`run_dir/episodes/step_NNNNNN[.rankR].jsonl`) -> SFT transcripts.

Keeps the episodes that succeeded (unless `success_only=False`) and reached `min_reward`,
never a failed one (`finish: error`), and writes each as `{"messages", "tools"?}` plus
where it came from (`task_id`, `step`, `reward`, `source`), so rejection-sampling
fine-tuning is `episodes-to-sft` then `agentrl sft`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import UserError
from agentrl.sft.transcripts import TranscriptError, episode_shape

DUMP_FILE = re.compile(r"^step_(\d+)(?:\.rank(\d+))?\.jsonl$")


@dataclass
class FilterReport:
    files: int = 0
    episodes: int = 0
    kept: int = 0
    failed: int = 0  # finish == "error": never kept
    not_successful: int = 0
    below_reward: int = 0

    def text(self, out: Path) -> str:
        skipped = []
        if self.not_successful:
            skipped.append(f"{self.not_successful} not successful")
        if self.below_reward:
            skipped.append(f"{self.below_reward} below --min-reward")
        if self.failed:
            skipped.append(f"{self.failed} failed (finish=error)")
        detail = f" (skipped: {', '.join(skipped)})" if skipped else ""
        return f"kept {self.kept} of {self.episodes} episodes from {self.files} file(s){detail} -> {out}"


def dump_files(folder: Path) -> list[Path]:
    """The dump files of a folder in step order (then rank), or a UserError saying what the folder lacks."""
    if not folder.is_dir():
        raise UserError(
            f"{folder} is not a folder; pass a run's episodes folder (RUN_DIR/episodes, written with "
            "rollout.dump_episodes=true)"
        )
    found = [(m, path) for path in folder.iterdir() if (m := DUMP_FILE.match(path.name))]
    if not found:
        raise UserError(f"{folder} holds no step_NNNNNN.jsonl episode files; was rollout.dump_episodes=true set?")
    found.sort(key=lambda item: (int(item[0].group(1)), int(item[0].group(2) or -1)))
    return [path for _, path in found]


def keep(episode: dict, success_only: bool, min_reward: float | None, report: FilterReport) -> bool:
    if episode.get("finish") == "error":
        report.failed += 1
        return False
    if success_only and not episode.get("success"):
        report.not_successful += 1
        return False
    if min_reward is not None and float(episode.get("reward", 0.0)) < min_reward:
        report.below_reward += 1
        return False
    return True


def episodes_to_sft(
    folder: str | Path, out: str | Path, success_only: bool = True, min_reward: float | None = None
) -> FilterReport:
    folder, out = Path(folder), Path(out)
    report = FilterReport()
    rows = []
    for path in dump_files(folder):
        report.files += 1
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                episode = json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(episode, dict) or "messages" not in episode:
                raise UserError(f'{where}: an episode without "messages"; the dump must hold the conversation')
            report.episodes += 1
            if not keep(episode, success_only, min_reward, report):
                continue
            try:
                episode_shape(episode["messages"])
            except TranscriptError as error:
                raise UserError(f"{where}: {error}") from None
            row = {"messages": episode["messages"]}
            if episode.get("tools"):
                row["tools"] = episode["tools"]
            for key in ("task_id", "step", "reward", "data_source"):
                if key in episode:
                    row[key] = episode[key]
            row["source"] = where
            rows.append(row)
    report.kept = len(rows)
    if not rows:
        raise UserError(
            f"no episode in {folder} passed the filter ({report.text(out).split(' -> ')[0]}); "
            "lower --min-reward or pass --all to keep unsuccessful episodes too"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    tmp.replace(out)
    return report
